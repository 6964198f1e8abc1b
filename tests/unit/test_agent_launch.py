"""antdt.agent.launch: rank environment, failure propagation, signal forwarding."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from antdt.agent.launch import Run, Slots, exit_code, launch, rank_env
from tests.helpers import wait_for_sync

KEYS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ANTDT_HOST",
    "ANTDT_RANK",
    "EXTRA",
]

# A rank that records its pid, then exits with its code or (code -1) waits to be killed.
# A failing rank first waits (polling) until every rank has recorded its pid.
RANK_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
rank, world = os.environ["RANK"], int(os.environ["WORLD_SIZE"])
Path(sys.argv[1], rank + ".tmp").write_text(str(os.getpid()))
os.rename(Path(sys.argv[1], rank + ".tmp"), Path(sys.argv[1], rank))
code = int(sys.argv[2 + int(rank)])
if code >= 0:
    while not all(Path(sys.argv[1], str(r)).exists() for r in range(world)):
        time.sleep(0.01)
    sys.exit(code)
signal.pause()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_every_rank_gets_its_environment(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ANTDT_RANK", "7")  # must not outrank the launcher's RANK
    script = (
        f"import os, json; open({str(tmp_path)!r} + '/' + os.environ['RANK'], 'w')"
        f".write(json.dumps({{k: os.environ.get(k) for k in {KEYS!r}}}))"
    )
    code = launch(3, [sys.executable, "-c", script], env={"EXTRA": "x"}, host_prefix="node")
    assert code == 0
    seen = [json.loads((tmp_path / str(r)).read_text()) for r in range(3)]
    for rank, env in enumerate(seen):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert (env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("3", "127.0.0.1")
        assert env["ANTDT_HOST"] == f"node{rank}" and env["EXTRA"] == "x"
        assert env["ANTDT_RANK"] is None
    assert len({env["MASTER_PORT"] for env in seen}) == 1


def test_a_failing_rank_stops_the_others(tmp_path: Path) -> None:
    codes = ["-1", "3", "-1"]  # rank 1 fails, ranks 0 and 2 wait forever
    code = launch(3, [sys.executable, "-c", RANK_SCRIPT, str(tmp_path), *codes])
    assert code == 3
    pids = [int((tmp_path / str(r)).read_text()) for r in range(3)]
    assert not any(_alive(pid) for pid in pids)


def test_sigterm_is_forwarded_to_every_rank(tmp_path: Path) -> None:
    launcher = (
        "import sys; from antdt.agent.launch import launch; "
        f"sys.exit(launch(2, [sys.executable, '-c', {RANK_SCRIPT!r}, {str(tmp_path)!r}, "
        "'-1', '-1']))"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=Path(__file__).parents[2])
    try:
        wait_for_sync(
            lambda: all((tmp_path / str(r)).exists() for r in range(2)), what="ranks started"
        )
        pids = [int((tmp_path / str(r)).read_text()) for r in range(2)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
        assert not any(_alive(pid) for pid in pids)
    finally:
        proc.kill()
        proc.wait()


def test_rank_env_and_exit_codes() -> None:
    base = {"ANTDT_WORLD_SIZE": "9", "ANTDT_RESTART_COUNT": "5", "PATH": "/bin"}
    env = rank_env(base, 1, 2, Run("r1", 2, 3, 1234), "slot1")
    assert env["ANTDT_HOST"] == "slot1" and env["MASTER_PORT"] == "1234"
    assert "ANTDT_WORLD_SIZE" not in env and "ANTDT_RESTART_COUNT" not in env
    assert env["PATH"] == "/bin"
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert (env["TORCHELASTIC_RUN_ID"], env["GROUP_RANK"], env["ROLE_RANK"]) == ("r1", "0", "1")
    assert env["LOCAL_WORLD_SIZE"] == env["WORLD_SIZE"] == "2"
    assert exit_code(-9) == 137 and exit_code(2) == 2


# Run 0: every rank records its host; rank 1 asks the launcher to avoid its host and all
# exit with the restart code. Run 1 records the hosts again and ends.
RESTART_SCRIPT = """
import json, os, sys
from pathlib import Path
out, rank = Path(sys.argv[1]), os.environ["RANK"]
run = os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"run{run}-rank{rank}").write_text(os.environ["ANTDT_HOST"])
if run == "0":
    if rank == "1":
        Path(os.environ["ANTDT_LAUNCH_DIR"], "restart-1.json").write_text(
            json.dumps({"avoid_hosts": [os.environ["ANTDT_HOST"]]}))
    sys.exit(75)
"""


def test_a_requested_restart_moves_the_rank_off_the_avoided_host(tmp_path: Path) -> None:
    code = launch(3, [sys.executable, "-c", RESTART_SCRIPT, str(tmp_path)], spare_slots=1)
    assert code == 0
    hosts = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert [hosts[f"run0-rank{r}"] for r in range(3)] == ["slot0", "slot1", "slot2"]
    assert [hosts[f"run1-rank{r}"] for r in range(3)] == ["slot0", "slot3", "slot2"]


def test_failures_are_restarted_up_to_the_limit(tmp_path: Path) -> None:
    script = "import os, sys; sys.exit(0 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '2' else 4)"
    assert launch(2, [sys.executable, "-c", script], max_restarts=2) == 0
    assert launch(2, [sys.executable, "-c", script], max_restarts=1) == 4


def test_slots_move_only_avoided_hosts_and_never_back() -> None:
    slots = Slots(4, spare=2)
    assert slots.avoid(["slot3"]) == ["rank 3: slot3 -> slot4"]
    assert slots.avoid(["slot4"]) == ["rank 3: slot4 -> slot5"]
    assert slots.avoid(["slot5"]) == []  # no spare left: the rank stays
    assert slots.hosts == ["slot0", "slot1", "slot2", "slot5"]


def test_ranks_are_pinned_to_the_cores_given(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    script = (
        f"import os; open({str(tmp_path)!r} + '/' + os.environ['RANK'], 'w')"
        ".write(repr(sorted(os.sched_getaffinity(0))))"
    )
    assert launch(3, [sys.executable, "-c", script], cores=cores[:2]) == 0
    pinned = [(tmp_path / str(rank)).read_text() for rank in range(3)]
    # rank r on the (r mod n)-th core given
    assert pinned == [repr([cores[0]]), repr([cores[1 % len(cores)]]), repr([cores[0]])]
    assert launch(1, [sys.executable, "-c", script]) == 0
    assert (tmp_path / "0").read_text() == repr(cores)  # unpinned: every core


def test_a_core_this_process_may_not_use_is_refused() -> None:
    with pytest.raises(ValueError, match="cores"):
        launch(1, [sys.executable, "-c", "pass"], cores=[max(os.sched_getaffinity(0)) + 1])


def test_under_single_node_torchrun_each_restart_meets_under_its_own_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun's agent store outlives restarts: keys a dead group left must not be read."""
    from datetime import timedelta

    import torch.distributed as dist

    from antdt.agent.group import _agent_store
    from antdt.runtime.servers import free_port

    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert _agent_store(timedelta(seconds=5)) is None  # not torchrun: env:// as before
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert _agent_store(timedelta(seconds=5)) is None  # nodes count restarts apart
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    store = _agent_store(timedelta(seconds=5))
    store.set("k", "v")
    assert dist.PrefixStore("antdt/restart2", master).get("k") == b"v"
    assert not master.check(["k"])  # not where an unprefixed group would look


def test_cores_take_the_cpuset_list_syntax_and_refuse_the_rest() -> None:
    import typer

    from antdt.cli.local import core_list

    assert core_list("0-3,8") == [0, 1, 2, 3, 8]
    assert core_list("0,1") == [0, 1] and core_list("") == []
    for bad in ("a", "3-1", "1-", "-2", "0-x", "\u00b2", "0-999999999"):
        with pytest.raises(typer.BadParameter, match="--cores"):
            core_list(bad)
