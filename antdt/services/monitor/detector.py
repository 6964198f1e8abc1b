"""Straggler detection and classification for one job: the monitor's pure core (no I/O,
time passed in as `now`). The shell feeds it steps, exits and hellos, calls
`check_stalls` and `health` about once a second and publishes the transitions returned.
The rules are in docs/architecture.md (the monitor)."""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

from antdt.schemas import (
    Incident,
    JobHealth,
    RankExit,
    RankHello,
    StepEvent,
)
from antdt.services.monitor import processes
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.deviations import advance
from antdt.services.monitor.judge import Judge
from antdt.services.monitor.openincidents import OpenIncidents
from antdt.services.monitor.ranks import JobProgress, RankMemory, job_health, median_step_s
from antdt.services.monitor.stalls import newly_stalled, open_stall, resolve_stall
from antdt.services.monitor.windows import summarize

_MAX_S = 1e7  # the wire contract's largest duration, seconds

#: Every field ingest reads, in this order, read with one C call per event: attribute
#: reads on a pydantic model go through its __getattr__ hook. The last five are a Row.
_Fields = tuple[str, int, str, int, int, int, float, float, int, float, float, float, float]
_FIELD_NAMES = (
    *("job", "rank", "host", "step", "plan_version", "local_batch"),
    *("started_at", "ended_at", "samples", "compute_s", "data_wait_s", "comm_s", "step_s"),
)
_fields_of: Callable[[dict[str, Any]], _Fields] = operator.itemgetter(*_FIELD_NAMES)
_ROW = slice(8, 13)


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
        self._ranks = [RankMemory(rank, warmup_left=warmup) for rank in range(world_size)]
        self._judge = Judge(self.config)
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

    @property
    def open_incidents(self) -> tuple[Incident, ...]:
        return tuple(self._find_open(incident_id) for incident_id in self._open.ids)

    def ingest(self, event: StepEvent, now: float) -> list[Incident]:
        """Account one step event; returns the incident transitions it caused. Runs for
        every event a replica receives: each field is read once and `_tick` inlined."""
        if now > self._clock:
            self._clock = now
        else:
            now = self._clock  # time never runs backwards in here
        fields = _fields_of(vars(event))
        reason = self._rejection(fields)
        if reason is not None:
            self.rejected[reason] += 1
            return []
        rank, step, plan = self._ranks[fields[1]], fields[3], fields[4]
        transitions = []
        if rank.stall is not None:
            first_seen = now if self._first_seen_at is None else self._first_seen_at
            transitions.append(resolve_stall(rank, step, now, first_seen, self._open))
        if rank.exited is not None and step > rank.exit_step:
            rank.exited = None  # back (restarted); a late event of the old process is not
        self._remember(rank, fields, now)
        window = rank.window
        if window and rank.window_plan != plan:
            # Never mix plans in one window: decisions must rest on post-switch figures.
            window.clear()
            self.discarded_windows += 1
        if not window:
            rank.window_plan = plan
        window.append(fields[_ROW])  # type: ignore[arg-type]  # five fields: a Row
        if len(window) >= self._window_steps:
            transitions.extend(self._close_window(rank, step, now))
        return transitions

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
        self._last_heard_at = now
        self._rewind = True  # health keeps the last step until the restarted run's first

    def adopt(self, incident: Incident, now: float) -> Incident | None:
        """Carry on an incident a previous owner left open, under its id: None when
        adopted, or the incident resolved when it cannot be carried on (superseded)."""
        now = self._tick(now)
        if incident.id in self._open or incident.job != self.job:
            return None
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
        return job_health(self._ranks, progress)

    def _tick(self, now: float) -> float:
        self._clock = max(self._clock, now)
        return self._clock

    def _rejection(self, fields: _Fields) -> str | None:
        """Why the event must be ignored, or None. Ignored events change nothing."""
        job, rank, _, step, _, _, started_at, ended_at, samples, c, d, m, s = fields
        if job != self.job:
            return "wrong_job"
        if not 0 <= rank < self.world_size:
            return "rank_out_of_range"
        # The wire schema refuses these already; checked again (cheap: NaN fails every
        # comparison) so that no caller can poison the medians or the clock.
        if not (
            0.0 <= c <= _MAX_S
            and 0.0 <= d <= _MAX_S
            and 0.0 <= m <= _MAX_S
            and 0.0 <= s <= _MAX_S
            and samples >= 0
        ):
            return "bad_duration"
        if not 0.0 <= started_at <= ended_at < math.inf:
            return "bad_time"
        last = self._ranks[rank]
        if step <= last.last_step:
            return "duplicate_step" if step == last.last_step else "step_backwards"
        if ended_at < last.last_ended_at and last.last_step >= 0:
            return "time_backwards"
        return None

    def _remember(self, rank: RankMemory, fields: _Fields, now: float) -> None:
        _, _, host, step, plan, local_batch, _, ended_at = fields[:8]
        rank.host = host
        rank.last_step = step
        rank.last_ended_at = ended_at
        rank.last_seen_at = self._last_heard_at = now
        rank.local_batch = local_batch
        if self._first_seen_at is None:
            self._first_seen_at = now
        if step > self._latest_step:
            self._latest_step = step
        elif self._rewind:
            self._latest_step, self._rewind = step, False
        if plan > self._plan_version:
            self._plan_version = plan

    def _close_window(self, rank: RankMemory, step: int, now: float) -> list[Incident]:
        stats = summarize(rank.window)
        rank.window.clear()
        if stats is None:
            return []  # nothing measurable (no samples): keep the previous window
        if rank.warmup_left > 0:
            # Warm-up (first iterations, prefetch filling up) is judged by nobody and
            # stays out of the other ranks' medians.
            rank.warmup_left -= 1
            return []
        self._judge.update(rank.stats, stats)
        rank.stats = stats
        rank.judgement = self._judge.judge(stats)
        return advance(rank, rank.judgement, step, now, self.config, self._open)

    def _find_open(self, incident_id: str) -> Incident:
        rank = self._ranks[self._open.rank_of(incident_id)]
        for incident in (rank.deviation, rank.stall):
            if incident is not None and incident.id == incident_id:
                return incident
        raise KeyError(incident_id)


__all__ = ["DetectorConfig", "JobDetector"]
