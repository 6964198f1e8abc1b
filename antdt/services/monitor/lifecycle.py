"""A job's life in one monitor replica (pure): one record per job, one decision per event.

The shell reads the facts (is the job ours, what etcd says), asks a decision here and
applies what comes back. Time is passed in: monotonic seconds. Ownership itself (the
lease-bound etcd key) is an input, never kept here."""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Sequence, Set
from dataclasses import dataclass

from antdt.schemas import JobHealth
from antdt.services.monitor.detector import JobDetector

#: Late events of an ended job (not past its last step) are dropped this long (seconds).
ENDED_GRACE_S = 10.0
#: A job claimed on a rank's hello is given up if it does not register within this (s).
REGISTER_WAIT_S = 10.0
#: Jobs held that way, at most: hellos naming jobs nobody registers must not grow it.
MAX_STARTING = 1024
#: Dormant jobs whose steps a replica receives, at most (the longest dormant go first).
MAX_DORMANT = 1024
#: Records of jobs not ours kept, at most, per phase (IDLE, ENDED): job ids come off
#: the wire. The least recently changed go first.
MAX_REMEMBERED = 4096
#: A job is claimed on its events at most once per this (seconds), its spec read too.
CLAIM_PACE_S = 1.0
SPEC_RETRY_S = 1.0
#: A job handed over and claimed back is not handed over again for this (seconds).
HAND_OVER_AGAIN_S = 600.0


class JobPhase(enum.Enum):
    """Where a job stands with this replica; each line a transition (and its decision).

    IDLE, ENDED ──claimed: a claim round, an event (claimed)───────▶ CLAIMED
    CLAIMED ──claimed on a hello, no spec yet (hold_starting)──────▶ STARTING
    STARTING ──spec stored (registered)────────────────────────────▶ CLAIMED
    STARTING ──REGISTER_WAIT_S without a spec (registered)─────────▶ IDLE, given up
    CLAIMED, STARTING, DORMANT ──an event, spec read (watched)─────▶ WATCHED
    CLAIMED ──an event finds its end in etcd (end_found)───────────▶ ENDED, given up
    WATCHED ──every rank exited (ended)────────────────────────────▶ ENDED
    ENDED, DORMANT ──its end not stored (end_unrecorded): ours, the tick stores it
        (RECORD_END) until it is (end_recorded), then given up; lost, it is not stored
    WATCHED ──no rank heard for abandon_after_s (ended)────────────▶ DORMANT
    STARTING, CLAIMED, WATCHED ──lost, handed over, given up───────▶ IDLE (ENDED if ended)
    ENDED ──a hello, a step past its end or after ENDED_GRACE_S────▶ IDLE
    IDLE, ENDED ──marked abandoned in etcd (hold_dormant)──────────▶ DORMANT
    DORMANT ──unmarked, or past MAX_DORMANT────────────────────────▶ IDLE (ENDED if ended)
    """

    IDLE = "idle"  # not ours: only pacing (claim tries, spec reads, hand-overs) is kept
    STARTING = "starting"  # claimed on a rank's hello, waiting for its registration
    CLAIMED = "claimed"  # ours, no event since the claim: no detector yet
    WATCHED = "watched"  # ours, its detector fed with its events
    ENDED = "ended"  # ended: its late events are dropped for ENDED_GRACE_S
    DORMANT = "dormant"  # ended as abandoned: not ours, its steps still received


@dataclass(slots=True)
class JobRecord:
    """Everything this replica keeps about one job (times: monotonic seconds)."""

    job: str
    phase: JobPhase = JobPhase.IDLE
    since: float = 0.0  # entered its phase
    detector: JobDetector | None = None  # WATCHED only
    subjects: tuple[str, ...] = ()  # its ranks' step subjects, made with the detector
    ended_step: int | None = None  # late events up to this step are dropped ...
    ended_at: float = 0.0  # ... for ENDED_GRACE_S from this
    abandoned_at: float | None = None  # ended as abandoned here (DORMANT)
    unwatched_since: float | None = None  # ours without a detector since
    claim_tried_at: float | None = None
    spec_retry_at: float = 0.0
    spec_problem: str | None = None  # why its spec was unreadable (warned once)
    handed_at: float | None = None  # last handed over to its preferred replica
    # its end (last health, abandoned?) that storing failed: ours, it is stored again
    unrecorded_end: tuple[JobHealth, bool] | None = None


class JobBook:
    """The records, by job and by phase (each phase's jobs in the order they entered it).
    IDLE and ENDED records are bounded by `limit` each; the others are kept."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self.records: dict[str, JobRecord] = {}
        self._phases: dict[JobPhase, OrderedDict[str, JobRecord]] = {
            phase: OrderedDict() for phase in JobPhase
        }

    def __len__(self) -> int:
        return len(self.records)

    def get(self, job: str) -> JobRecord | None:
        return self.records.get(job)

    def phase(self, job: str) -> JobPhase:
        record = self.records.get(job)
        return JobPhase.IDLE if record is None else record.phase

    def jobs(self, phase: JobPhase) -> list[str]:
        """The jobs in `phase`, oldest in it first."""
        return list(self._phases[phase])

    def count(self, phase: JobPhase) -> int:
        return len(self._phases[phase])

    def detectors(self) -> dict[str, JobDetector]:
        """The watched jobs' detectors."""
        return {job: r.detector for job, r in self._phases[JobPhase.WATCHED].items() if r.detector}

    def record(self, job: str) -> JobRecord:
        """The job's record, made IDLE if it has none."""
        record = self.records.get(job)
        if record is None:
            record = self.records[job] = JobRecord(job)
            self._phases[JobPhase.IDLE][job] = record
            self._bound(JobPhase.IDLE)
        return record

    def move(self, record: JobRecord, phase: JobPhase, now: float) -> None:
        """`record` enters `phase` at `now` (or is the newest in it again)."""
        self._phases[record.phase].pop(record.job, None)
        record.phase, record.since = phase, now
        self.records[record.job] = self._phases[phase][record.job] = record
        self._bound(phase)

    def touch(self, record: JobRecord) -> None:
        """`record` changed: the last of its phase to be forgotten."""
        self._phases[record.phase].move_to_end(record.job)

    def _bound(self, phase: JobPhase) -> None:
        if phase in (JobPhase.IDLE, JobPhase.ENDED):
            held = self._phases[phase]
            while len(held) > self.limit:
                job, _ = held.popitem(last=False)
                del self.records[job]


# ------------------------------------------------------------------------ events


class Admission(enum.Enum):
    """What to do with a rank's step or exit."""

    INGEST = "ingest"  # watched here: its detector takes it
    TAKE_ON = "take_on"  # claim it if need be, check its end, read its spec, watch it
    NOT_OURS = "not_ours"  # another replica's, or queued before the job went: dropped
    LATE = "late"  # a late event of a job that ended: dropped


def admit(
    book: JobBook, job: str, step: int, now: float, *, owned: bool, claims: bool = False
) -> Admission:
    """A step (or, `claims`, an exit, which takes on any job) of `job` at `step`. A step
    takes on only a job ours or dormant; one not past an end ENDED_GRACE_S old is late."""
    record = book.records.get(job)
    if record is None:
        return Admission.TAKE_ON if owned or claims else Admission.NOT_OURS
    if record.detector is not None and owned:
        return Admission.INGEST
    if not (owned or claims or record.phase is JobPhase.DORMANT):
        return Admission.NOT_OURS
    if record.ended_step is not None:
        if step <= record.ended_step and now - record.ended_at < ENDED_GRACE_S:
            return Admission.LATE
        _runs_again(book, record, now)
    return Admission.TAKE_ON


class Greeting(enum.Enum):
    """What to do with a rank's hello (its process started)."""

    RANK_STARTED = "rank_started"  # watched here: the rank's steps count afresh
    CLAIM = "claim"  # not ours: claim it if this replica is its preferred one
    NOTHING = "nothing"  # ours, not watched yet: its first event makes its detector


def greet(book: JobBook, job: str, now: float, *, owned: bool) -> Greeting:
    """A hello starts a new run: the job's earlier end no longer makes its steps late."""
    record = book.records.get(job)
    if record is not None:
        _runs_again(book, record, now)
        if record.detector is not None and owned:
            return Greeting.RANK_STARTED
    return Greeting.NOTHING if owned else Greeting.CLAIM


def claimed(book: JobBook, job: str, now: float) -> None:
    """The replica now owns `job` (a claim round, an event, a hello); a job whose end is
    still to be stored stays ended."""
    record = book.record(job)
    if record.unrecorded_end is not None:
        return
    if record.phase in (JobPhase.IDLE, JobPhase.ENDED):
        book.move(record, JobPhase.CLAIMED, now)
    if record.detector is None and record.unwatched_since is None:
        record.unwatched_since = now


def hold_starting(book: JobBook, job: str, now: float) -> bool:
    """`job`, claimed on a hello, has no spec yet: wait for it to register. False when
    MAX_STARTING are waiting already (then give it up)."""
    record = book.record(job)
    if record.phase is JobPhase.STARTING:
        return True
    if book.count(JobPhase.STARTING) >= MAX_STARTING:
        return False
    book.move(record, JobPhase.STARTING, now)
    return True


def registered(book: JobBook, job: str, now: float, *, found: bool) -> bool:
    """A starting job's spec read: registered, it stays claimed. True when it waited
    REGISTER_WAIT_S in vain: give it up."""
    record = book.record(job)
    if found:
        book.move(record, JobPhase.CLAIMED, now)
        return False
    if now - record.since >= REGISTER_WAIT_S:
        _rest(book, record, now)
        return True
    return False


def may_claim(book: JobBook, job: str, now: float) -> bool:
    """May an event claim `job` now? At most once per CLAIM_PACE_S, whatever asks."""
    record = book.record(job)
    if record.claim_tried_at is not None and now - record.claim_tried_at < CLAIM_PACE_S:
        return False
    record.claim_tried_at = now
    book.touch(record)
    return True


def spec_due(book: JobBook, job: str, now: float) -> bool:
    """May the job's spec be read now? Not before its retry time (once a second)."""
    record = book.get(job)
    return record is None or now >= record.spec_retry_at


def spec_read(book: JobBook, job: str, now: float, *, found: bool, problem: str | None) -> bool:
    """The spec read: missing or unreadable, read again SPEC_RETRY_S later. True when
    `problem` is new for this job (warn about it once)."""
    record = book.record(job)
    if found:
        record.spec_retry_at = 0.0
        return False
    record.spec_retry_at = now + SPEC_RETRY_S
    new = problem is not None and problem != record.spec_problem
    if new:
        record.spec_problem = problem
    book.touch(record)
    return new


class EndFound(enum.Enum):
    """What a job's end in etcd means for the event that took it on."""

    REVIVE = "revive"  # a step past the end: the job did not end; delete the end
    ENDED = "ended"  # it ended: give it up, drop its late events


def end_found(
    book: JobBook, job: str, ended_step: int | None, step: int | None, now: float
) -> EndFound:
    """`job` has an end in etcd (`ended_step` None: unreadable, so every event is late)."""
    last = 2**62 if ended_step is None else ended_step
    if step is not None and step > last:
        return EndFound.REVIVE
    record = book.record(job)
    record.ended_step, record.ended_at = last, now
    if record.phase is not JobPhase.DORMANT:
        book.move(record, JobPhase.ENDED, now)
    return EndFound.ENDED


def watched(
    book: JobBook, job: str, detector: JobDetector, subjects: tuple[str, ...], now: float
) -> None:
    """`job` taken on: its detector takes its events from now on (dormant no more)."""
    record = book.record(job)
    record.detector, record.subjects = detector, subjects
    record.unwatched_since = record.abandoned_at = None
    book.move(record, JobPhase.WATCHED, now)


def ended(book: JobBook, job: str, step: int, now: float, *, abandoned: bool) -> None:
    """The watched job ended here at `step` (its end is being recorded). Abandoned: it
    is DORMANT, the newest dormant job."""
    record = book.record(job)
    record.detector, record.subjects = None, ()
    record.ended_step, record.ended_at = step, now
    record.unwatched_since = now  # still ours until its end is recorded
    book.move(record, JobPhase.ENDED, now)
    if abandoned:
        dormant(book, job, now)


def end_unrecorded(book: JobBook, job: str, health: JobHealth, abandoned: bool) -> bool:
    """Storing the ended job's end (`health`) failed: it is stored again from the tick
    while the job is ours (never abandoned meanwhile). True the first time (warn)."""
    record = book.record(job)
    first = record.unrecorded_end is None
    record.unrecorded_end = (health, abandoned)
    return first


def end_pending(book: JobBook, job: str) -> bool:
    """The job ended here and its end is still to be stored: it is not handed over (its
    new owner would find no end and take it for live)."""
    record = book.get(job)
    return record is not None and record.unrecorded_end is not None


def end_recorded(book: JobBook, job: str) -> None:
    """The ended job's end is stored: nothing of it is pending here."""
    record = book.get(job)
    if record is not None:
        record.unrecorded_end = None


def dormant(book: JobBook, job: str, now: float) -> None:
    """`job` ended here as abandoned: its steps are still received (the newest dormant)."""
    record = book.record(job)
    record.abandoned_at = now
    book.move(record, JobPhase.DORMANT, now)


def woken(book: JobBook, job: str, now: float) -> None:
    """A dormant `job` is dormant no more (its steps are not wanted unless it is ours)."""
    record = book.get(job)
    if record is not None and record.phase is JobPhase.DORMANT:
        record.abandoned_at = None
        _rest(book, record, now)


def forget(book: JobBook, job: str, now: float) -> None:
    """`job` is not ours any more (lost, handed over, given up): its detector goes."""
    record = book.get(job)
    if record is None:
        return
    record.detector, record.subjects, record.unwatched_since = None, (), None
    if record.phase in (JobPhase.STARTING, JobPhase.CLAIMED, JobPhase.WATCHED):
        _rest(book, record, now)


def too_many_dormant(book: JobBook, now: float) -> list[str]:
    """Past MAX_DORMANT, the longest dormant jobs leave DORMANT: their steps go."""
    gone = book.jobs(JobPhase.DORMANT)[: max(0, book.count(JobPhase.DORMANT) - MAX_DORMANT)]
    for job in gone:
        _rest(book, book.record(job), now)
    return gone


def hold_dormant(book: JobBook, marked: Sequence[str], now: float, round_s: float) -> None:
    """The dormant jobs are those etcd marks (`marked`, most recently abandoned first)
    and those abandoned here within `round_s` (the scan may predate their mark); a job
    watched or starting here stays so."""
    dormant = [book.records[job] for job in book.jobs(JobPhase.DORMANT)]
    here = [r.job for r in dormant if r.abandoned_at is not None and now - r.abandoned_at < round_s]
    newest = [*dict.fromkeys([*here, *marked])][:MAX_DORMANT]
    keep = set(newest)
    for job in book.jobs(JobPhase.DORMANT):
        if job not in keep:
            _rest(book, book.record(job), now)
    for job in reversed(newest):  # the longest dormant first
        record = book.record(job)
        if record.phase not in (JobPhase.WATCHED, JobPhase.STARTING):
            since = record.since if record.phase is JobPhase.DORMANT else now
            book.move(record, JobPhase.DORMANT, since)


def may_hand_over(book: JobBook, job: str, now: float) -> bool:
    """Not handed over within HAND_OVER_AGAIN_S (its preferred replica did not keep it)."""
    handed_at = book.record(job).handed_at
    return handed_at is None or now - handed_at >= HAND_OVER_AGAIN_S


def handed_over(book: JobBook, job: str, now: float) -> None:
    """`job` is being handed over (the shell forgets it once it is released)."""
    book.record(job).handed_at = now


class Chore(enum.Enum):
    """What the periodic tick asks of the shell for one job."""

    FORGET = "forget"  # watched, but no longer ours: drop it
    WATCH = "watch"  # watched: end it if abandoned, else its stalls and health
    ABANDON = "abandon"  # ours, unwatched for abandon_after_s: take it on and end it
    RECORD_END = "record_end"  # ended here, its end not stored yet: store it, give it up
    CHECK_SPEC = "check_spec"  # starting: has it registered? (then `registered`)


def tick(
    book: JobBook, owned: Set[str], now: float, abandon_after_s: float
) -> list[tuple[str, Chore]]:
    """The chores of one tick, watched jobs first, then unwatched, then starting ones.
    An end still to be stored is stored while the job is ours, dropped once it is not
    (its new owner ends it)."""
    chores = [
        (job, Chore.WATCH if job in owned else Chore.FORGET) for job in book.jobs(JobPhase.WATCHED)
    ]
    for job in [*book.jobs(JobPhase.STARTING), *book.jobs(JobPhase.CLAIMED)]:
        if job not in owned:
            _rest(book, book.records[job], now)
    for job in [*book.jobs(JobPhase.ENDED), *book.jobs(JobPhase.DORMANT)]:
        if job not in owned:
            end_recorded(book, job)  # no longer ours to store
    for job in sorted(owned):
        record = book.records.get(job)
        if record is not None and record.unrecorded_end is not None:
            chores.append((job, Chore.RECORD_END))
            continue
        claimed(book, job, now)  # ours without a record (or IDLE): CLAIMED from now
        since = book.records[job].unwatched_since
        if since is not None and abandon_after_s > 0 and now - since >= abandon_after_s:
            chores.append((job, Chore.ABANDON))
    chores += [(job, Chore.CHECK_SPEC) for job in book.jobs(JobPhase.STARTING)]
    return chores


def _runs_again(book: JobBook, record: JobRecord, now: float) -> None:
    """A new run of the job (a hello, a step past its end or after the grace): its
    earlier end, stored or not, is over."""
    record.ended_step, record.unrecorded_end = None, None
    if record.phase is JobPhase.ENDED:
        book.move(record, JobPhase.IDLE, now)


def _rest(book: JobBook, record: JobRecord, now: float) -> None:
    """Not ours, nothing pending: ENDED while its late events may still come, else IDLE."""
    record.unwatched_since = None
    book.move(record, JobPhase.IDLE if record.ended_step is None else JobPhase.ENDED, now)
