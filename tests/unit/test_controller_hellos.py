"""The controller's record of a job: what each rank's latest process said of itself, and
the open incidents."""

from __future__ import annotations

from antdt.schemas import Incident, IncidentKind, IncidentState, JobSpec, Keys, Plan, RankHello
from antdt.services.controller.hellos import RankHellos
from antdt.services.controller.state import JobState

SPEC = JobSpec(job="j", world_size=2, dataset_size=100, shard_size=10, global_batch=8)


def hello(rank: int, started_at: float, cap: int | None = None, world: int = 2) -> RankHello:
    return RankHello(
        job="j",
        rank=rank,
        world_size=world,
        host=f"h{rank}-{started_at:g}",
        pid=1,
        started_at=started_at,
        max_local_batch=cap,
    )


def state() -> JobState:
    plan = Plan(job="j", version=0, local_batch=(4, 4), effective_step=0, created_at=0.0)
    return JobState(spec=SPEC, plan=plan, plan_revision=1)


def test_the_newest_process_of_a_rank_wins_and_an_older_hello_is_ignored() -> None:
    hellos = RankHellos(store=None, keys=Keys(), ownership=None)  # type: ignore[arg-type]
    assert hellos.remember(hello(0, 10.0, cap=64))
    assert hellos.remember(hello(0, 20.0, cap=32))  # restarted
    assert not hellos.remember(hello(0, 10.0, cap=64))  # the old one, arriving late
    assert hellos._heard["j"][0].max_local_batch == 32


def test_a_hello_sets_host_start_and_cap_and_one_without_a_cap_clears_it() -> None:
    job = state()
    job.learn_hello(hello(1, 10.0, cap=64))
    assert (job.hosts, job.started, job.memory_caps) == ({1: "h1-10"}, {1: 10.0}, {1: 64})
    job.learn_hello(hello(1, 20.0))  # a new process on a device of unknown memory
    assert (job.hosts[1], job.memory_caps) == ("h1-20", {})
    job.learn_hello(hello(1, 30.0, cap=8, world=3))  # another world: not this job's rank
    job.learn_hello(hello(5, 30.0, cap=8, world=2))  # out of range
    assert (job.hosts, job.memory_caps) == ({1: "h1-20"}, {})


def test_an_incident_is_kept_open_at_its_latest_transition_until_resolved() -> None:
    job = state()
    opened = Incident(
        id="i",
        job="j",
        rank=1,
        host="h1",
        kind=IncidentKind.SLOW,
        state=IncidentState.OPENED,
        step=5,
        opened_at=1.0,
        updated_at=1.0,
        ratio=2.0,
        windows=3,
    )
    escalated = opened.model_copy(update={"state": IncidentState.ESCALATED, "windows": 6})
    job.learn_incident(opened)
    job.learn_incident(escalated)
    assert job.view(2.0).open_incidents == (escalated,)
    job.learn_incident(escalated.model_copy(update={"state": IncidentState.RESOLVED}))
    assert job.incidents == {} and job.view(3.0).open_incidents == ()
