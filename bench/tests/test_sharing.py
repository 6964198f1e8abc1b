"""The work-sharing bench: its burst schedule and figures from made-up runs, and one
case for real (4 gloo ranks under torchrun in CPU budgets, a busy-loop neighbour)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from antdt.runtime.cpubudget import CpuLimit, detect
from antdt.runtime.servers import EmbeddedCluster
from bench.sharing import SHORT, bench_sharing, computes, save_sharing_chart
from bench.sharing_figures import (
    Comparison,
    RunFigures,
    bursts,
    persistent,
    rows,
    run_figures,
    slowed,
    transient_ceiling,
)


def test_bursts_are_seeded_cover_about_the_fraction_and_leave_calm_between() -> None:
    first = bursts(3, world=4, first=10, last=90)
    assert first == bursts(3, world=4, first=10, last=90)
    assert first != bursts(4, world=4, first=10, last=90)
    covered = sum(b.steps for b in first)
    assert 12 <= covered <= 16  # 20% of 80 steps, the last burst maybe cut short
    assert all(b.start >= 10 and b.start + b.steps <= 90 and 0 <= b.rank < 4 for b in first)
    for a, b in itertools.pairwise(first):
        assert b.start - (a.start + a.steps) >= 2
    assert all(len(slowed(first, step)) <= 1 for step in range(100))


def test_persistent_slows_one_rank_over_the_whole_span() -> None:
    schedule = persistent(3, 10, 40)
    assert slowed(schedule, 9) == set() and slowed(schedule, 10) == {3}
    assert slowed(schedule, 39) == {3} and slowed(schedule, 40) == set()


def test_run_figures_count_samples_after_the_warmup() -> None:
    progress = [{"step": s, "t": 100.0 + 0.5 * s, "samples": 64} for s in range(20)]
    got = run_figures("x", progress, 5, 20)
    assert got.throughput == pytest.approx(64 * 15 / 7.5)
    assert got.step_s == pytest.approx(0.5) and got.steps == 15
    with pytest.raises(RuntimeError, match="lacks steps"):
        run_figures("x", progress[:10], 5, 20)


def test_the_ceiling_of_a_slowed_fraction() -> None:
    assert transient_ceiling(0, 80, 4, 3) == pytest.approx(1.0)
    # every step slowed: `none` runs at 1/3, sharing at 3.33/4 of the healthy speed
    assert transient_ceiling(80, 80, 4, 3) == pytest.approx(3 / (4 / (3 + 1 / 3)))


def test_the_ceiling_of_offers_one_step_late() -> None:
    from bench.sharing_figures import one_step_late_ceiling

    # one burst of one step: nothing is shared in time, the ceiling is 1
    assert one_step_late_ceiling(1, 1, 80, 4, 3) == pytest.approx(1.0)
    # the bench's schedule: 16 slowed steps in 4 bursts, of 80
    late, full = one_step_late_ceiling(16, 4, 80, 4, 3), transient_ceiling(16, 80, 4, 3)
    assert late == pytest.approx((64 + 48) / (64 + 12 + 12 * 1.2)) and late < full


def _runs(**throughput: float) -> dict[str, RunFigures]:
    return {
        k.replace("_", "-").replace("-sharing", "+sharing"): RunFigures(k, v, 0.1, 50)
        for k, v in throughput.items()
    }


def _cases(
    transient: dict[str, RunFigures], persistent: float, healthy: float
) -> dict[str, Comparison]:
    """The three cases: `transient`'s runs; the persistent and healthy cases' sharing
    runs at these throughputs, against lb-bsp at 200 and none at 300."""
    return {
        "transient": Comparison("transient", transient),
        "persistent": Comparison("persistent", _runs(lb_bsp=200.0, antdt_nd_sharing=persistent)),
        "healthy": Comparison("healthy", _runs(none=300.0, none_sharing=healthy)),
    }


def test_rows_pair_each_sharing_run_with_its_baseline() -> None:
    transient = _runs(none=100.0, lb_bsp=105.0, antdt_nd_sharing=130.0)
    made = rows(_cases(transient, 210.0, 297.0), world=4, factor=3, slowed=10)
    assert [round(r["ratio"], 3) for r in made] == [1.3, 1.238, 1.05, 0.99]
    assert [r["target"] for r in made] == [
        "ratio >= 1.25",
        "ratio >= 1.2",
        "ratio >= 1.0",
        "ratio >= 0.98 (cost <= 2%)",
    ]
    assert made[0]["ceiling"] == pytest.approx(transient_ceiling(10, 50, 4, 3))
    assert not any("failed" in r for r in made)


def test_a_row_below_its_target_is_marked_failed() -> None:
    transient = _runs(none=100.0, lb_bsp=95.0, antdt_nd_sharing=119.0)
    made = rows(_cases(transient, 199.0, 294.0), world=4, factor=3, slowed=10)
    assert [r.get("failed") for r in made] == [
        "work sharing, transient 3x bursts: 1.190x none < 1.25x",
        None,  # 1.253x lb-bsp
        "work sharing, persistent 3x straggler: 0.995x lb-bsp < 1.0x",
        None,  # 0.98x none: the healthy target's edge still passes
    ]


@pytest.mark.integration
async def test_the_persistent_case_runs_for_real(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    if detect()[0] is CpuLimit.AFFINITY:
        pytest.skip("no writable cgroup for the ranks' CPU budgets")
    got = await bench_sharing(cluster, SHORT, tmp_path, only=("persistent",))
    runs = got["persistent"].runs
    assert set(runs) == {"lb-bsp", "antdt-nd+sharing"}
    assert all(r.throughput > 0 and r.steps == SHORT.steps - SHORT.warmup for r in runs.values())
    # every rank logged its forward/backward seconds of every step: the ceiling's input
    logged = computes(tmp_path / "persistent" / "lb-bsp" / "0")
    assert set(range(SHORT.steps)) <= set(logged)  # (a run may take a step more)
    assert all(len(seconds) == 4 and min(seconds) > 0 for seconds in logged.values())
    assert all(r.ideal_throughput and r.ideal_throughput > 0 for r in runs.values())
    assert save_sharing_chart(got, tmp_path / "sharing.png").stat().st_size > 0


def test_repeats_count_by_their_median() -> None:
    from bench.sharing_figures import median_runs

    runs = [RunFigures("a", t, 0.1 * i, 50) for i, t in enumerate((100.0, 130.0, 90.0))]
    got = median_runs("a", runs)
    assert (got.throughput, got.step_s) == (100.0, pytest.approx(0.1))
    assert median_runs("a", runs[:2]).throughput == 115.0
    with pytest.raises(ValueError):
        median_runs("a", [])


def test_a_step_spread_perfectly_saves_its_slowest_compute_over_the_water_level() -> None:
    from bench.sharing_figures import spread_saving

    # one rank of four 3x slow: the water level is 4 / (3 + 1/3) = 1.2 of a share
    assert spread_saving([1.0, 1.0, 1.0, 3.0]) == pytest.approx(3.0 - 1.2)
    assert spread_saving([1.0, 1.0]) == 0.0
    assert spread_saving([2.0]) == 0.0 and spread_saving([]) == 0.0  # not every rank


def test_the_ideal_throughput_keeps_what_is_not_compute_as_measured() -> None:
    """Step 6 took 3.5 s: its slowed rank's 3 s of compute, and 0.5 s of all-reduce that
    the noisy neighbour slowed too; spread perfectly, 1.2 + 0.5."""
    progress = [{"step": s, "t": 100.0 + s, "samples": 64} for s in range(6)]
    progress.append({"step": 6, "t": 108.5, "samples": 64})
    computes = {s: [0.8] * 4 for s in range(1, 6)} | {6: [1.0, 1.0, 1.0, 3.0]}
    got = run_figures("none", progress, 1, 7, computes)
    assert got.throughput == pytest.approx(6 * 64 / 8.5)
    assert got.ideal_throughput == pytest.approx(6 * 64 / (5 + 1.7))
    assert got.ideal_late_throughput == got.ideal_throughput  # no step only late offers reach
    # step 6 a burst's first: offers decided on the step before cannot share it
    late = run_figures("none", progress, 1, 7, computes, frozenset({6}))
    assert late.ideal_late_throughput == pytest.approx(late.throughput)
    assert late.ideal_throughput == got.ideal_throughput
    assert run_figures("none", progress, 1, 7).ideal_throughput is None


def test_the_transient_ceiling_is_nones_measured_ideal_over_each_baseline() -> None:
    runs = _runs(none=100.0, lb_bsp=110.0, antdt_nd_sharing=115.0)
    runs["none"] = RunFigures("none", 100.0, 0.1, 50, 121.0, ideal_late_throughput=115.5)
    made = rows(_cases(runs, 210.0, 297.0), world=4, factor=3, slowed=10)
    assert [round(r["ceiling"], 3) for r in made[:2]] == [1.21, 1.1]
    assert [round(r["ceiling_late"], 3) for r in made[:2]] == [1.155, 1.05]
    assert made[0]["ceiling_compute_only"] == pytest.approx(transient_ceiling(10, 50, 4, 3))
