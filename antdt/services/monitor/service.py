"""Monitor service shell: ingest step events, publish incidents (JetStream) and JobHealth.

A job's owner (lease-bound key `owners/monitor/{job}`) is the only replica that receives
its steps (intake.py: a subscription per owned job) and feeds its detector, so a job's
state lives in one place and replicas add ingest capacity. Jobs spread over replicas by
placement (runtime/coordination/placement.py). When a replica dies its lease lapses and
another claims
its jobs in its next claim rounds.

A job ends when every rank's agent said it stopped on purpose (RankExit; none exiting to
be restarted; an exit takes the job on as a step does, since it may overtake the first):
the owner publishes the resolutions and a last health with every rank `exited`, then
forgets the job. Events of the old run that arrive after that, within
ENDED_GRACE_S and not past its last step, are dropped instead of starting the job over;
anything else (a restart of the job), or a rank's hello, starts a new detector.

A rank's hello (RankHello: its process started) while the job is watched means the job
or the rank was restarted: its steps count afresh from there (a restart from a checkpoint
steps back), see JobDetector.rank_started."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import structlog
from pydantic import Field

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.jobs import read_end, scan_jobs
from antdt.runtime.coordination.ownership import Ownership, claim_rounds
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.recent import Recent
from antdt.runtime.shared import SharedCalls
from antdt.runtime.store import Compare, Delete, Put, Store
from antdt.runtime.telemetry import metrics
from antdt.runtime.telemetry.tracing import IncidentTraces
from antdt.schemas import (
    INCIDENT_STREAM,
    ErrorCode,
    Incident,
    JobHealth,
    JobSpec,
    Keys,
    RankExit,
    RankHello,
    StepEvent,
    Subjects,
)
from antdt.services.monitor.detector import DetectorConfig, JobDetector
from antdt.services.monitor.incidents import IncidentPublisher
from antdt.services.monitor.inherit import open_incidents
from antdt.services.monitor.intake import JobIntake
from antdt.services.monitor.jobconfig import job_config, read_spec

log = structlog.get_logger("antdt.monitor")
SERVICE = "monitor"
#: How long after a job ended its late step events are dropped (seconds): they were in
#: flight as it ended; a restarted job's first step comes much later.
ENDED_GRACE_S = 10.0
#: Ended jobs remembered for that purpose, at most (the oldest go first).
MAX_ENDED = 4096
#: Jobs whose spec reads a replica paces, at most (the least recent go first): job ids
#: come off the wire, and events of unregistered jobs must not grow memory.
MAX_PACED = 4096
#: How long a replica holds a job it claimed on a rank's hello before the job registers
#: (an agent says hello, then registers), seconds: past that it gives the job up.
REGISTER_WAIT_S = 10.0
#: Jobs held that way, at most (hellos naming jobs nobody registers must not grow it).
MAX_STARTING = 1024
#: How long taking a job on waits to read the incidents its last owner left open, seconds
#: (JetStream away: the job is watched without them rather than not at all).
INHERIT_TIMEOUT_S = 10.0
#: How long a job handed over waits, at most, for its transitions under way to be on
#: ANTDT_INCIDENTS before its key goes, seconds (then it goes anyway, logged).
SETTLE_TIMEOUT_S = 5.0


class MonitorSettings(ServiceSettings):
    """A replica's settings. Window, δ and K are its defaults: a job's spec may override
    them and the other detector tunables (`JobSpec.monitor`)."""

    window: int = Field(default=8, ge=2, description="Steps per detection window (W)")
    slow_threshold: float = Field(default=0.25, gt=0, lt=1, description="δ: slow at ratio >= 1+δ")
    persistent_windows: int = Field(default=3, ge=1, description="K: windows to persistent")
    health_interval_s: float = Field(default=1.0, gt=0, description="JobHealth period, seconds")
    incident_retention_s: float = Field(
        default=7 * 86400, gt=0, description="ANTDT_INCIDENTS max age, seconds"
    )
    max_jobs: int | None = Field(default=None, description="Jobs one replica may own")
    step_backlog_bytes: int = Field(
        default=512 * 1024 * 1024,
        gt=0,
        description="Bytes of step events that may wait to be handled while the replica is "
        "behind, all its jobs together (each job's subscription gets an equal share); "
        "events past it are dropped and counted (code slow_consumer)",
    )
    abandon_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds without a step, exit or hello from any rank of a job after "
        "which it is taken as abandoned (its launcher gave up without the ranks exiting) "
        "and ended: its incidents resolve, its ranks show exited, the services give it "
        "up; registering it again makes it live. 0: never",
    )

    def detector_config(self) -> DetectorConfig:
        return DetectorConfig(
            window=self.window,
            slow_threshold=self.slow_threshold,
            persistent_windows=self.persistent_windows,
        )


class MonitorService:
    def __init__(self, settings: MonitorSettings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self.ownership = Ownership.for_service(store, settings, SERVICE, max_jobs=settings.max_jobs)
        self.detectors: dict[str, JobDetector] = {}
        # Owned jobs without a detector (no event since the claim) -> since when (Unix s).
        self._unwatched: dict[str, float] = {}
        self.ingested = 0
        self.dropped_not_owner = 0
        # Jobs claimed on a hello and not registered yet -> since when (monotonic s).
        self._starting: dict[str, float] = {}
        self.traces = IncidentTraces()
        self.incidents = IncidentPublisher(bus, self.subjects, self.traces)
        # What ranks send (steps, exits, hellos: in the order each rank sent them) comes
        # on a connection of its own: a backlog of step events (a burst past what the
        # replica ingests) must not hold up what comes back on the other, the acks of
        # the incidents it publishes to JetStream.
        self.ranks_bus = Bus(settings.nats, name=f"{bus.name}-ranks", rejections=bus.rejections)
        self.claim_round_s = settings.etcd.lease_ttl_s / 2
        self.intake = JobIntake(
            self.ranks_bus, self.subjects, self.ownership, self._on_step,
            round_s=self.claim_round_s, backlog_bytes=settings.step_backlog_bytes,
        )  # fmt: skip
        metrics.watch_monitor(self)
        self._spec_problems: Recent[str] = Recent(MAX_PACED)  # job -> why it is unreadable
        # job -> its ranks' step subjects, built with its detector: checking an event's
        # subject is then a lookup and a compare, not a string built per event.
        self._step_subjects: dict[str, tuple[str, ...]] = {}
        self._spec_retry_at: Recent[float] = Recent(MAX_PACED)  # job -> when to read it again
        self._ended: Recent[tuple[float, int]] = Recent(MAX_ENDED)  # job -> (when, last step)
        self.dropped_ended = 0  # late step events of jobs that had ended
        # job -> the answer of its take-on under way (_detector): events meanwhile wait for it.
        self._taking_on: SharedCalls[JobDetector | None] = SharedCalls(failed=None)
        # job -> handlers between a detector's transitions and their queueing (a hand-over
        # waits for none to be: _settle).
        self._sending: Counter[str] = Counter()

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

    async def _forget(self, job: str) -> None:
        self.detectors.pop(job, None)
        self._step_subjects.pop(job, None)
        self.intake.unwatch(job)

    async def _claim_round(self) -> None:
        """Claim what placement gives this replica now (takeover after a crash, jobs whose
        hellos came before it ran) and receive the dormant jobs' steps, then hand one job
        over if one is due."""
        scanned = await scan_jobs(self.store, self.keys)
        await self.intake.claim_round(scanned.live(), scanned.dormant)
        await self._hand_over()

    async def _hand_over(self) -> None:
        """Give one job whose preferred replica is another (it started after this one
        claimed the job) back to it (not one being taken on). The new owner carries its
        open incidents on, as after a takeover: so the job is let go of here first, and
        its key goes once every transition made here is on ANTDT_INCIDENTS (`_settle`).
        The steps of about a claim round go unwatched meanwhile."""
        job = self.intake.to_hand_over(lambda job: job not in self._taking_on)
        if job is None:
            return
        log.info("job handed over to its preferred replica", job=job)
        await self.ownership.release(job, settle=lambda: self._settle(job))

    async def _settle(self, job: str) -> None:
        """A job no longer ours: forget it, wait for the handlers still sending its
        transitions, then for the publisher to have stored all of them."""
        await self._forget(job)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self._sending[job] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(self.incidents.flushed(), max(0.0, deadline - time.monotonic()))

    async def _give_up(self, job: str) -> None:
        """Release the job (ended, or not registered): its key and its steps' subscription."""
        self.intake.unwatch(job)
        await self.ownership.release(job)

    async def _detector(self, job: str, step: int | None = None) -> JobDetector | None:
        """The owned job's detector, claiming the job and loading its spec if need be;
        None if another replica owns it, it is not registered, or it ended (unless a
        `step` past its end shows it did not: see _ended_in_store). Events of the job that
        come while it is being taken on (etcd reads) wait for that and share its answer:
        a rank's exit must not be dropped because it overtook the detector's making."""
        detector = self.detectors.get(job)
        if detector is not None and self.ownership.owns(job):
            return detector
        # On an error too the events that waited are dropped, as this one.
        return await self._taking_on.run(job, lambda: self._take_on(job, step))

    async def _take_on(self, job: str, step: int | None) -> JobDetector | None:
        claimed = not self.ownership.owns(job)
        # An exit of a job we do not own, a dormant job's step: claimed at once rather
        # than at the next claim round (at most once a second per job).
        if claimed and not await self.intake.claim_paced(job):
            return None
        if await self._ended_in_store(job, step):
            return None
        spec = await self._job_spec(job)
        if spec is None:
            if claimed:  # not registered (yet): claiming it would hold a slot for nothing
                await self._give_up(job)
            return None
        detector = self._new_detector(job, spec)
        await self._carry_on_incidents(detector)
        self.detectors[job] = detector
        self.intake.wake(job)
        self._step_subjects[job] = tuple(self.subjects.step(job, r) for r in range(spec.world_size))
        return detector

    def _new_detector(self, job: str, spec: JobSpec) -> JobDetector:
        """The job's detector: this replica's defaults overridden by the job's params."""
        config, problem = job_config(self.settings.detector_config(), spec.monitor)
        if problem is not None:
            log.warning("job's monitor params not used; replica defaults", job=job, reason=problem)
        log.info(
            "job taken on",
            job=job,
            world_size=spec.world_size,
            window=config.window,
            slow_threshold=config.slow_threshold,
            persistent_windows=config.persistent_windows,
        )
        return JobDetector(job, spec.world_size, config, epoch=self.ownership.claim_revision(job))

    async def _carry_on_incidents(self, detector: JobDetector) -> None:
        """Adopt the incidents the job's previous owner left open (inherit.py); those it
        cannot carry on are resolved. Unreadable (JetStream away): logged, not adopted."""
        job, now = detector.job, time.time()
        try:
            left_open = await asyncio.wait_for(
                open_incidents(self.bus, self.subjects, job, now), INHERIT_TIMEOUT_S
            )  # the job's first events wait for this: never for long
        except Exception as exc:
            log.warning("incidents left open by the job's previous owner not read",
                        job=job, error=str(exc))  # fmt: skip
            return
        for incident, root in left_open:
            self.traces.adopt(incident.id, root)  # its later transitions join its trace
            superseded = detector.adopt(incident, now)
            if superseded is not None:
                await self._publish_incident(superseded)
        if left_open:
            log.info("incidents carried on", job=job, incidents=[i.id for i, _ in left_open])

    async def _job_spec(self, job: str) -> JobSpec | None:
        """The job's stored spec (a monitor section this replica cannot read is dropped:
        replica defaults, logged). None while there is none or it is unreadable; then it
        is read again at most once a second, and an unreadable one is warned about once."""
        now = time.monotonic()
        if now < (self._spec_retry_at.get(job) or 0.0):
            return None
        got = await self.store.get(self.keys.spec(job))
        spec, problem = read_spec(got.value) if got is not None else (None, None)
        if spec is not None:
            self._spec_retry_at.pop(job)
            if problem is not None:
                log.warning(
                    "job's monitor params not used; replica defaults", job=job, reason=problem
                )
            return spec
        self._spec_retry_at.put(job, now + 1.0)
        if problem is not None and self._spec_problems.get(job) != problem:
            self._spec_problems.put(job, problem)
            log.warning("job spec unreadable; job not monitored", job=job, reason=problem)
        return None

    async def _on_step(self, event: StepEvent, delivery: Delivery) -> None:
        job, rank = event.job, event.rank
        if not self._subject_matches(delivery.subject, job, rank):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        detector = self.detectors.get(job)
        if detector is None or not self.ownership.owns(job):
            claim = self.intake.claiming(job)
            if claim is not None:  # the subscription came first: wait for the claim
                await asyncio.shield(claim)
            if not self.ownership.owns(job) and not self.intake.is_dormant(job):
                # Queued before the job went (lease lapsed, ended, handed over): a step
                # claims only a dormant job, which it wakes.
                self.dropped_not_owner += 1
                return
            if self._late_for_ended_job(job, event.step):
                self.dropped_ended += 1
                return
            detector = await self._detector(job, event.step)
            if detector is None:
                self.dropped_not_owner += 1
                return
        self.ingested += 1
        now = time.time()
        incidents = detector.ingest(event, now)
        if incidents:
            await self._send(detector, incidents, now)

    async def _on_exit(self, exit: RankExit, delivery: Delivery) -> None:
        if delivery.subject != self.subjects.exit(exit.job, exit.rank):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        detector = self.detectors.get(exit.job)
        if detector is None or not self.ownership.owns(exit.job):
            if self._late_for_ended_job(exit.job, exit.step):
                return
            # Taken on here as by a step: the exit may overtake the job's first step (they
            # come on two subscriptions), and a job whose ranks exit before any step
            # ends at once instead of after `abandon_after_s`.
            detector = await self._detector(exit.job, exit.step)
            if detector is None:
                return  # another replica's, not registered, or ended
        now = time.time()
        incidents = detector.rank_exited(exit, now)
        log.info("rank exited", job=exit.job, rank=exit.rank, reason=exit.reason.value)
        health = await self._send(detector, incidents, now)  # the health shows the exit
        if detector.ended:
            log.info("job ended", job=exit.job, step=health.step)
            await self._end(health)

    async def _abandon(self, detector: JobDetector, now: float) -> None:
        """End a job no rank was heard from for `abandon_after_s`: as if its ranks exited."""
        health = await self._send(detector, detector.abandon(now), now)
        log.warning("job abandoned: no rank heard from; ended", job=detector.job,
                    step=health.step, silent_s=self.settings.abandon_after_s)  # fmt: skip
        # It may only have been silent (a long evaluation): its next step revives it.
        await self.intake.keep_dormant(detector.job)
        await self._end(health, abandoned=True)

    async def _end(self, health: JobHealth, *, abandoned: bool = False) -> None:
        self._remember_ended(health.job, health.step)
        await self._forget(health.job)
        # The job's resolutions are out before its end is recorded: whoever sees the end
        # (the controller gives the job up) finds every incident of it closed.
        await self.incidents.flushed()
        await self._record_end(health, abandoned)

    async def _record_end(self, health: JobHealth, abandoned: bool) -> None:
        """Store the ended job's last health (`jobs/{job}/ended`) and give the job up: no
        replica claims it again until it registers again (the controller then deletes
        the key). Without this, every job ever run kept an owner in every service.
        An abandoned job is marked so (`jobs/{job}/abandoned`, in the same transaction):
        every replica keeps receiving its steps (dormant), whichever of them lives on."""
        job, marker = health.job, self.keys.abandoned(health.job)
        try:
            await self.store.txn([], [
                Put(self.keys.ended(job), health.model_dump_json().encode()),
                Put(marker, b"") if abandoned else Delete(marker),
            ])  # fmt: skip
            await self._give_up(job)
        except Exception as exc:  # etcd away: the job stays claimed, which is harmless
            log.warning("job end not recorded", job=health.job, error=str(exc))

    async def _ended_in_store(self, job: str, step: int | None = None) -> bool:
        """Just claimed `job` on a late event: has it ended (another replica owned it)?
        Then give it up again and drop its late events here too. A step past the end's
        step shows the job did not end (it was taken for abandoned while its ranks were
        silent, in a long evaluation say): its end is deleted and it is live again."""
        record = await read_end(self.store, self.keys, job)
        if record is None:
            return False
        # Unreadable: drop every late event for the grace period.
        ended_step = record.step if record.readable else 2**62
        if step is not None and step > ended_step:
            key, mark = self.keys.ended(job), self.keys.abandoned(job)
            revived = [Delete(key), Delete(mark)]  # no longer dormant: every replica lets go
            await self.store.txn([Compare.mod_is(key, record.revision)], revived)
            log.warning("an ended job steps on: live again", job=job, step=step,
                        ended_step=ended_step)  # fmt: skip
            return False
        self._remember_ended(job, ended_step)
        await self._give_up(job)
        return True

    async def _on_hello(self, hello: RankHello, delivery: Delivery) -> None:
        if delivery.subject != self.subjects.hello(hello.job, hello.rank):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        self._ended.pop(hello.job)  # a new run: its steps are not late ones
        detector = self.detectors.get(hello.job)
        if detector is None or not self.ownership.owns(hello.job):
            # A job starting: its preferred replica claims it (and subscribes to its
            # steps) now; its first step makes the detector.
            if not self.ownership.owns(hello.job) and await self.intake.prefers(hello.job):
                await self._claim_started(hello.job)
            return
        now = time.time()
        detector.rank_started(hello, now)
        log.info("rank started", job=hello.job, rank=hello.rank, host=hello.host)
        await self.bus.publish(self.subjects.health(hello.job), detector.health(now))

    async def _claim_started(self, job: str) -> None:
        """Claim a job one of whose ranks started, unless it ended. An agent says hello
        before it registers, so a job without a spec yet is held for REGISTER_WAIT_S
        (`_check_starting`): a hello naming a job nobody registers (a typo, a stray
        process) holds a claim no longer, and at most MAX_STARTING of them."""
        if not await self.intake.claim_paced(job):
            return
        if await read_end(self.store, self.keys, job) is not None:
            await self._give_up(job)
        elif job not in self._starting and await self.store.get(self.keys.spec(job)) is None:
            if len(self._starting) >= MAX_STARTING:
                await self._give_up(job)
            else:
                self._starting[job] = time.monotonic()

    async def _check_starting(self) -> None:
        """Jobs claimed on a hello: registered meanwhile, they stay; not within
        REGISTER_WAIT_S, they are given up."""
        now = time.monotonic()
        for job, since in list(self._starting.items()):
            settled = not self.ownership.owns(job) or job in self.detectors
            if settled or await self.store.get(self.keys.spec(job)) is not None:
                del self._starting[job]
            elif now - since >= REGISTER_WAIT_S:
                del self._starting[job]
                await self._give_up(job)

    def _remember_ended(self, job: str, step: int) -> None:
        self._ended.put(job, (time.monotonic(), step))

    def _late_for_ended_job(self, job: str, step: int) -> bool:
        ended = self._ended.get(job)
        if ended is None:
            return False
        at, last_step = ended
        if step <= last_step and time.monotonic() - at < ENDED_GRACE_S:
            return True
        self._ended.pop(job)  # a new run of the job
        return False

    def _subject_matches(self, subject: str, job: str, rank: int) -> bool:
        """The subject must be exactly {p}.{job}.step.{rank}."""
        known = self._step_subjects.get(job)
        if known is not None and 0 <= rank < len(known):
            return known[rank] == subject
        # A job this replica does not run yet, or a rank outside it (the detector counts).
        return subject == self.subjects.step(job, rank)

    async def _publish_incident(self, incident: Incident) -> None:
        await self.incidents.put(incident)  # published by its own task (incidents.py)

    async def _send(
        self, detector: JobDetector, incidents: list[Incident], now: float
    ) -> JobHealth:
        """The job's health, then its new transitions (queued, in order). Health first:
        whoever reacts to an incident must see the window that opened it (or the exit
        that resolved it), not the last periodic health (up to a period old). Counted
        while under way: awaited from the detector's answer on, with no turn given
        before the count (`_settle`)."""
        job = detector.job
        self._sending[job] += 1
        try:
            health = detector.health(now)
            await self.bus.publish(self.subjects.health(job), health)
            for incident in incidents:
                await self._publish_incident(incident)
            return health
        finally:
            self._sending[job] -= 1
            if not self._sending[job]:
                del self._sending[job]

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            now = time.time()
            for job, detector in list(self.detectors.items()):
                if not self.ownership.owns(job):
                    await self._forget(job)
                    continue
                try:
                    if detector.abandoned(now, self.settings.abandon_after_s):
                        await self._abandon(detector, now)
                        continue
                    await self._send(detector, detector.check_stalls(now), now)
                except Exception as exc:
                    log.warning("health publish failed", job=job, error=str(exc))
            await self._end_unwatched(now)
            try:
                await self._check_starting()
            except Exception as exc:  # etcd away: the next round
                log.warning("starting jobs not checked", error=str(exc))

    async def _end_unwatched(self, now: float) -> None:
        """A job claimed after its ranks went silent has no detector here, so it would be
        held for good: no rank heard from `abandon_after_s` after the claim, it is
        abandoned too (its health: every rank exited, step 0)."""
        after_s = self.settings.abandon_after_s
        owned = [job for job in self.ownership.jobs if job not in self.detectors]
        self._unwatched = {job: self._unwatched.get(job, now) for job in owned}
        for job, since in list(self._unwatched.items()):
            if after_s <= 0 or now - since < after_s:
                continue
            try:
                detector = await self._detector(job)  # None: ended meanwhile, or gone
                if detector is not None and not detector.ended:
                    await self._abandon(detector, now)
            except Exception as exc:  # etcd or NATS away: the next round
                log.warning("abandoned job not ended", job=job, error=str(exc))
