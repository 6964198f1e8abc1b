"""`make gpu-check`'s pure parts, on every machine: the refusal where there is no CUDA
device, and the figures drawn from a run's per-step progress."""

from __future__ import annotations

import pytest

from bench.gpu_check import figures, main, no_cuda_reason


def test_without_cuda_the_check_says_why_in_one_line() -> None:
    assert no_cuda_reason(None) == "no CUDA device: torch is not installed"
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert no_cuda_reason(torch) is None
        return
    reason = no_cuda_reason(torch)
    assert reason is not None and "\n" not in reason
    assert reason.startswith(f"no CUDA device: torch {torch.__version__} sees none")


def test_the_check_fails_where_no_cuda_device_is_present(capsys: pytest.CaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is not what runs here")
    assert main(["--skip-tests"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpu-check: no CUDA device") and "\n" not in err


def test_figures_are_timed_between_step_ends_past_the_warm_up() -> None:
    # 5 warm-up steps 1 s apart, then 10 steps 0.1 s apart of 1000 samples each, one
    # of them 0.3 s (the p95)
    times, t = [], 0.0
    for step in range(15):
        t += 1.0 if step < 5 else (0.3 if step == 12 else 0.1)
        times.append({"step": step, "t": t, "samples": 1000})
    got = figures(list(reversed(times)), warmup=5)
    assert got["steps"] == 15
    assert got["steps_per_s"] == pytest.approx(9 / 1.1)
    assert got["samples_per_s"] == pytest.approx(9000 / 1.1)
    assert got["step_ms_mean"] == pytest.approx(1100 / 9)
    assert got["step_ms_p50"] == pytest.approx(100)
    assert got["step_ms_p95"] == pytest.approx(300)
    with pytest.raises(ValueError, match="too few"):
        figures(times[:7], warmup=5)
