"""The closed loop: one policy on one simulated cluster, through the real detector,
policy, guardrails (inside the policies) and plan builder. Time is the simulated clock,
passed in; no servers. Each step: the cluster's factors (cluster.py) and the plan in
force give every rank's compute; the slowest rank (under work sharing, the water level
of sharing.py) and the slowest link set the step;
the detector ingests every rank's step (every `monitor_every`-th step); each health
period the policy decides on the health and on each incident transition, and its
actions change the plan or move a rank to a spare node (paying the restart cost)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from antdt.collector import collector_paused
from antdt.schemas import Incident, JobSpec, Plan, RestartLedger
from antdt.services.controller.actions import AdjustBatchAction, KillRestartAction
from antdt.services.controller.plans import initial_plan, next_plan
from antdt.services.controller.policies import JobView, load_policy
from antdt.services.controller.view import remaining_samples
from antdt.services.monitor.detector import JobDetector, StepColumns
from antdt.sharing import ShareParams
from antdt.sim.cluster import Bools, Cluster, Episodes, Floats
from antdt.sim.files import ScenarioFile
from antdt.sim.sharing import SharedStep, SharingModel

JOB = "sim"
#: Called after each simulated step with the number of steps done in this run.
Progress = Callable[[int], None]


@dataclass
class RunResult:
    """One policy's run: its job time and what it did."""

    policy: str
    step_s: Floats  # wall time of every step (restart costs not included)
    restart_s: float = 0.0  # restart costs paid
    adjusts: int = 0
    restarts: int = 0
    compute_s: Floats = field(default_factory=lambda: np.zeros(0))  # slowest compute a step

    @property
    def job_s(self) -> float:
        return float(self.step_s.sum()) + self.restart_s


def job_spec(scenario: ScenarioFile, policy: str) -> JobSpec:
    global_batch = scenario.local_batch * scenario.ranks
    spares = ",".join(f"spare{i}" for i in range(scenario.spares))
    params: dict[str, float | int | str | bool] = {"host_pool": spares}
    return JobSpec(
        job=JOB,
        world_size=scenario.ranks,
        dataset_size=global_batch * scenario.steps,
        shard_size=scenario.local_batch,
        global_batch=global_batch,
        policy=policy,
        policy_params={**params, **scenario.policy_params},
    )


class _Loop:
    """The state of one policy's run."""

    def __init__(self, scenario: ScenarioFile, policy: str) -> None:
        self.scenario, self.policy_name = scenario, policy
        self.policy = load_policy(policy)
        self.spec = job_spec(scenario, policy)
        self.plan: Plan = initial_plan(self.spec, now=0.0)
        self.batches = np.array(self.plan.local_batch, dtype=np.float64)
        self.accumulation = np.ones(scenario.ranks)
        self.detector = JobDetector(JOB, scenario.ranks)
        # A policy that acts on nothing the monitor says (`none`) runs the same without it.
        self.watched = not getattr(self.policy, "observes_only", False)
        self.hosts = {r: f"node{r // scenario.ranks_per_node}" for r in range(scenario.ranks)}
        self.host_names = [self.hosts[r] for r in range(scenario.ranks)]
        self.rank_ids = np.arange(scenario.ranks, dtype=np.int64)
        self.spares = [f"spare{i}" for i in range(scenario.spares)]
        self.restart_ledger = RestartLedger()
        self.last_action_at: float | None = None
        self.now = 0.0
        self.pending: list[Incident] = []  # transitions since the last decision
        self.moved: list[int] = []  # ranks moved to a spare node, not yet told the cluster

    def feed(self, s: int, wall: float, done: SharedStep, link: Floats) -> None:
        """Every rank's step event into the detector, as one step's columns (the samples
        each rank computed and the seconds it spent on them), its transitions kept."""
        n, now = self.scenario.ranks, self.now
        columns = StepColumns(
            JOB,
            self.rank_ids,
            self.host_names,
            np.full(n, s, dtype=np.int64),
            np.full(n, self.plan.version, dtype=np.int64),
            self.batches.astype(np.int64),
            np.full(n, now - wall),
            np.full(n, now),
            np.rint(done.samples).astype(np.int64),
            done.busy_s,
            np.zeros(n),
            np.maximum(0.0, wall - done.busy_s),
            np.full(n, wall),
            self.scenario.link_rtt_s * link,
            done.one_piece_s,
        )
        self.pending.extend(self.detector.ingest_step(columns, now))

    def decide(self, s: int) -> list[object]:
        """The policy's actions on the health now. The view carries every open incident,
        so the transitions since the last health (on which the controller decides at
        once) are decided here at the health period: bounded work at any scale."""
        health = self.detector.health(self.now)
        self.pending = []
        view = JobView(
            spec=self.spec,
            plan=self.plan,
            health=health,
            open_incidents=self.detector.open_incidents,
            memory_caps={},
            last_action_at=self.last_action_at,
            now=self.now,
            hosts=self.hosts,
            restarts=self.restart_ledger,
            remaining_samples=remaining_samples(self.spec, health),
        )
        return [a for a in self.policy.decide(view, health) if self.apply(a, s)]

    def apply(self, action: object, s: int) -> bool:
        """Carry an action out as the executor would; False when it changes nothing."""
        if isinstance(action, AdjustBatchAction):
            self._adopt(
                next_plan(
                    self.plan, action, policy=self.policy_name, effective_step=s + 1, now=self.now
                )
            )
            return True
        if isinstance(action, KillRestartAction) and self.spares:
            spare = self.spares.pop(0)
            self.hosts = {**self.hosts, action.rank: spare}
            self.host_names[action.rank] = spare
            self.moved.append(action.rank)
            cost = self.scenario.restart_cost_s
            self.now += cost
            ledger = self.restart_ledger
            self.restart_ledger = ledger.model_copy(
                update={
                    "count": ledger.count + 1,
                    "costs": (*ledger.costs, cost)[-8:],
                    "last_decided_at": self.now,
                    "last_checkpoint_step": s,
                }
            )
            # The job restarts from the checkpoint: every rank starts afresh, so does
            # the monitor's view of it.
            self.detector = JobDetector(JOB, self.scenario.ranks, epoch=ledger.count + 1)
            if action.local_batch_after is not None:
                self._adopt(self.plan.model_copy(update={"local_batch": action.local_batch_after}))
            return True
        return False

    def _adopt(self, plan: Plan) -> None:
        self.plan = plan
        self.batches = np.array(plan.local_batch, dtype=np.float64)
        self.accumulation = np.array(plan.accumulation or (1,) * self.scenario.ranks)
        self.last_action_at = self.now


class ClusterModel(Protocol):
    """What a run asks of its cluster (`Cluster`; a replay's recorded one)."""

    def step(self, s: int) -> tuple[Floats, Floats]: ...

    def move(self, rank: int, s: int) -> None: ...


def sharing_model(scenario: ScenarioFile, spec: JobSpec) -> SharingModel | None:
    """The job's work sharing when its policy params (or its policy's default) turn it on."""
    params = ShareParams.from_params(spec.policy_params, spec.policy)
    if not params.enabled:
        return None
    return SharingModel(params, scenario.fixed_s, scenario.per_sample_s)


def fewer_collections() -> AbstractContextManager[None]:
    """Python's cyclic garbage collector paused for the block, as it was after. A run
    allocates millions of short-lived objects (rows, windows, a health's rows) beside a
    large live state (every rank's memory) and makes next to no cycles (a few hundred
    objects in 300 steps of 10,000 ranks): collections walked what it allocated for a
    tenth of its time at 10,000 ranks. Nothing a run computes changes."""
    return collector_paused()


def run_policy(
    scenario: ScenarioFile,
    policy: str,
    progress: Progress | None = None,
    *,
    cluster: ClusterModel | None = None,
) -> RunResult:
    """`policy` on the scenario's cluster (or `cluster`), closed loop."""
    with fewer_collections():
        return _run_policy(scenario, policy, progress, cluster)


def _run_policy(
    scenario: ScenarioFile,
    policy: str,
    progress: Progress | None,
    cluster: ClusterModel | None,
) -> RunResult:
    sc = scenario
    cluster, loop = cluster or Cluster(sc), _Loop(sc, policy)
    step_s, slowest = np.zeros(sc.steps), np.zeros(sc.steps)
    next_health = sc.health_period_s
    result = RunResult(policy, step_s, compute_s=slowest)
    sharing = sharing_model(sc, loop.spec)
    for s in range(sc.steps):
        factors, link = cluster.step(s)
        compute = (sc.fixed_s * loop.accumulation + sc.per_sample_s * loop.batches) * factors
        compute[loop.batches == 0] = 0.0
        if sharing is None:
            done = SharedStep(float(compute.max()), loop.batches, compute)
        else:
            done = sharing.step(compute, loop.batches, factors, loop.accumulation == 1)
        wall = done.compute_s + sc.comm_s * float(link.max())
        step_s[s], slowest[s] = wall, done.compute_s
        loop.now += wall
        if loop.watched and s % sc.monitor_every == 0:
            loop.feed(s, wall, done, link)
        if loop.watched and loop.now >= next_health:
            for action in loop.decide(s):
                result.adjusts += isinstance(action, AdjustBatchAction)
            for rank in loop.moved:
                cluster.move(rank, s + 1)
                result.restarts += 1
                result.restart_s += sc.restart_cost_s
            loop.moved = []
            next_health = loop.now + sc.health_period_s
        if progress is not None:
            progress(s + 1)
    return result


def run_reference(
    scenario: ScenarioFile, progress: Progress | None = None
) -> tuple[RunResult, RunResult]:
    """The oracle and the healthy cluster, from the same draws as every policy's run.
    Oracle: each step's batches split as every rank's speed asks (continuous, no bounds),
    at once and free; the step's random jitter, which no plan can know, it meets as every
    policy does; a slow link moved at its onset, for the restart cost, when its extra
    exchange time would cost more. Healthy: no slowdown (generations kept), equal batches."""
    sc = scenario

    def worth_moving(e: Episodes) -> Bools:
        extra = sc.comm_s * (e.factor - 1.0) * (e.end - e.start)
        return e.link & (extra > sc.restart_cost_s)

    cluster = Cluster(sc, keep=lambda e: ~worth_moving(e))
    healthy = Cluster(sc, keep=lambda e: np.zeros(len(e.rank), dtype=bool))
    moved = int(worth_moving(Cluster(sc).episodes).sum())
    batch = float(sc.local_batch * sc.ranks)
    oracle = RunResult("oracle", np.zeros(sc.steps), compute_s=np.zeros(sc.steps))
    oracle.restarts, oracle.restart_s = moved, moved * sc.restart_cost_s
    ideal = RunResult("healthy", np.zeros(sc.steps), compute_s=np.zeros(sc.steps))
    for s in range(sc.steps):
        speed, jitter, link = cluster.step_parts(s)
        oracle.compute_s[s] = _water_level_step(sc, batch, speed, jitter)
        oracle.step_s[s] = oracle.compute_s[s] + sc.comm_s * float(link.max())
        plain, healthy_link = healthy.step(s)
        slowest = float(((sc.fixed_s + sc.per_sample_s * sc.local_batch) * plain).max())
        ideal.compute_s[s] = slowest
        ideal.step_s[s] = slowest + sc.comm_s * float(healthy_link.max())
        if progress is not None:
            progress(s + 1)
    return oracle, ideal


def _water_level_step(sc: ScenarioFile, batch: float, speed: Floats, jitter: Floats) -> float:
    """The slowest rank's compute when `batch` samples are split so that every rank
    would take the same time at its `speed` (the water level), then run with `jitter`."""
    a, b = sc.fixed_s * speed, sc.per_sample_s * speed
    level = (batch + float((a / b).sum())) / float((1.0 / b).sum())
    batches = np.maximum(0.0, (level - a) / b)
    return float(((a + b * batches) * jitter).max())
