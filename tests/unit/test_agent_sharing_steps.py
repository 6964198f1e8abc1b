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
from antdt.sharing import Pace, Refusal, Refused, ShareParams

dist = pytest.importorskip("torch.distributed")

OWN, OTHERS = list(range(8)), [100, 101, 102, 103]
#: Compute seconds per sample in the step before: rank 0's share is twice rank 1's, so at
#: FAST_S / 2 against FAST_S both take as long.
FAST_S, SLOW_S = 1e-3, 1e-2


class _Pair:
    """The other rank's side of rank 0's collectives: rank 1 counts its samples (and
    publishes them, when it is the one that offers) and reports its pace."""

    def __init__(self, pace_1: float, slow_rank: int) -> None:
        self._pace_1, self._slow_rank = pace_1, slow_rank

    def all_sum(
        self, values: list[int], around: frozenset[int] = frozenset(), posts: Any = None
    ) -> list[int]:
        """The count (through the claim store's posts: [samples, the offering rank's
        samples, full shares, ranks planned 0 holding samples, newest plan version and
        its square, restart vote]), or the pace report ([own paces, helping paces, claim
        round trips] by rank, in ns)."""
        if posts is None:
            theirs = [0, int(self._pace_1 * 1e9), 0, 0, 0, 0]
        else:  # rank 1 got all it asked for; it holds plan 1 and no restart
            offered = [len(OTHERS) if self._slow_rank == 1 else 0]
            theirs = [len(OTHERS), *offered[: len(values) - 6], len(OTHERS), 0, 1, 1, 0]
        return [a + b for a, b in zip(values, theirs, strict=True)]


class _Stream:
    def take(self, n: int, epoch: int) -> Taken:
        return Taken(ids=OWN[:n])

    def synced(self, finished: list[Any]) -> None:
        pass


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


def _job(slow_rank: int = 1, chunks: int = 2, delay_s: float = 0.0) -> tuple[Any, ...]:
    """Rank 0's first step, its driver and rank 1's claim client, `slow_rank` slow in
    the step before (it offers); the ids rank 0 logs as computed and the step records
    it emits go to one list (then what to keep alive)."""
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
    sharing = WorkSharing(ShareParams(True, chunks), lambda: StoreClaims(link, 0, 2))
    # The step before's paces, as its exchange gave them to every rank.
    sharing.paces = [
        Pace(SLOW_S if slow_rank == 0 else FAST_S / 2),
        Pace(SLOW_S if slow_rank == 1 else FAST_S),
    ]
    pair = _Pair(SLOW_S if slow_rank == 1 else FAST_S, slow_rank)
    driver = StepDriver(
        rank=0,
        host="h0",
        stream=_Stream(),  # type: ignore[arg-type]
        plans=plans,
        collectives=lambda: pair,  # type: ignore[arg-type,return-value]
        schedule=InjectionSchedule(),
        emit=out.append,
        log_ids=out.append,
        sharing=sharing,
    )
    driver.epoch = 0
    other = StoreClaims(stores[1], 1, 2)
    offered = {r: (len(ids), 0) for r, ids in enumerate((OWN, OTHERS)) if r == slow_rank}
    other.open(0, offered, chunks, OTHERS if slow_rank == 1 else None)
    steps = driver.steps()
    return next(steps), driver, other, [out, server, steps, link]


def test_claims_twice_in_a_step_is_refused_and_nothing_is_computed_twice() -> None:
    step, driver, other, (out, *_) = _job()
    batches = [mb.ids for mb in step.claims()]
    assert batches == [OWN, [102, 103], [100, 101]]  # its own in one, then rank 1's
    computed = [i for ids in batches for i in ids]
    with pytest.raises(RuntimeError, match="already iterated"):
        next(iter(step.claims()))
    assert other.claim_next() is None
    assert step.sync() == 12
    driver.finish(time.perf_counter())
    line, record = out
    assert sorted(line.ids) == sorted(computed) and record.samples == 12
    assert record.helped == ((1, 4),)


def test_sync_before_the_claims_end_is_refused() -> None:
    step, _driver, _other, _keep = _job()
    claims = step.claims()
    next(claims)
    with pytest.raises(RuntimeError, match="to its end"):
        step.sync()


def test_a_script_without_claims_keeps_its_own_ids_from_helpers() -> None:
    step, driver, other, (out, *_) = _job(slow_rank=0)
    # The script computes step.micro_batches itself; rank 1 helps only after its sync.
    step.sync()
    assert other.claim_next() is None  # rank 0's were claimed at its sync: none to help
    driver.finish(time.perf_counter())
    line, record = out
    assert line.ids == OWN and record.samples == len(OWN)


def test_a_helper_holding_an_own_micro_batch_fails_a_script_without_claims() -> None:
    step, _driver, other, _keep = _job(slow_rank=0)
    held = other.claim_next()
    assert held is not None and held.owner == 0  # rank 1 helps rank 0: it computes those
    with pytest.raises(AgentError, match=r"every rank iterates step\.claims"):
        step.sync()


def test_a_claim_for_a_micro_batch_already_claimed_by_another_is_refused() -> None:
    _step, driver, other, _keep = _job()
    mine = driver.sharing.client
    assert [c.ids for c in other.claim_own(0, 2)] == [[100, 101], [102, 103]]
    again = mine.claim_help(0, 1)
    assert isinstance(again, Refused) and again.refusal is Refusal.ALREADY_CLAIMED
    itself = mine.claim_help(0, 0)  # rank 0 offered nothing: no ticket to draw
    assert isinstance(itself, Refused) and itself.refusal is Refusal.NOT_OFFERED
    assert mine.claim_next() is None


def test_claim_store_round_trips_count_as_communication_not_compute() -> None:
    """A rank behind a slow link spends its claims waiting on the store: reported as
    compute, the monitor would class the link as a slow compute."""
    step, driver, _other, (out, *_alive, link) = _job(slow_rank=0, chunks=8, delay_s=0.02)
    for _micro in step.claims():
        pass  # computing takes no time here: all of it is the store's
    step.sync()
    driver.finish(time.perf_counter())
    _line, record = out
    waited = link.calls * 0.02
    assert waited >= 0.18  # the publish and a ticket per micro-batch
    assert record.comm_s >= waited and record.data_wait_s < 0.01
    assert record.step_s - record.data_wait_s - record.comm_s < 0.01  # compute_s


def test_a_step_without_offers_touches_no_store() -> None:
    """Nobody was slow: every rank computes its own share in one piece, no round trip."""
    step, _driver, _other, (*_alive, link) = _job(slow_rank=-1, delay_s=0.02)
    assert [mb.ids for mb in step.claims()] == [OWN]
    step.sync()
    assert link.calls == 0


def _computed(step: Any, seconds_per_sample: float) -> None:
    for micro in step.claims():
        time.sleep(seconds_per_sample * len(micro.ids))


def test_a_helper_reports_its_own_share_in_one_pass_without_its_help() -> None:
    """Rank 0 computes its 8 samples in one pass and helps with rank 1's 4: its step's
    compute holds both, `one_piece_s` its own share's time only."""
    step, driver, _other, (out, *_alive) = _job(slow_rank=1)
    _computed(step, 0.005)
    step.sync()
    driver.finish(time.perf_counter())
    record = out[-1]
    assert record.samples == 12 and record.helped == ((1, 4),)
    assert record.one_piece_s is not None and 0.04 <= record.one_piece_s < 0.05
    assert record.step_s - record.data_wait_s - record.comm_s >= 0.06


def test_an_offering_rank_reports_its_share_at_the_helpers_one_pass_ratio() -> None:
    """Rank 0 offered its share as 2 micro-batches and computed both itself at 5 ms a
    sample; last step rank 1 computed its own share at half the pace it helped at: rank
    0's share in one pass is taken to cost half as much per sample."""
    step, driver, _other, (out, *_alive) = _job(slow_rank=0)
    driver.sharing.paces[1] = Pace(FAST_S, 2 * FAST_S)  # the exchange before this step's
    _computed(step, 0.005)
    step.sync()
    driver.finish(time.perf_counter())
    record = out[-1]
    assert record.samples == 8 and record.one_piece_s is not None
    assert 0.5 * 0.04 <= record.one_piece_s < 0.5 * 0.05


def test_a_step_run_as_planned_reports_no_one_pass_time() -> None:
    step, driver, _other, (out, *_alive) = _job(slow_rank=-1)
    _computed(step, 0.001)
    step.sync()
    driver.finish(time.perf_counter())
    assert out[-1].one_piece_s is None
