"""Work sharing through the step driver, bad use refused: `step.claims()` twice in a
step, a sync before its end, a script that computed its own ids without claiming them
(claimed at sync, so no helper takes one; an error if a helper already has). Rank 0 is
the driver; rank 1 is the claim store client the other rank's driver would hold."""

from __future__ import annotations

import time
from typing import Any

import pytest

from antdt.agent.errors import AgentError
from antdt.agent.sampling import Taken
from antdt.agent.sharing import ClaimState, Refusal, Refused

dist = pytest.importorskip("torch.distributed")

OWN, OTHERS = list(range(8)), [[100, 101], [102, 103]]


class _Stream:
    def take(self, n: int, epoch: int) -> Taken:
        return Taken(ids=OWN[:n])

    def synced(self, finished: list[Any]) -> None:
        pass


class _Pair:
    """The count all-reduce of two ranks, rank 1 contributing its fixed count."""

    def count(self, local_samples: int) -> int:
        return local_samples + sum(len(ids) for ids in OTHERS)


class _SlowLink:
    """A real store behind a slow link: every call waits `delay_s` first."""

    def __init__(self, store: Any, delay_s: float) -> None:
        self._store, self._delay_s, self.calls = store, delay_s, 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._store, name)

        def slowly(*args: Any) -> Any:
            self.calls += 1
            time.sleep(self._delay_s)
            return call(*args)

        return slowly


def _job(delay_s: float = 0.0) -> tuple[Any, Any, Any, list[Any]]:
    """Rank 0's first step, its driver and rank 1's claim client; the ids rank 0 logs
    as computed and the step records it emits go to one list (then what to keep alive)."""
    from antdt.agent.claimstore import StoreClaims
    from antdt.agent.inject import InjectionSchedule
    from antdt.agent.shared_work import WorkSharing
    from antdt.agent.steps import StepDriver
    from antdt.agent.timeline import StepPlans
    from antdt.schemas import Plan

    server = dist.TCPStore("127.0.0.1", 0, 3, True, wait_for_workers=False)
    stores = [dist.TCPStore("127.0.0.1", server.port, 3, False) for _ in range(2)]
    link = _SlowLink(stores[0], delay_s)
    plans = StepPlans("j", 2)
    plans.adopt(Plan(job="j", version=1, local_batch=(8, 4), effective_step=0, created_at=0.0))
    out: list[Any] = []
    driver = StepDriver(
        rank=0,
        host="h0",
        stream=_Stream(),  # type: ignore[arg-type]
        plans=plans,
        collectives=_Pair,  # type: ignore[arg-type]
        schedule=InjectionSchedule(),
        emit=out.append,
        log_ids=out.append,
        sharing=WorkSharing(4, lambda: StoreClaims(link, 0, 2)),
    )
    driver.epoch = 0
    other = StoreClaims(stores[1], 1, 2)
    other.publish(0, OTHERS)  # before rank 0's count, as the real all-reduce orders it
    steps = driver.steps()
    return next(steps), driver, other, [out, server, steps, link]


def test_claims_twice_in_a_step_is_refused_and_nothing_is_computed_twice() -> None:
    step, driver, other, (out, *_) = _job()
    computed = [i for mb in step.claims() for i in mb.ids]
    assert sorted(computed) == [*OWN, 100, 101, 102, 103]  # rank 1 took none: all helped
    with pytest.raises(RuntimeError, match="already iterated"):
        next(iter(step.claims()))
    assert other.claim_next() is None
    assert step.sync() == 12
    driver.finish(time.perf_counter())
    line, record = out
    assert sorted(line.ids) == sorted(computed) and record.samples == 12


def test_sync_before_the_claims_end_is_refused() -> None:
    step, _driver, _other, _keep = _job()
    claims = step.claims()
    next(claims)
    with pytest.raises(RuntimeError, match="to its end"):
        step.sync()


def test_a_script_without_claims_keeps_its_own_ids_from_helpers() -> None:
    step, driver, other, (out, *_) = _job()
    # The script computes step.micro_batches itself; meanwhile rank 1 ran out of its own.
    assert [other.claim_next() for _ in range(2)] != [None, None]
    step.sync()
    assert other.claim_next() is None  # rank 0's were claimed at its sync: none to help
    assert {other.record(0, i).state for i in range(4)} == {ClaimState.DONE}
    driver.finish(time.perf_counter())
    line, record = out
    assert line.ids == OWN and record.samples == len(OWN)


def test_a_helper_holding_an_own_micro_batch_fails_a_script_without_claims() -> None:
    step, _driver, other, _keep = _job()
    while (held := other.claim_next()) is not None and held.owner != 0:
        pass
    assert held is not None and held.owner == 0  # rank 1 helps rank 0: it computes those
    with pytest.raises(AgentError, match=r"every rank iterates step\.claims"):
        step.sync()


def test_a_claim_for_a_micro_batch_already_claimed_or_done_by_another_is_refused() -> None:
    _step, driver, other, _keep = _job()
    mine = driver.sharing.client
    held = other.claim(0, 1, 0)
    assert not isinstance(held, Refused)
    again = mine.claim(0, 1, 0)
    assert isinstance(again, Refused) and again.refusal is Refusal.ALREADY_CLAIMED
    stolen_done = mine.done(held)  # rank 0 marking rank 1's claim done: not its claim
    assert isinstance(stolen_done, Refused) and stolen_done.refusal is Refusal.NOT_CLAIMER
    assert other.record(1, 0).state is ClaimState.CLAIMED and other.record(1, 0).rank == 1


def test_claim_store_round_trips_count_as_communication_not_compute() -> None:
    """A rank behind a slow link spends its claims waiting on the store: reported as
    compute, the monitor would class the link as a slow compute."""
    step, driver, _other, (out, *_alive, link) = _job(delay_s=0.02)
    for _micro in step.claims():
        pass  # computing takes no time here: all of it is the store's
    step.sync()
    driver.finish(time.perf_counter())
    _line, record = out
    waited = link.calls * 0.02
    assert waited >= 0.3  # publish, a claim and a done per micro-batch, the steals' reads
    assert record.comm_s >= waited and record.data_wait_s < 0.01
    assert record.step_s - record.data_wait_s - record.comm_s < 0.01  # compute_s
