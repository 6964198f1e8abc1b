"""Straggler detection and classification for one job.

The pure core of the monitor: no I/O, no clock reads (time is always the argument
`now`, control-plane seconds), deterministic. The service shell feeds it StepEvents,
calls `check_stalls` and `health` about once a second, and publishes what comes back.

Per rank, every `window` events close a window whose statistic is the median
per-sample compute time c_i (robust to single slow steps). Its ratio
r_i = c_i / median(c_j, j != i) uses the *other* ranks, so a two-rank job still shows
its slow rank. Thresholds and rules are ours (the papers do not publish theirs):

- slow when r_i >= 1 + delta (compute), or when the rank waits for data far more than
  the others (data), or when its communication share is abnormal while its compute is
  normal and no rank is slow before the barrier (communication);
- leader when r_i <= 1 - delta, and also <= 1 - delta against the median of all ranks,
  with at least three ranks measured (with two ranks a leader and a straggler are the
  same observation; we report the straggler);
- an incident opens after `open_windows` consecutive deviating windows, or at once when
  a rank is slow by much (r >= 1 + instant_threshold; leaders never open in one window):
  a 3x straggler is caught in its first full window, while 10-20% per-step jitter,
  which now and then pushes one or two windows of one rank over 1 + delta, does not
  open one (a mild deviation lasting `open_windows` windows is persistent already);
- it resolves after `resolve_windows` consecutive normal windows (hysteresis); short
  dips back to normal do not reset its window count;
- class: deterministic when it deviated from its first evaluated windows (no normal
  window before); persistent (and ESCALATED) once it deviated for `persistent_windows`
  windows after a normal period; transient when it resolves before that.

Silence: a rank silent for `stall_factor` median step times (at least `min_stall_s`) is
STALLED, unless its agent said it stopped on purpose (RankExit, see `rank_exited`): a
rank that finished is never stalled, one exiting to be restarted only after a further
`restart_grace_s`. Once every rank has exited and none is coming back, the job is over
(`ended`): nothing stalls, and its incidents resolve.

Restarts: a rank whose new process says hello (`rank_started`) counts its steps afresh,
because a job restarted from a checkpoint steps again from there: its next step may be
lower than its last. Until that first step it is coming back, with the same grace as a
rank that exited to be restarted.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from antdt.schemas import (
    ExitReason,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    RankExit,
    RankHello,
    StepEvent,
    StragglerClass,
)
from antdt.services.monitor.judge import Judge, Judgement, Verdict
from antdt.services.monitor.ranks import JobProgress, RankMemory, job_health, median_step_s
from antdt.services.monitor.windows import summarize

_MAX_S = 1e7  # the wire contract's largest duration, seconds

#: Every field ingest reads, in this order, in one C call per event. Reading an attribute
#: of a pydantic model goes through its __getattr__ hook (no interpreter fast path, ~40
#: ns), and the checks and bookkeeping would make some 30 such reads; the model keeps its
#: fields in its __dict__, so one item lookup each is enough. The last five are a Row.
_Fields = tuple[str, int, str, int, int, int, float, float, int, float, float, float, float]
_FIELD_NAMES = (
    "job", "rank", "host", "step", "plan_version", "local_batch", "started_at", "ended_at",
    "samples", "compute_s", "data_wait_s", "comm_s", "step_s",
)  # fmt: skip
_fields_of: Callable[[dict[str, Any]], _Fields] = operator.itemgetter(*_FIELD_NAMES)
_ROW = slice(8, 13)


@dataclass(frozen=True)
class DetectorConfig:
    """Tunables of the detector; defaults suit steps of 10 ms to 10 s."""

    window: int = 8  # W: events per window, per rank (disjoint windows)
    slow_threshold: float = 0.25  # delta: slow when r >= 1+delta, leader when r <= 1-delta
    instant_threshold: float = 0.5  # r >= 1+this opens a slow rank's incident in one window
    open_windows: int = 3  # consecutive deviating windows before a mild incident opens
    resolve_windows: int = 2  # consecutive normal windows before it resolves (hysteresis)
    persistent_windows: int = 3  # K: deviating K+ windows after a normal period: persistent
    stall_factor: float = 5.0  # stalled when silent for stall_factor * median step time ...
    min_stall_s: float = 10.0  # ... and at least this many seconds
    restart_grace_s: float = 120.0  # a rank exiting to be restarted gets this much more
    leaders: bool = True  # open LEADER incidents too
    warmup_windows: int = 0  # first measurable windows of each rank ignored (warm-up)
    data_share_floor: float = 0.3  # a data straggler waits for data >= 30% of its step

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("window must be >= 1")
        if not 0.0 < self.slow_threshold < 1.0:
            raise ValueError("slow_threshold must be in (0, 1)")
        if self.instant_threshold < self.slow_threshold:
            raise ValueError("instant_threshold must be >= slow_threshold")
        if min(self.open_windows, self.resolve_windows, self.persistent_windows) < 1:
            raise ValueError("open_windows, resolve_windows, persistent_windows must be >= 1")
        if self.warmup_windows < 0:
            raise ValueError("warmup_windows must be >= 0")
        if self.stall_factor <= 0 or self.min_stall_s < 0 or self.restart_grace_s < 0:
            raise ValueError("stall_factor must be > 0, min_stall_s and restart_grace_s >= 0")


class JobDetector:
    """Detector for one job; see the module docstring for the rules."""

    def __init__(
        self, job: str, world_size: int, config: DetectorConfig | None = None, *, epoch: int = 0
    ) -> None:
        """`epoch`: part of every incident id this detector makes, so that ids of two
        owners of the job never meet (the service passes its claim's etcd revision)."""
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        self.job = job
        self.world_size = world_size
        self.config = config or DetectorConfig()
        #: events ignored, by reason (duplicate_step, step_backwards, ...)
        self.rejected: Counter[str] = Counter()
        #: partial windows dropped because the plan changed under them
        self.discarded_windows = 0
        self._ranks = [
            RankMemory(rank, warmup_left=self.config.warmup_windows) for rank in range(world_size)
        ]
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
        self._incident_counter = 0
        self._epoch = epoch
        self._open: dict[str, int] = {}  # open incident id -> rank, in opening order

    # ----------------------------------------------------------------- public API

    @property
    def open_incidents(self) -> tuple[Incident, ...]:
        return tuple(self._find_open(incident_id) for incident_id in self._open)

    def ingest(self, event: StepEvent, now: float) -> list[Incident]:
        """Account one step event; returns the incident transitions it caused.

        This runs for every event the monitor receives (tens of thousands a second per
        replica), so it reads each field once and inlines `_tick`."""
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
            transitions.append(self._resolve_stall(rank, step, now))
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
        if self._first_seen_at is None or self.ended:
            return []
        limit = self.stall_limit_s()
        restarting = limit + self.config.restart_grace_s
        watched = [r for r in self._ranks if r.exited is not ExitReason.FINISHED]
        silent = [
            r
            for r in watched
            if now - self._silent_since(r)
            > (restarting if r.exited is ExitReason.RESTART else limit)
        ]
        if not silent:
            return []
        if len(silent) < len(watched):
            # The job moves on without them: each silent rank is stalled on its own.
            culprits = [r for r in silent if r.stall is None]
        else:
            # Under BSP everyone blocks behind a hung rank: blame those furthest behind.
            behind = min(r.last_step for r in silent)
            culprits = [r for r in silent if r.last_step == behind and r.stall is None]
        return [self._open_stall(r, now, limit) for r in culprits]

    @property
    def ended(self) -> bool:
        """Every rank exited and none is to be restarted: the job is over."""
        return all(r.exited not in (None, ExitReason.RESTART) for r in self._ranks)

    def abandoned(self, now: float, after_s: float) -> bool:
        """No rank was heard from (step, exit or hello) for `after_s` seconds, and the job
        has not ended: its launcher gave up (a rank died with no restart left, the
        allocation ended) without the ranks saying so. `after_s` 0: never."""
        heard = self._last_heard_at
        return after_s > 0 and heard is not None and not self.ended and now - heard >= after_s

    def abandon(self, now: float) -> list[Incident]:
        """End an abandoned job: every rank not yet exited counts as closed, so the job
        has `ended`, and every incident still open resolves, as when the ranks exit."""
        now = self._tick(now)
        for rank in self._ranks:
            if rank.exited in (None, ExitReason.RESTART):
                rank.exited, rank.exit_step = ExitReason.CLOSED, rank.last_step
        return [
            self._close_on_exit(rank, incident, now)
            for rank in self._ranks
            for incident in (rank.deviation, rank.stall)
            if incident is not None
        ]

    def rank_exited(self, exit: RankExit, now: float) -> list[Incident]:
        """A rank's agent says its process stops on purpose; the incident transitions.

        Finished: its incidents resolve, and it is never stalled. Closed before the job
        was done: its slow or leader incident resolves (its speed no longer matters), but
        its silence still counts, as the others cannot go on without it. Restart: nothing
        resolves (the restart is the mitigation under way) and it stalls only after a
        further `restart_grace_s`. A later step from the rank means it is back. When the
        job has `ended`, every incident still open resolves."""
        now = self._tick(now)
        if exit.job != self.job or not 0 <= exit.rank < self.world_size:
            self.rejected["wrong_job" if exit.job != self.job else "rank_out_of_range"] += 1
            return []
        self._last_heard_at = now
        rank = self._ranks[exit.rank]
        rank.exited, rank.exit_step = exit.reason, max(exit.step, rank.last_step)
        # The job got that far, even if the rank's last steps are still on their way (they
        # come on a subscription of their own): a job that ends on its exits ends there,
        # and those steps then arrive late for it rather than as a new run.
        self._latest_step = max(self._latest_step, exit.step)
        ending = [rank] if exit.reason is not ExitReason.RESTART else []
        if self.ended:
            ending = self._ranks
        transitions = []
        for r in ending:
            if r.deviation is not None:
                transitions.append(self._close_on_exit(r, r.deviation, now))
            if r.stall is not None and (self.ended or r.exited is ExitReason.FINISHED):
                transitions.append(self._close_on_exit(r, r.stall, now))
        return transitions

    def rank_started(self, hello: RankHello, now: float) -> None:
        """A rank's process started (RankHello) while the job was being watched: the job,
        or this rank, was restarted. Its steps count afresh, from wherever its checkpoint
        puts them; its speed is measured afresh too (it may run on another host, and warms
        up again). Until its first step it is coming back: stalled only after the limit
        plus `restart_grace_s`, as after a RankExit for a restart. Its open incidents
        stay: a restart is how they get mitigated, and the new process's windows (or, for
        a stall, its first step) resolve them. A hello older than the rank's current
        process, or for another job or world, is counted and changes nothing."""
        now = self._tick(now)
        reason = None
        if hello.job != self.job:
            reason = "wrong_job"
        elif not 0 <= hello.rank < self.world_size:
            reason = "rank_out_of_range"
        elif hello.world_size != self.world_size:
            reason = "world_size_mismatch"
        elif hello.started_at < self._ranks[hello.rank].started_at:
            reason = "stale_hello"
        if reason is not None:
            self.rejected[reason] += 1
            return
        rank = self._ranks[hello.rank]
        rank.started_at, rank.host = hello.started_at, hello.host
        rank.last_step, rank.last_ended_at, rank.last_seen_at = -1, 0.0, now
        self._last_heard_at = now
        rank.window.clear()
        rank.warmup_left = self.config.warmup_windows
        rank.stats = rank.judgement = None
        rank.streak, rank.streak_kind = 0, None
        rank.exited, rank.exit_step = ExitReason.RESTART, -1  # back at its first step
        self._rewind = True  # health keeps the last step until the restarted run's first

    def _close_on_exit(self, rank: RankMemory, incident: Incident, now: float) -> Incident:
        del self._open[incident.id]
        if incident is rank.stall:
            rank.stall = None
        else:
            rank.deviation = None
            rank.deviation_windows = rank.normal_streak = 0
            rank.deterministic = False
        return incident.model_copy(
            update={
                "state": IncidentState.RESOLVED,
                "updated_at": now,
                "evidence": {**incident.evidence, "exited": 1.0},
            }
        )

    def adopt(self, incident: Incident, now: float) -> Incident | None:
        """Carry on an incident a previous owner of the job opened and never resolved (it
        died, or lost its lease): it stays open under its id, and this detector moves it
        on as one of its own (escalates, resolves it after normal windows, or, a stall,
        on the rank's next step). Returns None when adopted; the incident resolved when
        it cannot be carried on: its rank is out of this job's range, or the rank has an
        incident of that kind open already (superseded)."""
        now = self._tick(now)
        if incident.id in self._open or incident.job != self.job:
            return None
        stall = incident.kind is IncidentKind.STALLED
        rank = self._ranks[incident.rank] if 0 <= incident.rank < self.world_size else None
        if rank is None or (rank.stall if stall else rank.deviation) is not None:
            return incident.model_copy(update={
                "state": IncidentState.RESOLVED, "updated_at": now,
                "evidence": {**incident.evidence, "superseded": 1.0},
            })  # fmt: skip
        rank.host = rank.host or incident.host
        self._open[incident.id] = rank.rank
        if stall:  # silent since before the incident opened, as its evidence says
            rank.stall = incident
            if rank.last_seen_at is None:
                rank.last_seen_at = incident.opened_at - incident.evidence.get("silent_s", 0.0)
            return None
        rank.deviation = incident
        rank.deviation_windows = rank.streak = incident.windows
        rank.streak_kind = incident.kind
        rank.deterministic = incident.straggler_class is StragglerClass.DETERMINISTIC
        rank.had_normal = not rank.deterministic
        return None

    def stall_limit_s(self) -> float:
        """Silence (seconds) after which a rank counts as stalled."""
        step_s = median_step_s(self._ranks)
        return max(self.config.min_stall_s, self.config.stall_factor * step_s)

    def mark_mitigating(self, incident_id: str, now: float) -> Incident | None:
        """The controller acts on the incident; None when it is unknown or resolved."""
        now = self._tick(now)
        if incident_id not in self._open:
            return None
        rank = self._ranks[self._open[incident_id]]
        current = self._find_open(incident_id)
        if current.state == IncidentState.MITIGATING:
            return current
        updated = current.model_copy(update={"state": IncidentState.MITIGATING, "updated_at": now})
        if rank.stall is not None and rank.stall.id == incident_id:
            rank.stall = updated
        else:
            rank.deviation = updated
        return updated

    def health(self, now: float) -> JobHealth:
        """The job's health now (ranks.job_health says how its figures are made)."""
        progress = JobProgress(
            job=self.job, at=self._tick(now), step=self._latest_step,
            plan_version=self._plan_version, open_incidents=tuple(self._open),
        )  # fmt: skip
        return job_health(self._ranks, progress)

    # ------------------------------------------------------------------ ingestion

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
        # The wire schema already refuses these; the core checks again (cheap: NaN fails
        # every comparison) so that no caller can poison its medians or clock.
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
            # Warm-up (first iterations, data prefetch filling up) is judged by nobody and
            # stays out of the other ranks' medians.
            rank.warmup_left -= 1
            return []
        self._judge.update(rank.stats, stats)
        rank.stats = stats
        rank.judgement = self._judge.judge(stats)
        return self._advance(rank, rank.judgement, step, now)

    # ------------------------------------------------------------ state machine

    def _advance(
        self, rank: RankMemory, judged: Judgement, step: int, now: float
    ) -> list[Incident]:
        """Move the rank's incident state machine by one closed window."""
        if judged.verdict is Verdict.UNEVALUATED:
            return []
        if judged.verdict is Verdict.NORMAL:
            return self._normal_window(rank, judged, step, now)
        kind = IncidentKind.SLOW if judged.verdict is Verdict.SLOW else IncidentKind.LEADER
        transitions = []
        if rank.deviation is not None and rank.deviation.kind != kind:
            transitions.append(self._resolve_deviation(rank, judged, step, now))
        if rank.streak_kind != kind:
            rank.streak_kind, rank.streak = kind, 0
        rank.streak += 1
        rank.normal_streak = 0
        if rank.deviation is None:
            if rank.streak < self.config.open_windows and not judged.strong:
                return transitions
            transitions.append(self._open_deviation(rank, kind, judged, step, now))
        else:
            rank.deviation_windows += 1
        escalation = self._maybe_escalate(rank, judged, step, now)
        return transitions + ([escalation] if escalation else [])

    def _normal_window(
        self, rank: RankMemory, judged: Judgement, step: int, now: float
    ) -> list[Incident]:
        rank.had_normal = True
        rank.streak_kind, rank.streak = None, 0
        if rank.deviation is None:
            return []
        rank.normal_streak += 1
        if rank.normal_streak < self.config.resolve_windows:
            return []
        return [self._resolve_deviation(rank, judged, step, now)]

    def _open_deviation(
        self, rank: RankMemory, kind: IncidentKind, judged: Judgement, step: int, now: float
    ) -> Incident:
        # A rank that deviated before any of its windows looked normal is built that way
        # (hardware), not suffering contention: the streak started with no normal window.
        rank.deterministic = not rank.had_normal
        rank.deviation_windows = rank.streak
        incident = Incident(
            id=self._new_id(rank.rank, kind),
            job=self.job,
            rank=rank.rank,
            host=rank.host,
            kind=kind,
            straggler_class=(
                StragglerClass.DETERMINISTIC if rank.deterministic else StragglerClass.UNKNOWN
            ),
            cause=judged.cause,
            state=IncidentState.OPENED,
            step=step,
            opened_at=now,
            updated_at=now,
            ratio=judged.ratio,
            windows=rank.deviation_windows,
            evidence=judged.evidence(rank.deviation_windows),
        )
        rank.deviation = incident
        self._open[incident.id] = rank.rank
        return incident

    def _maybe_escalate(
        self, rank: RankMemory, judged: Judgement, step: int, now: float
    ) -> Incident | None:
        incident = rank.deviation
        if (
            incident is None
            or rank.deterministic
            or incident.straggler_class is StragglerClass.PERSISTENT
            or rank.deviation_windows < self.config.persistent_windows
        ):
            return None
        # Escalation is the signal for heavier action (KILL_RESTART), so it is emitted
        # even while a lighter mitigation is under way.
        rank.deviation = self._updated(
            incident, judged, rank, step, now, IncidentState.ESCALATED
        ).model_copy(update={"straggler_class": StragglerClass.PERSISTENT})
        return rank.deviation

    def _resolve_deviation(
        self, rank: RankMemory, judged: Judgement, step: int, now: float
    ) -> Incident:
        incident = rank.deviation
        assert incident is not None
        if rank.deterministic:
            klass = StragglerClass.DETERMINISTIC
        elif rank.deviation_windows >= self.config.persistent_windows:
            klass = StragglerClass.PERSISTENT
        else:
            klass = StragglerClass.TRANSIENT
        resolved = self._updated(incident, judged, rank, step, now, IncidentState.RESOLVED)
        resolved = resolved.model_copy(update={"straggler_class": klass})
        del self._open[incident.id]
        rank.deviation = None
        rank.deviation_windows = rank.normal_streak = 0
        rank.deterministic = False
        return resolved

    def _updated(
        self,
        incident: Incident,
        judged: Judgement,
        rank: RankMemory,
        step: int,
        now: float,
        state: IncidentState,
    ) -> Incident:
        return incident.model_copy(
            update={
                "state": state,
                "step": step,
                "updated_at": now,
                "ratio": judged.ratio,
                "windows": rank.deviation_windows,
                "evidence": judged.evidence(rank.deviation_windows),
            }
        )

    # --------------------------------------------------------------------- stalls

    def _silent_since(self, rank: RankMemory) -> float:
        # A rank never heard from is silent since the job's first event anywhere.
        if rank.last_seen_at is not None:
            return rank.last_seen_at
        assert self._first_seen_at is not None
        return self._first_seen_at

    def _open_stall(self, rank: RankMemory, now: float, limit: float) -> Incident:
        silent_s = now - self._silent_since(rank)
        incident = Incident(
            id=self._new_id(rank.rank, IncidentKind.STALLED),
            job=self.job,
            rank=rank.rank,
            host=rank.host,
            kind=IncidentKind.STALLED,
            state=IncidentState.OPENED,
            step=max(rank.last_step, 0),
            opened_at=now,
            updated_at=now,
            ratio=rank.judgement.ratio if rank.judgement else 1.0,
            windows=0,
            evidence={"silent_s": silent_s, "limit_s": limit, "last_step": rank.last_step},
        )
        rank.stall = incident
        self._open[incident.id] = rank.rank
        return incident

    def _resolve_stall(self, rank: RankMemory, step: int, now: float) -> Incident:
        incident = rank.stall
        assert incident is not None
        evidence = {**incident.evidence, "silent_s": now - self._silent_since(rank)}
        del self._open[incident.id]
        rank.stall = None
        return incident.model_copy(
            update={
                "state": IncidentState.RESOLVED,
                "step": step,
                "updated_at": now,
                "evidence": evidence,
            }
        )

    # -------------------------------------------------------------------- helpers

    def _new_id(self, rank: int, kind: IncidentKind) -> str:
        self._incident_counter += 1
        # Job ids may be 128 characters, incident ids too: keep room for the suffix.
        return f"{self.job[:80]}-r{rank}-{kind.value}-e{self._epoch}-{self._incident_counter}"

    def _find_open(self, incident_id: str) -> Incident:
        rank = self._ranks[self._open[incident_id]]
        for incident in (rank.deviation, rank.stall):
            if incident is not None and incident.id == incident_id:
                return incident
        raise KeyError(incident_id)


__all__ = ["DetectorConfig", "JobDetector"]
