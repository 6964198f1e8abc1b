"""Controller service shell: job registration, plans, and policy decisions for owned jobs.

Registration and plan reads are served by any replica (queue group). Health, incidents and
hellos reach every replica; only the job's owner (`owners/controller/{job}`) asks its
policy and lets the executor act. Takeover: a replica that claims a job rebuilds its
state from etcd (spec, plan, restart ledger) and, on the job's first health, re-sends the
current plan (agents treat a known version as a no-op) and finishes an action the dead
owner left in flight (`Restarter.resume`). Every replica follows the host blocklist
(`blocklist/` in etcd) with a watch (blocklist.py)."""

from __future__ import annotations

import asyncio
import time

import structlog
from pydantic import Field

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.jobs import expired, live_jobs, read_ended, remove_job, scan_jobs
from antdt.runtime.coordination.ownership import Ownership, claim_loop
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.recent import Recent
from antdt.runtime.store import Compare, Delete, Get, Put, Store
from antdt.runtime.telemetry.tracing import DecisionTraces
from antdt.schemas import (
    ACTION_STREAM,
    ActionProposal,
    Incident,
    JobHealth,
    JobSpec,
    Keys,
    Plan,
    PlanRequest,
    RankHello,
    RankState,
    RegisterReply,
    RestartLedger,
    Subjects,
)
from antdt.services.controller.blocklist import Blocklist
from antdt.services.controller.executor import Executor, Timing
from antdt.services.controller.hellos import RankHellos
from antdt.services.controller.policies import Policy, load_policy
from antdt.services.controller.proposals import ProposalDesk
from antdt.services.controller.state import JobState

log = structlog.get_logger("antdt.controller")
SERVICE = "controller"
QUEUE_GROUP = "antdt-controller"
#: Ended jobs remembered (so late events do not load them again), at most.
MAX_ENDED = 4096
#: Seconds between sweeps for ended jobs past their retention, at most.
RETENTION_SWEEP_S = 3600.0


class ControllerSettings(ServiceSettings):
    lead_steps: int = Field(default=3, ge=1, description="Steps between decision and effect")
    restart_lead_steps: int = Field(
        default=5, ge=1, description="Steps between a KILL_RESTART decision and its checkpoint"
    )
    ack_timeout_s: float = Field(default=0.5, gt=0, description="Wait per command attempt, s")
    ack_deadline_s: float = Field(default=5.0, gt=0, description="Give up on acks after, s")
    action_retention_s: float = Field(
        default=30 * 86400, gt=0, description="ANTDT_ACTIONS max age, seconds"
    )
    blocklist_ttl_s: float = Field(
        default=6 * 3600,
        ge=0,
        description="Seconds a host stays on the blocklist after a KILL_RESTART moved a rank "
        "off it; 0: until an operator allows it again (antdt blocklist allow)",
    )
    job_retention_s: float = Field(
        default=7 * 86400,
        ge=0,
        description="Seconds an ended job's keys (spec, plan, ledger and its checkpoints, "
        "restart ledger, rank hellos) stay in etcd after it ended; 0: kept for good "
        "(antdt jobs remove deletes one)",
    )


class ControllerService:
    def __init__(self, settings: ControllerSettings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self.ownership = Ownership.for_service(store, settings, SERVICE)
        timing = Timing(
            lead_steps=settings.lead_steps,
            restart_lead_steps=settings.restart_lead_steps,
            blocklist_ttl_s=settings.blocklist_ttl_s,
            ack_timeout_s=settings.ack_timeout_s,
            ack_deadline_s=settings.ack_deadline_s,
        )
        self.executor = Executor(
            bus, store, self.ownership, subjects=self.subjects, keys=self.keys, timing=timing
        )
        self.jobs: dict[str, JobState] = {}
        self._ended: Recent[None] = Recent(MAX_ENDED)  # jobs whose ranks all exited
        self.hellos = RankHellos(store, self.keys, self.ownership)
        self.policies: dict[str, Policy] = {}
        self.blocklist = Blocklist()  # what is under `blocklist/` (all jobs)
        self.traces = DecisionTraces(effect_steps=settings.telemetry.effect_steps)

    async def start(self, runtime: ServiceRuntime) -> None:
        await self.bus.jetstream.ensure_stream(
            ACTION_STREAM,
            [self.subjects.any_job("action")],
            max_age_s=self.settings.action_retention_s,
        )
        self.ownership.on_lost(self._forget)
        s = self.subjects
        await self.bus.subscribe(
            s.any_job("register"), JobSpec, self._on_register, queue=QUEUE_GROUP
        )
        await self.bus.subscribe(
            s.any_job("plan.get"), PlanRequest, self._on_plan_get, queue=QUEUE_GROUP
        )
        await self.bus.subscribe(s.any_job("health"), JobHealth, self._on_health)
        await self.bus.subscribe(s.any_job("incident"), Incident, self._on_incident)
        await self.bus.subscribe(s.any_job("hello.*"), RankHello, self._on_hello)
        desk = ProposalDesk(self.executor, self.store, self.keys, s, self._state)
        await self.bus.subscribe(s.any_job("proposal"), ActionProposal, desk.handle)
        runtime.spawn("lease", self.ownership.watch_lease())
        runtime.spawn("hellos", self.hellos.write_loop())
        runtime.spawn("blocklist", self.blocklist.follow(self.store, self.keys))
        runtime.spawn("blocklist-sweep", self.blocklist.sweep_expired(self.store, self.keys))
        if self.settings.job_retention_s > 0:
            runtime.spawn("job-retention", self._remove_old_jobs())
        runtime.spawn(
            "claim", claim_loop(self.ownership, self._claimable, self.settings.etcd.lease_ttl_s / 2)
        )
        runtime.on_shutdown("drain", self.bus.drain)
        runtime.on_shutdown("finish", self.hellos.flush)  # while we still own the jobs
        runtime.on_shutdown("revoke", self.ownership.stop)
        log.info("controller started", replica=self.settings.replica_id)

    # -- registration and plans (any replica) -------------------------------------------------

    async def _on_register(self, spec: JobSpec, delivery: Delivery) -> RegisterReply:
        if self.subjects.job_of(delivery.subject) != spec.job:
            raise Rejected("bad_request", "job does not match the subject")
        self._ended.pop(spec.job)  # registering again: the job runs again
        try:
            self._policy(spec.policy)  # an unknown policy is refused before anything is stored
        except ValueError as exc:
            raise Rejected("bad_request", str(exc)) from None
        plan = Plan(
            job=spec.job,
            version=0,
            local_batch=spec.equal_shares(),
            effective_step=0,
            reason="initial plan: equal shares",
            policy=spec.policy,
            created_at=time.time(),
        )
        spec_key, plan_key = self.keys.spec(spec.job), self.keys.plan(spec.job)
        # A job that ended and registers again is live again: its `ended` key goes (and
        # its `abandoned` mark: the monitors stop holding it dormant).
        ended = [Delete(self.keys.ended(spec.job)), Delete(self.keys.abandoned(spec.job))]
        result = await self.store.txn(
            [Compare.absent(spec_key)],
            [
                Put(spec_key, spec.model_dump_json().encode()),
                Put(plan_key, plan.model_dump_json().encode()),
                *ended,
            ],
            [Get(spec_key), Get(plan_key), *ended],
        )
        if result.succeeded:
            log.info("job registered", job=spec.job, policy=spec.policy, world_size=spec.world_size)
            await self._claim(spec.job)
            return RegisterReply(spec=spec, plan=plan, created=True)
        stored_spec, stored_plan = result.gets
        if stored_spec is None or stored_plan is None:
            raise Rejected("unavailable", "job is being registered; retry")
        await self._claim(spec.job)
        return RegisterReply(
            spec=JobSpec.model_validate_json(stored_spec.value),
            plan=Plan.model_validate_json(stored_plan.value),
            created=False,
        )

    async def _on_plan_get(self, req: PlanRequest, delivery: Delivery) -> Plan:
        if self.subjects.job_of(delivery.subject) != req.job:
            raise Rejected("bad_request", "job does not match the subject")
        stored = await self.store.get_model(self.keys.plan(req.job), Plan)
        if stored is None:
            raise Rejected("unknown_job", f"job {req.job!r} is not registered")
        return stored[0]

    # -- ownership -----------------------------------------------------------------------------

    async def _claimable(self) -> list[str]:
        return [j for j in await live_jobs(self.store, self.keys) if j not in self._ended]

    async def _claim(self, job: str) -> None:
        """Registration claims the job, and loads its state with the hellos its ranks
        said before (a rank says hello first, then registers)."""
        if not self.ownership.owns(job):
            await self.ownership.try_acquire(job)
        await self._state(job)

    async def _remove_old_jobs(self) -> None:
        """Run as a task: remove the keys of jobs ended `job_retention_s` ago. Every
        replica sweeps (each removal holds only if the job's `ended` key is unchanged, so
        two replicas never remove twice, and a job registered again is never removed)."""
        retention_s = self.settings.job_retention_s
        interval_s = min(max(retention_s / 4, 0.1), RETENTION_SWEEP_S)
        while True:
            try:
                scanned, now = await scan_jobs(self.store, self.keys), time.time()
                ended = await read_ended(
                    self.store, self.keys, scanned.ended, ledgers_before=now - retention_s
                )
                for record in expired(ended, now, retention_s):
                    await remove_job(self.store, self.keys, record)
            except Exception as exc:  # etcd away: the next sweep
                log.info("job retention sweep failed", error=repr(exc))
            await asyncio.sleep(interval_s)

    async def _give_up(self, job: str) -> None:
        """An ended job needs no owner (its registration makes it claimed again)."""
        try:
            await self.ownership.release(job)
        except Exception as exc:  # etcd away: the job stays claimed, which is harmless
            log.warning("ended job not released", job=job, error=str(exc))

    async def _forget(self, job: str) -> None:
        self.jobs.pop(job, None)

    async def _state(self, job: str) -> JobState | None:
        """The owned job's state, loaded from etcd on first use after a claim (not for a
        job that ended, until one of its ranks says hello again)."""
        if job in self._ended:
            return None
        if not self.ownership.owns(job):
            self.jobs.pop(job, None)
            return None
        state = self.jobs.get(job)
        if state is not None:
            return state
        spec = await self.store.get_model(self.keys.spec(job), JobSpec)
        plan = await self.store.get_model(self.keys.plan(job), Plan)
        if spec is None or plan is None:
            return None
        ledger = await self.store.get_model(self.keys.restarts(job), RestartLedger)
        state = JobState(spec=spec[0], plan=plan[0], plan_revision=plan[1])
        if ledger is not None:
            state.restarts, state.restarts_revision = ledger
        for hello in await self.hellos.load(job):
            state.learn_hello(hello)
        # A takeover (or a restart of this replica): finish what was in flight.
        state.resume_pending = state.plan.version > 0 or state.restarts.pending is not None
        self.jobs.setdefault(job, state)
        return self.jobs[job]

    # -- events (owner only) -----------------------------------------------------------------------

    async def _on_hello(self, hello: RankHello, delivery: Delivery) -> None:
        if delivery.subject != self.subjects.hello(hello.job, hello.rank):
            raise Rejected("bad_request", "job or rank does not match the subject")
        self._ended.pop(hello.job)
        if not self.hellos.remember(hello):
            return
        state = await self._state(hello.job)  # loading it learns (and stores) the hello
        if state is not None and state.started.get(hello.rank) != hello.started_at:
            state.learn_hello(hello)
            self.hellos.save(hello)

    async def _on_health(self, health: JobHealth, delivery: Delivery) -> None:
        if health.job in self._ended and not job_ended(health):
            # The monitor took the job for abandoned and it stepped on: live again (the
            # claim round takes it once its `ended` key is gone).
            self._ended.pop(health.job)
        state = await self._state(health.job)
        if state is None:
            return
        if job_ended(health):
            # Every rank stopped on purpose: nothing left to act on, and the resolutions
            # that follow must not load it again. A rank's hello (the job started over)
            # makes it live again.
            self.jobs.pop(health.job, None)
            self._ended.put(health.job, None)
            log.info("job ended; state dropped", job=health.job)
            await self._give_up(health.job)
            return
        state.health = health
        self.traces.health(health)  # gauges; the effect of the last action
        if state.resume_pending:  # first, so that measuring cannot drop what it finishes
            async with state.busy:
                if state.resume_pending:
                    state.resume_pending = False
                    await self.executor.resume(state, self.blocklist.hosts(time.time()))
        try:
            await self.executor.observe(state, health)
        except Exception as exc:  # measuring must never stop deciding (etcd away: next tick)
            log.warning("restart cost not observed", job=health.job, error=str(exc))
        await self._decide(state, health)

    async def _on_incident(self, incident: Incident, delivery: Delivery) -> None:
        state = await self._state(incident.job)
        if state is None:
            return
        self.traces.incident(incident)  # decisions on it join its trace
        state.learn_incident(incident)
        await self._decide(state, incident)

    async def _decide(self, state: JobState, event: JobHealth | Incident) -> None:
        if state.busy.locked():  # an action is in flight; the next event re-decides
            return
        if state.health is not None and ranks_away(state.health):
            return  # a plan needs every rank's ack: not while some have exited or restart
        async with state.busy:
            policy = self._policy(state.spec.policy)
            view = state.view(time.time(), self.blocklist.hosts(time.time()))
            with self.traces.decide(state.spec.job, state.spec.policy, event) as decision:
                for action in policy.decide(view, event):
                    if not self.ownership.owns(state.spec.job):
                        return
                    with decision.action(action):
                        record = await self.executor.apply(state, action, view)
                        decision.done(record, view.health)

    def _policy(self, name: str) -> Policy:
        if name not in self.policies:
            self.policies[name] = load_policy(name)
        return self.policies[name]


def job_ended(health: JobHealth) -> bool:
    """Every rank's process finished or closed (the monitor's last health of the job)."""
    return all(r.state is RankState.EXITED for r in health.ranks)


def ranks_away(health: JobHealth) -> bool:
    """Some rank's process exited (finished, closed, or to be restarted)."""
    return any(r.state in (RankState.EXITED, RankState.RESTARTING) for r in health.ranks)
