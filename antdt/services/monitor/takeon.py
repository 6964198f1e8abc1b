"""Taking a job on: claimed if need be, its end read (an end makes the event late, a step
past it revives the job), its spec read (again at most once a second while missing), and
its detector made, carrying on the incidents its previous owner left open (leftopen.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from antdt.runtime.bus import Bus
from antdt.runtime.coordination.ended import EndedJobs
from antdt.runtime.coordination.jobs import Ended
from antdt.runtime.coordination.leftopen import open_incidents
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.shared import SharedCalls
from antdt.runtime.store import Compare, Delete, Store
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import Incident, JobSpec, Keys, Subjects
from antdt.services.monitor import lifecycle
from antdt.services.monitor.config import DetectorConfig
from antdt.services.monitor.detector import JobDetector
from antdt.services.monitor.intake import JobIntake
from antdt.services.monitor.jobconfig import job_config, read_spec
from antdt.services.monitor.lifecycle import EndFound, JobBook, JobPhase

log = structlog.get_logger("antdt.monitor")
#: How long taking a job on waits to read the incidents its last owner left open (s):
#: JetStream away, the job is watched without them rather than not at all.
INHERIT_TIMEOUT_S = 10.0


class TakeOn:
    """Takes jobs on for one replica; one take-on per job at a time, its answer shared."""

    def __init__(
        self,
        *,
        defaults: DetectorConfig,
        max_window_rows: int | None,
        bus: Bus,
        store: Store,
        keys: Keys,
        subjects: Subjects,
        traces: IncidentTraces,
        book: JobBook,
        ended: EndedJobs,
        ownership: Ownership,
        intake: JobIntake,
        publish: Callable[[Incident], Awaitable[None]],
        give_up: Callable[[str], Awaitable[None]],
    ) -> None:
        self.defaults, self.bus, self.store, self.keys = defaults, bus, store, keys
        self.max_window_rows = max_window_rows
        self.subjects, self.traces, self.book, self.ended = subjects, traces, book, ended
        self.ownership, self.intake, self.publish, self.give_up = (
            ownership,
            intake,
            publish,
            give_up,
        )
        self._under_way: SharedCalls[JobDetector | None] = SharedCalls(failed=None)

    def under_way(self, job: str) -> bool:
        return job in self._under_way

    async def detector(self, job: str, step: int | None = None) -> JobDetector | None:
        """The owned job's detector, taking the job on if need be: None if another replica
        owns it, or it is unregistered or ended. Events of the job that come meanwhile
        wait for this take-on and share its answer."""
        record = self.book.get(job)
        if record is not None and record.detector is not None and self.ownership.owns(job):
            return record.detector
        return await self._under_way.run(job, lambda: self._take_on(job, step))

    async def _take_on(self, job: str, step: int | None) -> JobDetector | None:
        claimed = not self.ownership.owns(job)
        if claimed and not await self.intake.claim_paced(job):
            return None
        if await self._ended_in_store(job, step):
            return None
        spec = await read_job_spec(self.store, self.keys, self.book, job, time.monotonic())
        if spec is None:
            if claimed:  # not registered (yet): claiming it would hold a slot for nothing
                await self.give_up(job)
            return None
        epoch = self.ownership.claim_revision(job)  # 0: lost while reading (its lease)
        if not epoch:
            return None
        detector = new_detector(self.defaults, spec, epoch, self.max_window_rows)
        now = time.time()
        await carry_on_incidents(self.bus, self.subjects, self.traces, detector, now, self.publish)
        if not self.ownership.owns(job):  # lost while reading its incidents
            return None
        subjects = tuple(self.subjects.step(job, r) for r in range(spec.world_size))
        lifecycle.watched(self.book, job, detector, subjects, time.monotonic())
        self.intake.wake(job)
        return detector

    async def _ended_in_store(self, job: str, step: int | None) -> bool:
        """Has `job`, just claimed on a late event, ended (another replica owned it)? Then
        it is given up again. A step past its end revives it: its end is deleted."""
        end = await self.ended.read(job)
        if end is None:
            return False
        ended_step = end.step if end.readable else None
        found = lifecycle.end_found(self.book, job, ended_step, step, time.monotonic())
        if found is EndFound.ENDED:
            await self.give_up(job)
            return True
        await self._revive(end, step)
        return False

    async def _revive(self, end: Ended, step: int | None) -> None:
        """Delete the job's end and dormant mark (if unchanged): every replica lets go."""
        key, mark = self.keys.ended(end.job), self.keys.abandoned(end.job)
        await self.store.txn([Compare.mod_is(key, end.revision)], [Delete(key), Delete(mark)])
        self.ended.forget(end.job)
        log.warning(
            "an ended job steps on: live again", job=end.job, step=step, ended_step=end.step
        )

    async def claim_started(self, job: str) -> None:
        """Claim a job one of whose ranks started, unless it ended. One with no spec yet
        waits for its registration (`lifecycle.hold_starting`), or is given up."""
        if not await self.intake.claim_paced(job):
            return
        if await self.ended.read(job) is not None:
            await self.give_up(job)
        elif self.book.phase(job) is not JobPhase.STARTING:
            registered = await self.store.get(self.keys.spec(job)) is not None
            if not registered and not lifecycle.hold_starting(self.book, job, time.monotonic()):
                await self.give_up(job)


async def read_job_spec(
    store: Store, keys: Keys, book: JobBook, job: str, now: float
) -> JobSpec | None:
    """The job's stored spec; None while there is none or it is unreadable (or it was
    read less than a second ago). A monitor section this replica cannot read is dropped."""
    if not lifecycle.spec_due(book, job, now):
        return None
    got = await store.get(keys.spec(job))
    spec, problem = read_spec(got.value, got.key) if got is not None else (None, None)
    new_problem = lifecycle.spec_read(book, job, now, found=spec is not None, problem=problem)
    if spec is not None and problem is not None:
        log.warning("job's monitor params not used; replica defaults", job=job, reason=problem)
    if new_problem:
        log.warning("job spec unreadable; job not monitored", job=job, reason=problem)
    return spec


def new_detector(
    defaults: DetectorConfig, spec: JobSpec, epoch: int, max_window_rows: int | None = None
) -> JobDetector:
    """The job's detector: the replica's `defaults` overridden by the job's params
    (`jobconfig.job_config`, `max_window_rows` its bound on the window's steps kept)."""
    config, problem = job_config(
        defaults, spec.monitor, world_size=spec.world_size, max_window_rows=max_window_rows
    )
    if problem is not None:
        log.warning("job's monitor params not used; replica defaults", job=spec.job, reason=problem)
    log.info(
        "job taken on",
        job=spec.job,
        world_size=spec.world_size,
        window=config.window,
        slow_threshold=config.slow_threshold,
        persistent_windows=config.persistent_windows,
    )
    return JobDetector(spec.job, spec.world_size, config, epoch=epoch)


async def carry_on_incidents(
    bus: Bus,
    subjects: Subjects,
    traces: IncidentTraces,
    detector: JobDetector,
    now: float,
    publish: Callable[[Incident], Awaitable[None]],
) -> None:
    """Adopt the incidents the job's previous owner left open; those the detector cannot
    carry on are resolved (published). Unreadable (JetStream away): logged, not adopted."""
    job = detector.job
    try:  # the job's first events wait for this: never for long
        left_open = await asyncio.wait_for(
            open_incidents(bus, subjects, job, now), INHERIT_TIMEOUT_S
        )
    except Exception as exc:
        log.warning(
            "incidents left open by the job's previous owner not read", job=job, error=str(exc)
        )
        return
    for incident, root in left_open:
        traces.adopt(incident.id, root)  # its later transitions join its trace
        superseded = detector.adopt(incident, now)
        if superseded is not None:
            await publish(superseded)
    if left_open:
        log.info("incidents carried on", job=job, incidents=[i.id for i, _ in left_open])
