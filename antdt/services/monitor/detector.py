"""Straggler detection and classification for one job: the monitor's pure core (no I/O,
time passed in as `now`). The shell feeds it steps, exits and hellos, calls
`check_stalls` and `health` about once a second and publishes the transitions returned.
The rules are in docs/architecture.md (the monitor), the detection models and why in
docs/detection.md."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import compress
from typing import cast

import numpy as np

from antdt.schemas import (
    Incident,
    JobHealth,
    RankExit,
    RankHello,
    StepEvent,
)
from antdt.services.monitor import processes
from antdt.services.monitor.closes import cleared, cleared_alone, quiet_normal
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.deviations import (
    advance,
    open_slow,
    with_step_times,
)
from antdt.services.monitor.history import Histories
from antdt.services.monitor.hosts import HostIndex, name_hosts
from antdt.services.monitor.judge import Judge, Judgement, Verdict, slow_run
from antdt.services.monitor.latest import ENDED_AT, LOCAL_BATCH, SEEN_AT, STEP, LatestSteps
from antdt.services.monitor.lockstep import account_plain, replanned
from antdt.services.monitor.onepiece import (
    ONE_PIECE_S,
    acceptable_one_piece,
    bad_one_piece,
    in_one_piece,
    judged_in_one_piece,
)
from antdt.services.monitor.openincidents import OpenIncidents
from antdt.services.monitor.openwindows import Ints, OpenWindows
from antdt.services.monitor.pace import Pace
from antdt.services.monitor.ranks import (
    HISTORY_STEPS,
    ColumnsMemo,
    JobFigures,
    JobProgress,
    RankMemory,
    job_figures,
    job_health,
    median_step_s,
)
from antdt.services.monitor.stalls import newly_stalled, open_stall, resolve_stall
from antdt.services.monitor.stepcolumns import (
    HELPED,
    LINK_RTT,
    MAX_S,
    MAX_SAMPLES,
    MAX_STEP,
    ROW_FIELDS,
    StepArrays,
    StepColumns,
    StepFields,
    all_acceptable,
    arrays_of,
    fields_of,
    listed,
    nones_for_nans,
    unequal_columns,
)
from antdt.services.monitor.summaries import Summaries, summarize_many
from antdt.services.monitor.windows import Row, WindowStats, summarized


class JobDetector:
    """Detector for one job: its ranks' windows, incidents, exits and restarts."""

    def __init__(
        self, job: str, world_size: int, config: DetectorConfig | None = None, *, epoch: int = 0
    ) -> None:
        """`epoch`: part of every incident id this detector makes, so that ids of two
        owners of the job never meet (the service passes its claim's etcd revision)."""
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        self.job = job
        self.world_size = world_size
        self.epoch = epoch
        self.config = config or DetectorConfig()
        #: events ignored, by reason (duplicate_step, step_backwards, ...)
        self.rejected: Counter[str] = Counter()
        #: partial windows dropped because the plan changed under them
        self.discarded_windows = 0
        warmup = self.config.warmup_windows
        self._histories = Histories(world_size, HISTORY_STEPS)
        self._windows = OpenWindows(world_size, self.config.window)
        self._latest = LatestSteps(world_size)
        self._latest.warmup_left[:] = warmup
        self._ranks = [
            RankMemory(
                rank,
                history=self._histories.row(rank),
                window=self._windows.row(rank),
                latest=self._latest,
                latest_row=rank,
            )
            for rank in range(world_size)
        ]
        self._stats_changes = 0  # times a rank's latest window (`stats`) changed
        # the health's job figures, and the `_stats_changes` they were made at
        self._figures = (-1, JobFigures(0.0, 0.0, 1.0))
        self._columns = ColumnsMemo()  # the health's columns of windows and models
        self._judge = Judge(self.config, world_size)
        self._window_steps = self.config.window  # read per event: one attribute, not two
        self._clock = 0.0  # latest `now` seen: time never runs backwards in here
        self._first_seen_at: float | None = None
        self._last_heard_at: float | None = None  # latest accepted step, exit or hello
        self._latest_step = 0
        # A rank restarted (hello) since the last step: the job's next step may be lower
        # than `_latest_step` (a restart from a checkpoint) and is the job's step then.
        self._rewind = False
        self._plan_version = 0
        self._open = OpenIncidents(job, epoch)
        self._pace = Pace(self.config, world_size)
        self._closed = 0  # windows closed since the fixed part was last refitted
        self._renewed_step = -1  # the step the job's figures were last renewed at
        self._hosts = HostIndex()

    @property
    def open_incidents(self) -> tuple[Incident, ...]:
        return tuple(self._find_open(incident_id) for incident_id in self._open.ids)

    def ingest(self, event: StepEvent, now: float) -> list[Incident]:
        """Account one step event; returns the incident transitions it caused."""
        return self.ingest_fields(fields_of(vars(event)), now)

    def ingest_fields(self, fields: StepFields, now: float) -> list[Incident]:
        """`ingest` of one event's fields. Runs for every event a replica receives: each
        field is read once, `_tick` inlined, and a normal step of a rank with no evidence
        of being slow costs two comparisons beyond its window's append."""
        if now > self._clock:
            self._clock = now
        else:
            now = self._clock  # time never runs backwards in here
        reason = self._rejection(fields)
        if reason is not None:
            self.rejected[reason] += 1
            return []
        return self._accept(fields, now)

    def ingest_step(self, columns: StepColumns, now: float) -> list[Incident]:
        """`ingest_fields` of every row of `columns` (a step of many ranks), in order, at
        `now`: the same state and transitions, screened in bulk when no row is bad.
        Raises ValueError when a column's length is not the ranks' (the caller's error:
        its rows cannot be told apart)."""
        unequal = unequal_columns(columns)
        if unequal:
            raise ValueError(f"step columns of another length than `rank`: {unequal}")
        now = self._tick(now)
        arrays = arrays_of(columns)
        if arrays is not None and all_acceptable(columns, arrays, self._latest, self.job):
            return self._accept_rows(columns, arrays, now)
        transitions = []
        for fields in columns.rows():
            transitions += self.ingest_fields(fields, now)  # type: ignore[arg-type]
        return transitions

    def _accept_rows(self, columns: StepColumns, arrays: StepArrays, now: float) -> list[Incident]:
        """`_accept` of every row of `columns`, all acceptable, in order. A row of a rank
        with nothing to resolve (no stall, not exited, its window's plan, its host) is
        accounted here from the columns, with no tuple of its fields made: a job's step
        is thousands of them; any other goes through `_accept`. The windows those rows
        fill close together after the rows (summarized at once): every window of a
        step meets the same figures, so only the transitions' order (and ids) differ."""
        ranks, transitions = self._ranks, []
        memories = list(map(ranks.__getitem__, arrays.rank.tolist()))
        moved = None if self._rewind else replanned(columns, arrays, memories)
        if moved is not None:  # a new plan's first step too: replanned, then plain
            plans, batches = arrays.plan_version.tolist(), arrays.local_batch.tolist()
            for i in moved:
                self._replanned(memories[i], plans[i], batches[i])
            return self._accept_plain(columns, arrays, memories, now)
        c = StepColumns(columns.job, *map(listed, columns[1:]))
        if columns.one_piece_s is not None:
            c = c._replace(one_piece_s=nones_for_nans(columns.one_piece_s))
        if columns.link_rtt_s is not None:
            c = c._replace(link_rtt_s=nones_for_nans(columns.link_rtt_s))
        closing: list[tuple[RankMemory, int]] = []
        nones = [None] * len(c.rank)
        links = nones if c.link_rtt_s is None else c.link_rtt_s
        pieces = nones if c.one_piece_s is None else c.one_piece_s
        rows = zip(c.rank, c.host, c.step, c.plan_version, c.local_batch, c.started_at, strict=True)
        figures = zip(c.samples, c.compute_s, c.data_wait_s, c.comm_s, c.step_s, strict=True)
        for (r, host, step, plan, batch, started), ended, (n, c_s, d, m, s), link, piece in zip(
            rows, c.ended_at, figures, links, pieces, strict=True
        ):
            rank = ranks[r]
            if (
                rank.stall is not None
                or rank.exited is not None
                or rank.window_plan != plan
                or host != rank.host
            ):
                fields = (c.job, r, host, step, plan, batch, started, ended, n, c_s, d, m, s, link)
                found = self._accept((*fields, None, piece), now)  # type: ignore[arg-type]
            else:
                if piece is not None and judged_in_one_piece(batch, piece):
                    n, c_s = batch, piece  # as in_one_piece
                self._saw(rank, step, ended, batch, plan, now)
                if link is not None:
                    rank.link_rtt_s = link
                found = self._account(rank, step, (n, c_s, d, m, s), now, closing)
            if found:
                transitions += found
        if closing:
            transitions += self._close_windows(closing, now)
        return transitions

    def _accept_plain(
        self, columns: StepColumns, arrays: StepArrays, memories: list[RankMemory], now: float
    ) -> list[Incident]:
        """`_accept_rows` of a step none of whose ranks has anything to resolve: the
        rows accounted over the columns (lockstep.py), the evidence weighed of the few
        that need it, the full windows closed together."""
        step, pace = int(arrays.step[0]), self._pace
        if step > self._renewed_step:
            self._renew(step)
        done = account_plain(
            (columns, arrays),
            memories,
            (self._histories, self._windows, self._latest),
            now,
            (pace.slow_cost, pace.fixed_samples, self._window_steps),
        )
        self._heard_step(step, int(arrays.plan_version.max()), now)
        transitions = []
        for i in done.weigh:
            transitions += self._weigh(memories[i], step, done.samples[i], done.compute_s[i], now)
        if done.full:
            transitions += self._close_windows([(memories[i], step) for i in done.full], now)
        return transitions

    def _accept(self, fields: StepFields, now: float) -> list[Incident]:
        """An event `_rejection` passed, at `now` (the clock already moved)."""
        if len(fields) > ONE_PIECE_S and fields[ONE_PIECE_S] is not None:
            fields = in_one_piece(fields)  # type: ignore[assignment]
        rank, step, plan = self._ranks[fields[1]], fields[3], fields[4]
        transitions = []
        if rank.stall is not None:
            first_seen = now if self._first_seen_at is None else self._first_seen_at
            transitions.append(resolve_stall(rank, step, now, first_seen, self._open))
        if rank.exited is not None and step > rank.exit_step:
            rank.exited = None  # back (restarted); a late event of the old process is not
        if rank.window_plan != plan:
            self._replanned(rank, plan, fields[5])
        self._remember(rank, fields, now)
        if len(fields) > LINK_RTT and fields[LINK_RTT] is not None:
            rank.link_rtt_s = fields[LINK_RTT]
        if len(fields) > HELPED and fields[HELPED]:
            rank.helped.update(fields[HELPED])  # a Counter: adds
        return transitions + self._account(rank, step, fields[ROW_FIELDS], now)  # type: ignore[arg-type]

    def _account(
        self,
        rank: RankMemory,
        step: int,
        row: Row,
        now: float,
        closing: list[tuple[RankMemory, int]] | None = None,
    ) -> list[Incident]:
        """The step's figures (`row`) into the rank's window, history and evidence; its
        window closed when full (or, given `closing`, put there to close with others).
        The transitions that caused."""
        if step > self._renewed_step:
            self._renew(step)
        window = rank.window
        window.append(row)
        samples, compute_s = row[0], row[1]
        transitions = []
        if samples > 0 and compute_s > 0:
            rank.history.add(samples, compute_s)
            transitions = self._weigh(rank, step, samples, compute_s, now)
        if len(window) >= self._window_steps:
            if closing is None:
                transitions.extend(self._close_window(rank, step, now))
            else:
                closing.append((rank, step))
        return transitions

    def _weigh(
        self, rank: RankMemory, step: int, samples: int, compute_s: float, now: float
    ) -> list[Incident]:
        """A measured step (`samples` in `compute_s`) into the rank's evidence, unless its
        evidence is settling after a batch change; a normal step of a rank with no
        evidence costs two comparisons. The transitions when it turned slow or back."""
        if rank.settle_left:
            rank.settle_left -= 1
            return []
        pace = self._pace
        fixed = pace.fixed_samples
        slow = compute_s >= pace.slow_cost * (samples + fixed)
        before = rank.held_evidence  # `evidence`, read without the property's call
        if not (slow or before[0]):  # a slow step, or evidence (its score) to wear off
            return []
        if slow:
            rank.slow_steps += 1
        cost = compute_s / (samples + fixed)
        after = before.after(cost, pace.reference, pace.open_at, pace.config)
        rank.evidence = after
        if after[1] is not before[1]:  # turned slow, or back
            return self._turned(rank, step, now)
        return []

    def check_stalls(self, now: float) -> list[Incident]:
        """Open STALLED incidents for silent ranks; call about once a second."""
        now = self._tick(now)
        first_seen = self._first_seen_at
        if first_seen is None or self.ended:
            return []
        limit = self.stall_limit_s()
        restarting = limit + self.config.restart_grace_s
        culprits = newly_stalled(self._ranks, now, limit, restarting, first_seen)
        return [open_stall(r, now, limit, first_seen, self._open) for r in culprits]

    @property
    def ended(self) -> bool:
        """Every rank exited and none is to be restarted: the job is over."""
        return processes.all_exited(self._ranks)

    def abandoned(self, now: float, after_s: float) -> bool:
        """No rank heard from (step, exit or hello) for `after_s` seconds and the job not
        ended: its launcher gave up without the ranks saying so. `after_s` 0: never."""
        heard = self._last_heard_at
        return after_s > 0 and heard is not None and not self.ended and now - heard >= after_s

    def abandon(self, now: float) -> list[Incident]:
        """End an abandoned job: every rank not yet exited counts as closed, so the job
        has `ended`, and every incident still open resolves, as when the ranks exit."""
        return processes.abandoned(self._ranks, self._tick(now), self._open)

    def rank_exited(self, exit: RankExit, now: float) -> list[Incident]:
        """A rank's agent says its process stops on purpose; the incident transitions."""
        now = self._tick(now)
        if exit.job != self.job or not 0 <= exit.rank < self.world_size:
            self.rejected["wrong_job" if exit.job != self.job else "rank_out_of_range"] += 1
            return []
        self._last_heard_at = now
        # The job got that far even if the rank's last steps are still on their way (on
        # a subscription of their own): those then arrive late, not as a new run.
        self._latest_step = max(self._latest_step, exit.step)
        return processes.exited(self._ranks, exit, now, self._open)

    def rank_started(self, hello: RankHello, now: float) -> None:
        """A rank's process started (RankHello) while the job was watched: the job or the
        rank was restarted, and its steps count afresh. A hello older than the rank's
        current process, or for another job or world size, is counted and ignored."""
        now = self._tick(now)
        reason = processes.hello_refused(self._ranks, self.job, hello)
        if reason is not None:
            self.rejected[reason] += 1
            return
        processes.started(self._ranks[hello.rank], hello, now, self.config.warmup_windows)
        self._pace.started_afresh(self._ranks[hello.rank])
        self._stats_changes += 1
        self._hosts.moved()
        self._last_heard_at = now
        self._rewind = True  # health keeps the last step until the restarted run's first
        self._renewed_step = -1  # the restarted run's first step renews the figures

    def adopt(self, incident: Incident, now: float) -> Incident | None:
        """Carry on an incident a previous owner left open, under its id: None when
        adopted, or the incident resolved when it cannot be carried on (superseded)."""
        now = self._tick(now)
        if incident.id in self._open or incident.job != self.job:
            return None
        self._hosts.moved()
        return processes.adopt(self._ranks, incident, now, self._open)

    def stall_limit_s(self) -> float:
        """Silence (seconds) after which a rank counts as stalled."""
        step_s = median_step_s(self._ranks)
        return max(self.config.min_stall_s, self.config.stall_factor * step_s)

    def health(self, now: float) -> JobHealth:
        """The job's health now (ranks.job_health says how its figures are made)."""
        progress = JobProgress(
            job=self.job,
            at=self._tick(now),
            step=self._latest_step,
            plan_version=self._plan_version,
            open_incidents=self._open.ids,
        )
        models = self._pace.models(self._ranks)
        memo = (self._columns, self._stats_changes)
        return job_health(self._ranks, progress, models, self._job_figures(), memo)

    def _job_figures(self) -> JobFigures:
        """The job's figures, made again only when some rank's latest window changed
        since: a round of windows closes every W steps, a slow job's health comes up to
        every step."""
        made_of, figures = self._figures
        if made_of != self._stats_changes:
            figures = job_figures(self._ranks)
            self._figures = (self._stats_changes, figures)
        return figures

    def _tick(self, now: float) -> float:
        self._clock = max(self._clock, now)
        return self._clock

    def _rejection(self, fields: StepFields) -> str | None:
        """Why the event must be ignored, or None. Ignored events change nothing."""
        job, rank, _, step, _, _, started_at, ended_at, samples, c, d, m, s = fields[:13]
        if job != self.job:
            return "wrong_job"
        if not 0 <= rank < self.world_size:
            return "rank_out_of_range"
        # The wire schema refuses these already; checked again (cheap: NaN fails every
        # comparison) so that no caller can poison the medians or the clock.
        if not (
            0.0 <= c <= MAX_S
            and 0.0 <= d <= MAX_S
            and 0.0 <= m <= MAX_S
            and 0.0 <= s <= MAX_S
            and samples >= 0
        ):
            return "bad_duration"
        if samples > MAX_SAMPLES or not 0 <= fields[5] <= MAX_SAMPLES:
            return "bad_samples"
        if step > MAX_STEP:
            return "bad_step"
        if not 0.0 <= started_at <= ended_at < math.inf:
            return "bad_time"
        latest = self._latest.views
        last_step = latest[STEP][rank]
        if step <= last_step:
            return "duplicate_step" if step == last_step else "step_backwards"
        if ended_at < latest[ENDED_AT][rank] and last_step >= 0:
            return "time_backwards"
        helped = fields[HELPED] if len(fields) > HELPED else None
        if helped and any(not 0 <= o < self.world_size or o == rank for o in helped):
            return "helped_out_of_range"
        if bad_one_piece(fields, MAX_S):
            return "bad_duration"
        if len(fields) > LINK_RTT and not acceptable_one_piece(fields[LINK_RTT], MAX_S):
            return "bad_link_rtt"  # the same bounds as a one-piece time: None or in range
        return None

    def _remember(self, rank: RankMemory, fields: StepFields, now: float) -> None:
        _, _, host, step, plan, local_batch, _, ended_at = fields[:8]
        if host != rank.host:
            rank.host = host
            self._hosts.moved()
        self._saw(rank, step, ended_at, local_batch, plan, now)

    def _saw(
        self, rank: RankMemory, step: int, ended_at: float, local_batch: int, plan: int, now: float
    ) -> None:
        """A rank's step accepted: the rank's latest step, and the job's latest step, plan
        and when it was heard."""
        latest, r = self._latest.views, rank.rank
        latest[STEP][r] = step
        latest[ENDED_AT][r] = ended_at  # type: ignore[call-overload]  # a float view
        latest[SEEN_AT][r] = now  # type: ignore[call-overload]
        latest[LOCAL_BATCH][r] = local_batch
        if self._rewind and step <= self._latest_step:
            self._latest_step, self._rewind = step, False
        self._heard_step(step, plan, now)

    def _heard_step(self, step: int, plan: int, now: float) -> None:
        """Steps up to `step` under plans up to `plan` accepted at `now` (no restart
        rewinding the job's step)."""
        self._last_heard_at = now
        if self._first_seen_at is None:
            self._first_seen_at = now
        if step > self._latest_step:
            self._latest_step = step
        if plan > self._plan_version:
            self._plan_version = plan

    def _renew(self, step: int) -> None:
        """The first event of `step`: the windows closed before it join the job's figures
        (reference, the other ranks' medians), and once per round of windows (every rank
        closed one, on average) its healthy share and fixed part are renewed. Every
        window and step of `step` is weighed against these, in any order of arrival."""
        self._renewed_step = step
        if self._judge.renew():
            self._pace.renewed(self._judge.reference())
        if self._closed >= self.world_size:
            self._closed = 0
            self._pace.round(self._ranks)

    def _replanned(self, rank: RankMemory, plan: int, local_batch: int) -> None:
        """Never mix plans in one window: decisions must rest on post-switch figures. A
        new batch also restarts the rank's level, and its evidence waits until the job's
        fixed part can be fitted through both batches: line_steps at the new one, and
        up to a window more for the next round of windows to refit it."""
        if rank.window:
            rank.window.clear()
            rank.slow_steps = 0
            self.discarded_windows += 1
        rank.window_plan = plan
        if local_batch != rank.local_batch:
            rank.window.forget_costs()
            rank.settle_left = self.config.speed.line_steps + self.config.window

    def _turned(self, rank: RankMemory, step: int, now: float) -> list[Incident]:
        """The rank's evidence turned it slow at this step: its SLOW incident opens now
        (turned back, it resolves after normal windows). Closed windows of its slow run
        count towards persistence only as far back as they looked slow themselves: in
        a noisy job the evidence can leave 0 well before the rank slows."""
        pace = self._pace
        pace.restart_history(rank)
        if not rank.evidence.slow:
            return []
        run = rank.evidence.run
        closed_in_run = max(0, run - len(rank.window)) // self._window_steps
        judged = slow_run(rank.judgement, pace.run_level(rank), pace.reference, run)
        judged = judged._replace(fixed_samples=pace.fixed_samples)
        windows = min(closed_in_run, rank.slow_looking)
        opened = open_slow(rank, judged, windows, step, now, self.config, self._open)
        return self._named(opened, now, rank)

    def _close_windows(self, closing: list[tuple[RankMemory, int]], now: float) -> list[Incident]:
        """Close the full windows of `closing` (each rank's, at its step), summarized at
        once; the transitions that caused, in `closing`'s order."""
        pace, transitions = self._pace, []
        rows = np.fromiter((rank.rank for rank, _ in closing), dtype=np.int64, count=len(closing))
        summaries = summarize_many(self._windows, rows, pace.fixed_samples, pace.config)
        self._windows.clear(rows)
        closed = self._closed_many(closing, rows, summaries)
        ranks = [rank for rank, _, _, _ in closed]
        stats = [stats for _, _, stats, _ in closed]
        ids = [rank.rank for rank in ranks]
        links = self._latest.links(ids)
        evidence = [rank.evidence for rank in ranks]
        judged = self._judge.judge_many(ids, stats, evidence, pace.fixed_samples, links)
        # every window queued for the job's figures in the order closed, as one by one
        self._judge.queue_many(ids, stats, links)
        normal = Verdict.NORMAL
        quiet = [
            j.verdict is normal and rank.deviation is None
            for rank, j in zip(ranks, judged, strict=True)
        ]
        calm_ranks = list(compress(ranks, quiet))
        calm_stats, calm_judged = list(compress(stats, quiet)), list(compress(judged, quiet))
        quiet_normal(calm_ranks, calm_stats, calm_judged, self.config, self._pace.config.slow_at)
        for (rank, step, window, opening), judgement, calm in zip(
            closed, judged, quiet, strict=True
        ):
            if not calm:
                judged_window = (window, judgement)
                transitions += self._judged_window(rank, step, now, judged_window, opening, False)
        return transitions

    def _closed_many(
        self, closing: list[tuple[RankMemory, int]], rows: Ints, summaries: Summaries
    ) -> list[tuple[RankMemory, int, WindowStats, bool]]:
        """`_closed_window` of each rank of `closing` (its windows' `rows`), at once
        (closes.py); the costs of the windows kept become their ranks' before."""
        ranks = [rank for rank, _ in closing]
        kept = cleared(ranks, summaries.stats, self._latest, rows)
        retained = np.zeros(len(closing), dtype=np.bool_)
        retained[kept.at] = True
        together = summaries.together[retained[summaries.together]]
        self._windows.keep_before(rows[together], summaries.costs[retained[summaries.together]])
        for i, costs in summaries.alone.items():
            if retained[i]:
                ranks[i].window.keep_costs(costs)
        self._stats_changes += len(kept.at)
        self._closed += len(kept.at)
        self._pace.windows_closed(
            [ranks[i] for i in kept.at],
            rows[kept.at],
            kept.stats,
            np.array(kept.slow_steps, dtype=np.int64),
        )
        return [
            (ranks[i], closing[i][1], stats, opening)
            for i, stats, opening in zip(kept.at, kept.stats, kept.opening, strict=True)
        ]

    def _close_window(self, rank: RankMemory, step: int, now: float) -> list[Incident]:
        """Close the rank's full window: summarized, judged, its incident moved on."""
        pace = self._pace
        window = rank.window
        summary = summarized(window.rows(), window.costs_before(), pace.fixed_samples, pace.config)
        transitions = []
        for stats, opening in self._closed_window(rank, summary):
            figures = (rank.rank, stats, rank.evidence, pace.fixed_samples, rank.link_rtt_s)
            judged = self._judge.judge(*figures)
            transitions += self._judged_window(rank, step, now, (stats, judged), opening)
        return transitions

    def _closed_window(
        self, rank: RankMemory, summary: tuple[WindowStats, Sequence[float]] | None
    ) -> tuple[tuple[WindowStats, bool], ...]:
        """The rank's full window, summarized (`windows.summarized`: its stats and costs,
        or None), cleared and counted: its stats and whether the rank had no incident
        open, when it is to be judged (else none)."""
        rank.window.clear()
        kept = cleared_alone(rank, None if summary is None else summary[0])
        if not kept.at:
            return ()
        stats, costs = cast(tuple[WindowStats, Sequence[float]], summary)
        rank.window.keep_costs(costs)
        self._stats_changes += 1
        self._pace.window_closed(rank, stats, kept.slow_steps[0])
        self._closed += 1
        return ((stats, kept.opening[0]),)

    def _judged_window(
        self,
        rank: RankMemory,
        step: int,
        now: float,
        judged: tuple[WindowStats, Judgement],
        opening: bool,
        queue: bool = True,
    ) -> list[Incident]:
        """The rank's window `stats` and its `judgement` queued for the job's figures
        (unless the caller did), its incident moved on: the transitions."""
        stats, judgement = judged
        if queue:
            self._judge.queue(rank.rank, stats, rank.link_rtt_s)
        self._looked(rank, judgement)
        rank.judgement = with_step_times(judgement, stats, rank)
        transitions = advance(rank, rank.judgement, step, now, self.config, self._open)
        if opening and rank.deviation is not None:
            return self._named(transitions, now, rank)
        return transitions

    def _looked(self, rank: RankMemory, judgement: Judgement) -> None:
        """Count the rank's closed windows in a row that looked slow, whatever their
        verdict (`slow_looking`)."""
        looked_slow = (
            judgement.verdict is not Verdict.UNEVALUATED
            and judgement.ratio >= self._pace.config.slow_at
        )
        rank.slow_looking = rank.slow_looking + 1 if looked_slow else 0

    def _named(self, transitions: list[Incident], now: float, opened: RankMemory) -> list[Incident]:
        """`transitions` with the hosts whose ranks slowed together named (`opened`'s
        SLOW incident just opened): an incident updated here replaces its transition."""
        scope = self._hosts.same_host(self._ranks, opened) if opened.host else None
        updated = {i.id: i for i in name_hosts(self._ranks, now, scope)}
        if not updated:
            return transitions
        kept = [updated.pop(i.id, i) for i in transitions]
        return kept + list(updated.values())

    def _find_open(self, incident_id: str) -> Incident:
        rank = self._ranks[self._open.rank_of(incident_id)]
        for incident in (rank.deviation, rank.stall):
            if incident is not None and incident.id == incident_id:
                return incident
        raise KeyError(incident_id)


__all__ = ["DetectorConfig", "JobDetector", "StepColumns", "StepFields"]
