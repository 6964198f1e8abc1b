"""AgentSettings from the environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from antdt.agent.settings import AgentSettings, default_host

BASE = {
    "ANTDT_JOB": "job1",
    "ANTDT_DATASET_SIZE": "100",
    "ANTDT_SHARD_SIZE": "10",
    "ANTDT_GLOBAL_BATCH": "8",
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("RANK", "WORLD_SIZE", "ANTDT_RANK", "ANTDT_WORLD_SIZE", "ANTDT_HOST"):
        monkeypatch.delenv(key, raising=False)
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


def test_rank_and_world_from_launcher_env(env: pytest.MonkeyPatch) -> None:
    env.setenv("RANK", "2")
    env.setenv("WORLD_SIZE", "4")
    env.setenv("ANTDT_NATS__URL", "nats://10.0.0.1:4222")
    env.setenv("ANTDT_INJECT", "rank=2,factor=3")
    s = AgentSettings()
    assert (s.rank, s.world_size, s.job, s.nats.url) == (2, 4, "job1", "nats://10.0.0.1:4222")
    assert s.inject == "rank=2,factor=3" and s.prefetch == 2 and s.epochs == 1
    env.setenv("ANTDT_RANK", "3")
    assert AgentSettings().rank == 3  # ANTDT_RANK wins
    assert AgentSettings(rank=1).rank == 1  # and kwargs win over both


def test_spec_and_validation(env: pytest.MonkeyPatch) -> None:
    s = AgentSettings(rank=0, world_size=2, host="slot0", seed=5)
    spec = s.job_spec()
    assert (spec.world_size, spec.dataset_size, spec.shard_size, spec.seed) == (2, 100, 10, 5)
    with pytest.raises(ValidationError, match="outside a job"):
        AgentSettings(rank=2, world_size=2)
    with pytest.raises(ValidationError):
        AgentSettings(rank=0, world_size=1, host="bad.host")


def test_default_host_is_a_token() -> None:
    host = default_host()
    assert host and "." not in host and len(host) <= 128


def test_a_malformed_inject_schedule_fails_at_construction(env: pytest.MonkeyPatch) -> None:
    from antdt.agent import Agent

    with pytest.raises(ValueError, match="factor= is required"):
        Agent(AgentSettings(rank=0, world_size=1, inject="rank=0"))


def test_torchruns_worker_env_gives_the_place_in_the_run(env: pytest.MonkeyPatch) -> None:
    env.delenv("ANTDT_JOB")
    for key, value in {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "5c3a-e1",
    }.items():
        env.setenv(key, value)
    s = AgentSettings()
    assert (s.rank, s.local_rank, s.world_size, s.restart_count) == (3, 1, 4, 2)
    assert (s.job, s.run_id, s.restarts_left) == ("5c3a-e1", "5c3a-e1", 1)
    env.setenv("ANTDT_JOB", "named")
    assert AgentSettings().job == "named"  # ANTDT_JOB wins over the run id


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        (None, "set ANTDT_JOB"),
        ("none", "its default 'none'"),
        ("a.b", "(?i)string should match pattern"),
    ],
    ids=["no-run-id", "torchruns-unnamed-default", "run-id-unfit-for-subjects"],
)
def test_a_job_id_is_required_where_the_run_id_cannot_serve(
    env: pytest.MonkeyPatch, run_id: str | None, says: str
) -> None:
    env.delenv("ANTDT_JOB")
    env.setenv("RANK", "0")
    env.setenv("WORLD_SIZE", "1")
    if run_id is None:
        env.delenv("TORCHELASTIC_RUN_ID", raising=False)
    else:
        env.setenv("TORCHELASTIC_RUN_ID", run_id)
    with pytest.raises(ValidationError, match=says):
        AgentSettings()


def test_a_rank_dumps_its_stacks_on_the_signal_named_and_runs_on(
    env: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    import subprocess
    import sys

    assert AgentSettings(rank=0, world_size=1).stack_dump_signal == "SIGUSR1"
    assert AgentSettings(rank=0, world_size=1, stack_dump_signal="").stack_dump_signal == ""
    for bad in ("SIGTERM", "SIGKILL", "USR1", "SIGNOPE"):
        with pytest.raises(ValidationError, match="not a signal to dump stacks on"):
            AgentSettings(rank=0, world_size=1, stack_dump_signal=bad)
    script = (
        "import os, signal, antdt.agent as a\n"
        "def waiting_here(): os.kill(os.getpid(), signal.SIGUSR1)\n"
        "a._dump_stacks_on('SIGUSR1'); waiting_here(); print('ran on')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ran on\n"
    assert "in waiting_here" in done.stderr and "most recent call first" in done.stderr
