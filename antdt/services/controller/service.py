"""The controller's service shell: job registration, plan and spec reads (any replica,
queue group), proposals (the owner; any replica for a job with no owner), and for the
jobs this replica owns, their events turned into decisions that the executor carries
out. Decisions are the policies' and the pure modules'; side effects are the executor's."""

from __future__ import annotations

import time

import structlog
from pydantic import Field

from antdt.runtime.bus import Bus, Delivery, Rejected
from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.ended import shows_end
from antdt.runtime.coordination.jobs import live_jobs
from antdt.runtime.coordination.leftopen import open_incidents
from antdt.runtime.coordination.ownership import Ownership, claim_rounds
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.runtime.telemetry import metrics
from antdt.runtime.telemetry.tracing import DecisionTraces
from antdt.schemas import (
    ACTION_STREAM,
    ActionProposal,
    ErrorCode,
    Incident,
    JobHealth,
    JobSpec,
    Keys,
    NodeHeartbeat,
    NodeJoin,
    PlanRequest,
    RankHello,
    RegisterReply,
    SpecRequest,
    Subjects,
)
from antdt.services.controller.blocklist import Blocklist
from antdt.services.controller.counts import JobCounts
from antdt.services.controller.decisionbudget import DecisionBudget
from antdt.services.controller.executor import Executor, Timing
from antdt.services.controller.hellos import RankHellos
from antdt.services.controller.jobs import OwnedJobs, register, remove_old_jobs
from antdt.services.controller.nodedesk import NodeDesk
from antdt.services.controller.nodes import NODE_TTL_S
from antdt.services.controller.policies import Policy, load_policy
from antdt.services.controller.proposals import ProposalDesk
from antdt.services.controller.reads import Reads
from antdt.services.controller.sender import BROADCAST_FROM
from antdt.services.controller.state import JobState

log = structlog.get_logger("antdt.controller")
SERVICE = "controller"
QUEUE_GROUP = "antdt-controller"  # the contract's CONTROLLER_QUEUE (schemas.channels)


class ControllerSettings(ServiceSettings):
    lead_steps: int = Field(
        default=4,
        ge=1,
        description="Steps between an ADJUST_BS decision and its plan's effective step: "
        "every rank must hold the plan by the count of the step before it",
    )
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
    node_ttl_s: float = Field(
        default=NODE_TTL_S,
        gt=0,
        description="Seconds a registered node (torchrun's rendezvous gate) stays in the "
        "registry after its latest join or heartbeat; then another process may take its name",
    )
    job_retention_s: float = Field(
        default=7 * 86400,
        ge=0,
        description="Seconds an ended job's keys (spec, plan, ledger and its checkpoints, "
        "restart ledger, rank hellos) stay in etcd after it ended; 0: kept for good "
        "(antdt jobs remove deletes one)",
    )

    adjust_broadcast_from: int = Field(
        default=BROADCAST_FROM,
        ge=1,
        description="Ranks from which a job's AdjustBatch goes out once on its job-wide "
        "command subject (every rank takes the plan from one publish and acks to one inbox), "
        "then to the ranks that did not ack on their own subjects; below, to each rank's "
        "subject (a trace span per rank)",
    )
    incident_decision_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Share of one core (CPU seconds a second) a job's decisions may take "
        "on average; past it, the job's incident transitions are not decided on one by one "
        "but by its next health decision (about once a second)",
    )
    incident_decision_burst_s: float = Field(
        default=0.25,
        gt=0,
        description="CPU seconds of decisions a job may take at once before its share "
        "applies, seconds",
    )

    def timing(self) -> Timing:
        return Timing(
            lead_steps=self.lead_steps,
            restart_lead_steps=self.restart_lead_steps,
            blocklist_ttl_s=self.blocklist_ttl_s,
            ack_timeout_s=self.ack_timeout_s,
            ack_deadline_s=self.ack_deadline_s,
            broadcast_from=self.adjust_broadcast_from,
        )


class ControllerService:
    def __init__(self, settings: ControllerSettings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.keys = Keys(settings.etcd.key_prefix)
        self.ownership = Ownership.for_service(store, settings, SERVICE)
        self.executor = Executor(
            bus,
            store,
            self.ownership,
            subjects=self.subjects,
            keys=self.keys,
            timing=settings.timing(),
        )
        self.hellos = RankHellos(store, self.keys, self.ownership)
        self.owned = OwnedJobs(store, self.keys, self.ownership, self.hellos, self._left_open)
        self.policies: dict[str, Policy] = {}
        self.blocklist = Blocklist()  # what is under `blocklist/` (all jobs)
        self.traces = DecisionTraces(effect_steps=settings.telemetry.effect_steps)
        # (job, "hello" | "health" | "incident" | "decision" | "deferred")
        self.counts = JobCounts()
        self.budget = DecisionBudget(
            settings.incident_decision_share, settings.incident_decision_burst_s
        )
        self.nodes = NodeDesk(
            store, self.keys, self.subjects, self.owned, ttl_s=settings.node_ttl_s
        )

    @property
    def jobs(self) -> dict[str, JobState]:
        """The states of the jobs this replica owns, loaded."""
        return self.owned.states

    async def start(self, runtime: ServiceRuntime) -> None:
        await self.bus.jetstream.ensure_stream(
            ACTION_STREAM,
            [self.subjects.any_job("action")],
            max_age_s=self.settings.action_retention_s,
        )
        self.ownership.on_lost(self._forget)
        s, q, every = self.subjects, QUEUE_GROUP, "*"
        reads = Reads(self.store, self.keys, s, self.owned, self.hellos)
        await self.bus.subscribe(s.register(every), JobSpec, self._on_register, queue=q)
        await self.bus.subscribe(s.plan_get(every), PlanRequest, reads.on_plan_get, queue=q)
        await self.bus.subscribe(s.spec_get(every), SpecRequest, reads.on_spec_get, queue=q)
        await self.bus.subscribe(s.node_join(every), NodeJoin, self.nodes.on_join, queue=q)
        beat = self.nodes.on_heartbeat
        await self.bus.subscribe(s.node_heartbeat(every), NodeHeartbeat, beat, queue=q)
        await self.bus.subscribe(s.health(every), JobHealth, self._on_health)
        await self.bus.subscribe(s.incident(every), Incident, self._on_incident)
        await self.bus.subscribe(s.hello(every, every), RankHello, self._on_hello)
        desk = ProposalDesk(self.executor, s, self.owned.for_request)
        await self.bus.subscribe(s.proposal(every), ActionProposal, desk.handle)
        runtime.spawn("lease", self.ownership.watch_lease())
        runtime.spawn("hellos", self.hellos.write_loop())
        runtime.spawn("blocklist", self.blocklist.follow(self.store, self.keys))
        runtime.spawn("blocklist-sweep", self.blocklist.sweep_expired(self.store, self.keys))
        runtime.spawn("nodes", self.nodes.refresh_loop())
        if self.settings.job_retention_s > 0:
            retention = remove_old_jobs(self.store, self.keys, self.settings.job_retention_s)
            runtime.spawn("job-retention", retention)
        interval_s = self.settings.etcd.lease_ttl_s / 2
        runtime.spawn("claim", claim_rounds(self._claim_round, interval_s))
        runtime.on_shutdown("drain", self.bus.drain)
        runtime.on_shutdown("finish", self.hellos.flush)  # while we still own the jobs
        runtime.on_shutdown("revoke", self.ownership.stop)
        log.info("controller started", replica=self.settings.replica_id)

    # -- registration and plans (any replica) -------------------------------------------

    async def _on_register(self, spec: JobSpec, delivery: Delivery) -> RegisterReply:
        if self.subjects.job_of(delivery.subject) != spec.job:
            raise Rejected(ErrorCode.BAD_REQUEST, "job does not match the subject")
        self.owned.ended.forget(spec.job)
        try:
            self._policy(spec.policy)  # an unknown policy is refused before anything is stored
        except ValueError as exc:
            raise Rejected(ErrorCode.BAD_REQUEST, str(exc)) from None
        reply = await register(self.store, self.keys, spec, time.time())
        # A rank says hello first, then registers: the claim loads the hellos heard.
        await self.owned.claim(spec.job)
        return reply

    # -- ownership ----------------------------------------------------------------------

    async def _claim_round(self) -> None:
        """Claim every live job nobody owns (a takeover) and load what is not loaded."""
        for job in await self._claimable():
            await self.owned.claim(job)

    async def _claimable(self) -> list[str]:
        return [
            j for j in await live_jobs(self.store, self.keys) if self.owned.ended.known(j) is None
        ]

    async def _state(self, job: str) -> JobState | None:
        """The owned job's state, loaded when it was claimed (None: not ours, or ended)."""
        return await self.owned.get(job)

    async def _forget(self, job: str) -> None:
        self.owned.forget(job)
        self.budget.forget(job)

    # -- events (owner only) ------------------------------------------------------------

    async def _on_hello(self, hello: RankHello, delivery: Delivery) -> None:
        if delivery.subject != self.subjects.hello(hello.job, hello.rank):
            raise Rejected(ErrorCode.BAD_REQUEST, "job or rank does not match the subject")
        self.owned.ended.forget(hello.job)
        if self.hellos.remember(hello):
            state = await self._state(hello.job)
            if state is not None and state.started.get(hello.rank) != hello.started_at:
                state.learn_hello(hello)
                self.hellos.save(hello)
        self.counts.add(hello.job, "hello")

    async def _on_health(self, health: JobHealth, delivery: Delivery) -> None:
        ended = shows_end(health)
        if not ended:  # a job taken for abandoned that stepped on is live again
            self.owned.ended.forget(health.job)
        state = await self._state(health.job)
        if state is not None and ended:
            await self.owned.end(health)
        elif state is not None:
            await self._follow_health(state, health)
        self.counts.add(health.job, "health")

    async def _follow_health(self, state: JobState, health: JobHealth) -> None:
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

    async def _left_open(self, job: str) -> list[Incident]:
        left = await open_incidents(self.bus, self.subjects, job, time.time())
        return [each.incident for each in left]

    async def _on_incident(self, incident: Incident, delivery: Delivery) -> None:
        state = await self._state(incident.job)
        if state is not None:
            self.traces.incident(incident)  # decisions on it join its trace
            state.learn_incident(incident)
            await self._decide(state, incident)
        self.counts.add(incident.job, "incident")

    def _may_decide_now(self, incident: Incident) -> bool:
        """Whether the job's decisions left CPU time for one on this transition; else it
        waits for the job's next health decision (counted, logged when deferring starts
        and when it ends)."""
        job, now = incident.job, time.monotonic()
        if self.budget.allows(job, now):
            deferred = self.budget.decided(job, now)
            if deferred:
                log.info("incident decisions resumed", job=job, deferred=deferred)
            return True
        self.counts.add(job, "deferred")
        metrics.decision_deferred(job)
        if self.budget.defer(job, now) == 1:
            log.info(
                "incident decisions deferred to the job's health decisions",
                job=job,
                incident=incident.id,
                share=self.budget.share,
                owed_s=round(-self.budget.left_s(job, now), 4),
            )
        return False

    async def _decide(self, state: JobState, event: JobHealth | Incident) -> None:
        if state.busy.locked():  # an action is in flight; the next event re-decides
            return
        if state.ranks_away():
            return  # a plan needs every rank's ack: not while some have exited or restart
        if isinstance(event, Incident) and not self._may_decide_now(event):
            return  # the job's next health decides on it
        job = state.spec.job
        async with state.busy:
            started = time.thread_time()  # the view and the policy: the job's decision
            policy = self._policy(state.spec.policy)
            now = time.time()
            view = state.view(now, self.blocklist.hosts(now))
            self.counts.add(job, "decision")
            with self.traces.decide(job, state.spec.policy, event) as decision:
                actions = policy.decide(view, event)
                self.budget.spend(job, time.monotonic(), time.thread_time() - started)
                for action in actions:
                    if not self.ownership.owns(job):
                        return
                    with decision.action(action):
                        record = await self.executor.apply(state, action, view)
                        decision.done(record, view.health)

    def _policy(self, name: str) -> Policy:
        if name not in self.policies:
            self.policies[name] = load_policy(name)
        return self.policies[name]
