"""Work sharing's claim protocol: the pure transition and choices, then the claim store
on a real TCPStore with ranks as threads (every micro-batch claimed exactly once)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from antdt.agent.sharing import (
    Claim,
    ClaimEvent,
    ClaimState,
    Op,
    Refusal,
    Refused,
    ShareParams,
    StepShare,
    cut,
    furthest_behind,
    stolen_index,
    transition,
)

SHARE = StepShare(step=5, world=3, counts={0: 4, 1: 4, 2: 2})


def claim(rank: int, owner: int = 1, index: int = 0, step: int = 5) -> ClaimEvent:
    return ClaimEvent(Op.CLAIM, rank, step, owner, index)


def refusal(result: Claim | Refused) -> Refusal:
    assert isinstance(result, Refused), result
    return result.refusal


def test_claim_then_done_by_the_claimer() -> None:
    claimed = transition(SHARE, Claim(), claim(2), now=1.5)
    assert claimed == Claim(ClaimState.CLAIMED, 2, 1.5)
    done = transition(SHARE, claimed, ClaimEvent(Op.DONE, 2, 5, 1, 0), now=2.0)  # type: ignore[arg-type]
    assert done == Claim(ClaimState.DONE, 2, 2.0)
    assert Claim.decode(done.encode()) == done  # type: ignore[union-attr]
    assert Claim.decode("") == Claim()


def test_bad_claims_are_refused_with_their_reason() -> None:
    held = Claim(ClaimState.CLAIMED, 0, 1.0)
    assert refusal(transition(SHARE, Claim(), claim(0, step=4), 2.0)) is Refusal.STEP_OVER
    assert refusal(transition(SHARE, Claim(), claim(0, step=6), 2.0)) is Refusal.STEP_NOT_OPEN
    assert refusal(transition(SHARE, Claim(), claim(3), 2.0)) is Refusal.OUTSIDE_JOB
    assert refusal(transition(SHARE, Claim(), claim(-1), 2.0)) is Refusal.OUTSIDE_JOB
    assert refusal(transition(SHARE, Claim(), claim(0, owner=7), 2.0)) is Refusal.OUTSIDE_JOB
    assert refusal(transition(SHARE, Claim(), claim(0, owner=2, index=2), 2.0)) is (
        Refusal.NO_SUCH_MICRO_BATCH
    )
    assert refusal(transition(SHARE, held, claim(1), 2.0)) is Refusal.ALREADY_CLAIMED
    done_by_other = ClaimEvent(Op.DONE, 1, 5, 1, 0)
    assert refusal(transition(SHARE, held, done_by_other, 2.0)) is Refusal.NOT_CLAIMER
    assert refusal(transition(SHARE, Claim(), done_by_other, 2.0)) is Refusal.NOT_CLAIMER


def test_help_goes_to_the_rank_with_most_left_from_its_last_micro_batch() -> None:
    assert furthest_behind(SHARE, 0, [4, 1, 0], set()) == 1  # 3 left against 2
    assert furthest_behind(SHARE, 0, [4, 2, 0], set()) == 1  # tie: the lowest rank
    assert furthest_behind(SHARE, 0, [4, 2, 0], {1}) == 2
    assert furthest_behind(SHARE, 0, [4, 4, 2], set()) is None
    assert [stolen_index(4, t) for t in range(5)] == [3, 2, 1, 0, -1]


def test_cut_uses_the_plans_micro_batch_else_chunks() -> None:
    ids = list(range(10))
    assert cut(ids, 4) == [ids[:4], ids[4:8], ids[8:]]
    assert cut(ids, 0, chunks=4) == [ids[:3], ids[3:6], ids[6:9], ids[9:]]
    assert cut([], 0) == []
    assert cut([1], 0, chunks=4) == [[1]]


def test_share_params_default_off() -> None:
    assert ShareParams.from_params({}) == ShareParams(False)
    assert ShareParams.from_params({"work_sharing": "on", "share_chunks": 8}).enabled
    assert not ShareParams.from_params({"work_sharing": False}).enabled
    with pytest.raises(ValueError):
        ShareParams.from_params({"work_sharing": "maybe"})
    with pytest.raises(ValueError):
        ShareParams.from_params({"share_chunks": 0})


def test_share_params_default_off_under_every_policy_and_on_when_asked() -> None:
    assert not ShareParams.from_params({}, "antdt-nd").enabled
    assert ShareParams.from_params({"work_sharing": "on"}, "antdt-nd").enabled
    assert not ShareParams.from_params({"work_sharing": "off"}, "antdt-nd").enabled
    assert not ShareParams.from_params({}, "lb-bsp").enabled
    assert not ShareParams.from_params({}, "antdt-dd").enabled


# -- the claim store on a real TCPStore ------------------------------------------------


def _stores(world: int) -> tuple[object, list[object]]:
    dist = pytest.importorskip("torch.distributed")
    server = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, world + 1, False) for _ in range(world)]
    return server, clients


def test_store_refuses_bad_claims_and_double_claims() -> None:
    from antdt.agent.claimstore import Claimed, StoreClaims

    _server, (s0, s1) = _stores(2)
    ranks = [StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)]
    ranks[0].publish(7, [[1, 2], [3]])
    ranks[1].publish(7, [[4], [5]])
    got = ranks[1].claim(7, 0, 1)
    assert isinstance(got, Claimed) and got.ids == [3]
    assert refusal(ranks[0].claim(7, 0, 1)) is Refusal.ALREADY_CLAIMED  # type: ignore[arg-type]
    assert refusal(ranks[0].claim(7, 5, 0)) is Refusal.OUTSIDE_JOB  # type: ignore[arg-type]
    assert refusal(ranks[0].claim(7, 1, 2)) is Refusal.NO_SUCH_MICRO_BATCH  # type: ignore[arg-type]
    assert refusal(ranks[0].claim(6, 1, 0)) is Refusal.STEP_OVER  # type: ignore[arg-type]
    assert ranks[1].done(got) == Claim(ClaimState.DONE, 1, ranks[1].record(0, 1).at)
    assert ranks[1].record(0, 1).state is ClaimState.DONE
    ranks[0].publish(8, [[9]])
    assert refusal(ranks[0].claim(7, 1, 0)) is Refusal.STEP_OVER  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StoreClaims(s0, 2, 2)


def _work(rank: int, claims: object, slow: float, out: list[tuple[int, int, int]]) -> None:
    from antdt.agent.claimstore import StoreClaims

    assert isinstance(claims, StoreClaims)
    while (held := claims.claim_next()) is not None:
        time.sleep(slow)  # threads in one process: sleeping frees the GIL for the others
        claims.done(held)
        out.append((rank, held.owner, held.index))


def test_ranks_as_threads_claim_every_micro_batch_once_and_help_the_slow_one() -> None:
    from antdt.agent.claimstore import StoreClaims

    world, per_rank = 3, 8
    _server, stores = _stores(world)
    ranks = [StoreClaims(s, r, world) for r, s in enumerate(stores)]
    for step in range(3):
        for r, client in enumerate(ranks):
            client.publish(step, [[r * 100 + step * 10 + i] for i in range(per_rank)])
        out: list[tuple[int, int, int]] = []
        slow = [0.02, 0.001, 0.001]  # rank 0 is slow
        threads = [
            threading.Thread(target=_work, args=(r, ranks[r], slow[r], out)) for r in range(world)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts = Counter((owner, index) for _, owner, index in out)
        assert set(counts) == {(o, i) for o in range(world) for i in range(per_rank)}
        assert max(counts.values()) == 1
        helped = [(r, i) for r, o, i in out if o == 0 and r != 0]
        assert helped, "the fast ranks took none of the slow rank's micro-batches"
        own = sorted(i for r, o, i in out if o == 0 and r == 0)
        assert own == list(range(len(own)))  # the owner kept its order from the front
        assert all(ranks[0].record(o, i).state is ClaimState.DONE for o, i in counts)


def test_a_claim_costs_well_under_a_millisecond_on_loopback() -> None:
    from antdt.agent.claimstore import StoreClaims

    _server, (s0, s1) = _stores(2)
    owner, helper = StoreClaims(s0, 0, 2), StoreClaims(s1, 1, 2)
    n = 400
    owner.publish(0, [[i] for i in range(n)])
    helper.publish(0, [])
    t0 = time.perf_counter()
    for _ in range(n // 2):
        assert owner.claim_next() is not None
    own_s = (time.perf_counter() - t0) / (n // 2)
    t0 = time.perf_counter()
    for _ in range(n // 2):
        assert helper.claim_next() is not None
    steal_s = (time.perf_counter() - t0) / (n // 2)
    assert owner.claim_next() is None and helper.claim_next() is None
    print(f"claim on loopback: own {own_s * 1e6:.0f} us, helping {steal_s * 1e6:.0f} us")
    assert own_s < 1e-3 and steal_s < 1e-3


def test_the_store_keeps_only_the_last_two_steps_keys() -> None:
    from antdt.agent.claimstore import StoreClaims

    server, (s0,) = _stores(1)
    claims = StoreClaims(s0, 0, 1)
    counts = []
    for step in range(8):
        claims.publish(step, [[step * 2], [step * 2 + 1]])
        while (held := claims.claim_next()) is not None:
            claims.done(held)
        counts.append(server.num_keys())  # type: ignore[attr-defined]
    # A step writes over the keys of the step two before: the count stops growing at step 2.
    assert counts[2] == counts[7], counts
