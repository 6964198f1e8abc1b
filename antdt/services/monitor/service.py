"""Monitor service shell: ranks' steps, exits and hellos in; incidents (JetStream) and
JobHealth out. Each event asks the job's lifecycle (lifecycle.py) what to do, and the
shell does it: claims, etcd reads and writes, publishing. docs/architecture.md (the
monitor) describes ownership, ends, dormant jobs and hand-overs."""

from __future__ import annotations

import asyncio
import time

import structlog

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.coordination.ended import EndedJobs
from antdt.runtime.coordination.jobs import scan_jobs
from antdt.runtime.coordination.ownership import Ownership, claim_rounds
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Delete, Put, Store
from antdt.runtime.telemetry import metrics
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import (
    INCIDENT_STREAM,
    ErrorCode,
    JobHealth,
    Keys,
    RankColumns,
    RankExit,
    RankHello,
    StepEvent,
    Subjects,
)
from antdt.services.monitor import lifecycle
from antdt.services.monitor.detector import JobDetector
from antdt.services.monitor.incidents import IncidentPublisher, Outbox
from antdt.services.monitor.intake import JobIntake
from antdt.services.monitor.lifecycle import Admission, Chore, Greeting
from antdt.services.monitor.settings import MonitorSettings
from antdt.services.monitor.takeon import TakeOn

__all__ = ["MonitorService", "MonitorSettings"]
log = structlog.get_logger("antdt.monitor")
SERVICE = "monitor"


class MonitorService:
    def __init__(self, settings: MonitorSettings, bus: Bus, store: Store) -> None:
        self.settings, self.bus, self.store = settings, bus, store
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self.ownership = Ownership.for_service(store, settings, SERVICE, max_jobs=settings.max_jobs)
        self.book = lifecycle.JobBook()
        self.ended = EndedJobs(store, self.keys)
        self.ingested = self.dropped_not_owner = self.dropped_ended = 0
        self.traces = IncidentTraces()
        self.incidents = IncidentPublisher(bus, self.subjects, self.traces)
        self.outbox = Outbox(bus, self.subjects, self.incidents)
        # What ranks send comes on a connection of its own: a backlog of steps must not
        # hold up the acks of the incidents published on the other.
        self.ranks_bus = Bus(settings.nats, name=f"{bus.name}-ranks", rejections=bus.rejections)
        self.claim_round_s = settings.etcd.lease_ttl_s / 2
        self.intake = JobIntake(
            self.ranks_bus,
            self.subjects,
            self.ownership,
            self._on_step,
            round_s=self.claim_round_s,
            backlog_bytes=settings.step_backlog_bytes,
            book=self.book,
        )
        self.takeon = TakeOn(
            defaults=settings.detector_config(),
            max_window_rows=settings.max_window_rows,
            bus=bus,
            store=store,
            keys=self.keys,
            subjects=self.subjects,
            traces=self.traces,
            book=self.book,
            ended=self.ended,
            ownership=self.ownership,
            intake=self.intake,
            publish=self.incidents.put,
            give_up=self._give_up,
        )
        metrics.watch_monitor(self)

    @property
    def detectors(self) -> dict[str, JobDetector]:
        """The detectors of the jobs this replica watches."""
        return self.book.detectors()

    async def start(self, runtime: ServiceRuntime) -> None:
        await self.bus.jetstream.ensure_stream(
            INCIDENT_STREAM,
            [self.subjects.any_job("incident")],
            max_age_s=self.settings.incident_retention_s,
        )
        self.ownership.on_lost(self._forget)
        await self.ranks_bus.connect()
        # Steps: a subscription per owned job (intake.py); exits and hellos: every job's.
        await self.ranks_bus.subscribe(self.subjects.any_job("exit.*"), RankExit, self._on_exit)
        await self.ranks_bus.subscribe(self.subjects.any_job("hello.*"), RankHello, self._on_hello)
        runtime.spawn("incidents", self.incidents.run())
        runtime.spawn("lease", self.ownership.watch_lease())
        runtime.spawn("members", self.intake.follow_members())
        runtime.spawn("claim", claim_rounds(self._claim_round, self.claim_round_s))
        runtime.spawn("health", self._health_loop())
        runtime.on_shutdown("drain", self.ranks_bus.drain)
        # The incidents the last events made go out before the connection closes.
        runtime.on_shutdown("drain", lambda: self.bus.drain(before_close=self.incidents.flushed))
        runtime.on_shutdown("revoke", self.ownership.stop)
        log.info("monitor started", replica=self.settings.replica_id)

    # -- events from the ranks -------------------------------------------------------------

    async def _on_step(self, event: StepEvent, delivery: Delivery) -> None:
        job = event.job
        record = self.book.records.get(job)
        if not self._subject_ok(record, event, delivery.subject):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        detector = record.detector if record is not None else None
        if detector is None or not self.ownership.owns(job):  # else: admit's INGEST, inlined
            detector = await self._admitted(job, event.step)
            if detector is None:
                return
        self.ingested += 1
        now = time.time()
        incidents = detector.ingest(event, now)
        if incidents:
            await self.outbox.send(detector, incidents, now)

    async def _on_exit(self, exit: RankExit, delivery: Delivery) -> None:
        if delivery.subject != self.subjects.exit(exit.job, exit.rank):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        # An exit takes its job on as a step does: it may overtake the job's first step,
        # and a job whose ranks exit before any step ends at once.
        detector = await self._admitted(exit.job, exit.step, exit=True)
        if detector is None:
            return
        now = time.time()
        incidents = detector.rank_exited(exit, now)
        log.info("rank exited", job=exit.job, rank=exit.rank, reason=exit.reason.value)
        health = await self.outbox.send(detector, incidents, now)  # the health shows the exit
        if detector.ended:
            log.info("job ended", job=exit.job, step=health.step)
            await self._end(health, abandoned=False)

    async def _on_hello(self, hello: RankHello, delivery: Delivery) -> None:
        job = hello.job
        if delivery.subject != self.subjects.hello(job, hello.rank):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        owned = self.ownership.owns(job)
        greeting = lifecycle.greet(self.book, job, time.monotonic(), owned=owned)
        record = self.book.get(job)
        detector = record.detector if record is not None else None
        if greeting is Greeting.CLAIM and await self.intake.prefers(job):
            await self.takeon.claim_started(job)
        elif greeting is Greeting.RANK_STARTED and detector is not None:
            now = time.time()
            detector.rank_started(hello, now)
            log.info("rank started", job=job, rank=hello.rank, host=hello.host)
            await self.bus.publish(self.subjects.health(job), detector.health(now))

    async def _admitted(self, job: str, step: int, *, exit: bool = False) -> JobDetector | None:
        """The detector to take a step (or an exit) of `job`, or None: dropped (a step's
        drop counted). A step waits for a claim of the job under way first."""
        admission = self._admit(job, step, exit)
        claim = self.intake.claiming(job)
        if admission is not Admission.INGEST and not exit and claim is not None:
            await asyncio.shield(claim)  # the subscription came first: wait for the claim
            admission = self._admit(job, step, exit)
        detector = None
        if admission is Admission.INGEST:
            detector = self.book.records[job].detector
        elif admission is Admission.TAKE_ON:
            detector = await self.takeon.detector(job, step)
        if detector is None and not exit:
            if admission is Admission.LATE:
                self.dropped_ended += 1
            else:
                self.dropped_not_owner += 1
        return detector

    def _admit(self, job: str, step: int, exit: bool) -> Admission:
        owned = self.ownership.owns(job)
        return lifecycle.admit(self.book, job, step, time.monotonic(), owned=owned, claims=exit)

    def _subject_ok(
        self, record: lifecycle.JobRecord | None, event: StepEvent, subject: str
    ) -> bool:
        """The subject must be exactly {p}.{job}.step.{rank}: compared with the watched
        job's subjects, built with its detector, or built now."""
        known = record.subjects if record is not None else ()
        if 0 <= event.rank < len(known):
            return known[event.rank] == subject
        return subject == self.subjects.step(event.job, event.rank)

    # -- ends, hand-overs ------------------------------------------------------------------

    async def _abandon(self, detector: JobDetector, now: float) -> None:
        """End a job no rank was heard from for `abandon_after_s`: as if its ranks exited."""
        health = await self.outbox.send(detector, detector.abandon(now), now)
        log.warning(
            "job abandoned: no rank heard from; ended",
            job=detector.job,
            step=health.step,
            silent_s=self.settings.abandon_after_s,
        )
        await self._end(health, abandoned=True)

    async def _end(self, health: JobHealth, *, abandoned: bool) -> None:
        """Forget the ended job, then record its end once its resolutions are out. An
        abandoned one stays dormant: its next step (it was only silent) revives it."""
        job = health.job
        lifecycle.ended(self.book, job, health.step, time.monotonic(), abandoned=abandoned)
        if abandoned:
            await self.intake.keep_dormant(job)
        else:
            self.intake.unwatch(job)
        await self.incidents.flushed()
        await self._record_end(health, abandoned)

    async def _record_end(self, health: JobHealth, abandoned: bool) -> None:
        """Store the job's last health at `jobs/{job}/ended` (and, abandoned, the mark
        `jobs/{job}/abandoned` that keeps it dormant on every replica), and give it up."""
        job, mark = health.job, self.keys.abandoned(health.job)
        ended = Put(self.keys.ended(job), ended_record(health))
        try:
            await self.store.txn([], [ended, Put(mark, b"") if abandoned else Delete(mark)])
        except Exception as exc:  # etcd away: stored again from the tick while ours
            first = lifecycle.end_unrecorded(self.book, job, health, abandoned)
            (log.warning if first else log.debug)(
                "job end not recorded; tried again", job=job, error=str(exc)
            )
            return
        lifecycle.end_recorded(self.book, job)
        self.ended.note(health)
        try:
            await self._give_up(job)
        except Exception as exc:  # a take-on finds the end and gives it up (abandon_after_s)
            log.warning("job end recorded, not given up yet", job=job, error=str(exc))

    async def _forget(self, job: str) -> None:
        lifecycle.forget(self.book, job, time.monotonic())
        self.intake.unwatch(job)

    async def _give_up(self, job: str) -> None:
        """Release the job (ended, or not registered): its key and its steps' subscription."""
        await self._forget(job)
        await self.ownership.release(job)

    async def _claim_round(self) -> None:
        """Claim what placement gives this replica, receive the dormant jobs' steps, and
        hand one job over to its preferred replica if one is due."""
        scanned = await scan_jobs(self.store, self.keys)
        await self.intake.claim_round(scanned.live(), scanned.dormant)
        job = self.intake.to_hand_over(self._movable)
        if job is not None:
            log.info("job handed over to its preferred replica", job=job)
            await self.ownership.release(job, settle=lambda: self._settle(job))

    def _movable(self, job: str) -> bool:
        """May `job` be handed over now: no take-on under way, no end still to store."""
        return not self.takeon.under_way(job) and not lifecycle.end_pending(self.book, job)

    async def _settle(self, job: str) -> None:
        """A job handed over: forget it, then wait for its transitions under way to be
        stored, so that the new owner carries its open incidents on."""
        await self._forget(job)
        await self.outbox.settled(job)

    # -- every health interval ----------------------------------------------------------------

    async def _health_loop(self) -> None:
        after_s = self.settings.abandon_after_s
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            owned = set(self.ownership.jobs)
            for job, chore in lifecycle.tick(self.book, owned, time.monotonic(), after_s):
                try:
                    await self._do(job, chore)
                except Exception as exc:  # etcd or NATS away: the next tick
                    log.warning("job chore failed", job=job, chore=chore.value, error=str(exc))

    async def _do(self, job: str, chore: Chore) -> None:
        record, now = self.book.records.get(job), time.time()
        detector = record.detector if record is not None else None
        if chore is Chore.FORGET:
            await self._forget(job)
        elif chore is Chore.WATCH and detector is not None:
            if detector.abandoned(now, self.settings.abandon_after_s):
                await self._abandon(detector, now)
            else:
                await self.outbox.send(detector, detector.check_stalls(now), now)
        elif chore is Chore.ABANDON:
            # Claimed after its ranks went silent: taken on now, ended at once.
            detector = await self.takeon.detector(job)  # None: ended meanwhile, or gone
            if detector is not None and not detector.ended:
                await self._abandon(detector, now)
        elif chore is Chore.RECORD_END and record is not None and record.unrecorded_end:
            await self._record_end(*record.unrecorded_end)
        elif chore is Chore.CHECK_SPEC:
            found = await self.store.get(self.keys.spec(job)) is not None
            if lifecycle.registered(self.book, job, time.monotonic(), found=found):
                await self._give_up(job)


#: The most an `ended` record holds, bytes: etcd refuses a request over 1.5 MiB
#: (--max-request-bytes) and the record's readers need the health's time and step only.
ENDED_RECORD_BYTES = 1024 * 1024


def ended_record(health: JobHealth) -> bytes:
    """The job's last health as its `ended` record: with its ranks' figures while it fits
    ENDED_RECORD_BYTES (~6,000 ranks), else without them."""
    record = health.model_dump_json().encode()
    if len(record) <= ENDED_RECORD_BYTES:
        return record
    log.info("ended record without its ranks' figures", job=health.job, bytes=len(record))
    none = RankColumns.of_rows(())
    return health.model_copy(update={"ranks": none}).model_dump_json().encode()
