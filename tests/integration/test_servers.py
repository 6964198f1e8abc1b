"""Embedded servers and `antdt up`: ready, stoppable, and never leaving orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from antdt.runtime.servers import EmbeddedCluster
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().split(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        children = {pid for pid, ppid in parents.items() if ppid in frontier}
        frontier = children - found
        found |= children
    return found


def test_servers_die_when_their_parent_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from antdt.runtime.servers import EmbeddedCluster
        c = EmbeddedCluster(root=Path({str(tmp_path)!r})).start()
        print(c.nats.pid, c.etcd.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    parent.kill()  # -9: no cleanup code runs in the parent
    parent.wait()
    wait_for_sync(lambda: not any(_alive(p) for p in pids), timeout=10, what="servers gone")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_antdt_up_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    env = dict(os.environ, ANTDT_TELEMETRY__LOG_FORMAT="json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "antdt.cli", "up", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    assert lines[0].startswith("ANTDT_NATS__URL=nats://127.0.0.1:"), lines
    assert lines[1].startswith("ANTDT_ETCD__ENDPOINT=127.0.0.1:"), lines
    children = _descendants(proc.pid)
    assert len(children) >= 2  # nats-server and etcd
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 0
    wait_for_sync(lambda: not any(_alive(p) for p in children), timeout=10, what="no process left")


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = (item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        return {k.decode(): v.decode() for k, v in pairs}


def test_go_servers_get_half_the_cpus_unless_told(cluster: EmbeddedCluster) -> None:
    from antdt.runtime.servers import go_server_env

    half = str(max(1, len(os.sched_getaffinity(0)) // 2))
    for pid in (cluster.nats.pid, cluster.etcd.pid):
        assert pid is not None
        assert _environ(pid)["GOMAXPROCS"] == os.environ.get("GOMAXPROCS", half)
    assert go_server_env({})["GOMAXPROCS"] == half
    assert go_server_env({"GOMAXPROCS": "7", "X": "y"}) == {"GOMAXPROCS": "7", "X": "y"}


def test_nats_server_buffers_256_mib_for_a_connection_before_closing_it(
    cluster: EmbeddedCluster,
) -> None:
    """A monitor far behind on a burst of step events was closed at nats-server's 64 MiB
    default ("Slow Consumer Detected: MaxPending ... Exceeded") and lost what was in
    flight; the embedded server, as deploy/nats.conf, allows 256 MiB. Its /varz says."""
    from antdt.runtime.servers import MAX_PENDING_BYTES

    varz_url = f"http://{cluster.nats.host}:{cluster.nats.monitor_port}/varz"
    with urllib.request.urlopen(varz_url) as response:
        varz = json.load(response)
    assert varz["max_pending"] == MAX_PENDING_BYTES == 256 * 2**20
    assert varz["jetstream"]["config"]["store_dir"].endswith("jetstream")  # flags still apply


def _start_up(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "antdt.cli", "up", "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, ANTDT_TELEMETRY__LOG_FORMAT="json"),
        start_new_session=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip().removeprefix("ANTDT_NATS__URL=")
    assert proc.stdout.readline().startswith("ANTDT_ETCD__ENDPOINT="), url
    return proc, url


def _env_file(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.removeprefix("export ").split("=", 1) for line in lines)


async def test_antdt_up_runs_a_user_per_role_and_writes_how_to_connect(tmp_path: Path) -> None:
    """`antdt up` has authentication on by default: the services run as their users
    (they started: the ready lines came), nobody connects without a user, each role's
    env file connects as it, an agent's names its job, and a restart on the same
    directory keeps every password (etcd's auth, on since the first start, too)."""
    from antdt.runtime.bus import Bus, BusError
    from antdt.runtime.config import NatsSettings

    proc, url = _start_up(tmp_path, "--job", "j1")
    try:
        env = {p.stem: _env_file(p) for p in (tmp_path / "auth" / "env").glob("*.env")}
        roles = ["monitor", "controller", "shards", "observer", "policy", "operator"]
        assert set(env) == {*roles, "agent-j1"}
        assert env["agent-j1"]["ANTDT_JOB"] == "j1" and "ANTDT_ETCD__USER" in env["shards"]
        assert oct((tmp_path / "auth" / "credentials.json").stat().st_mode)[-3:] == "600"
        with pytest.raises(BusError, match="authorization violation"):
            await Bus(NatsSettings(url=url), name="anyone").connect(retry_for_s=2)
        for user in ("observer", "agent-j1"):
            mine = env[user]
            assert mine["ANTDT_NATS__URL"] == url
            settings = NatsSettings(
                url=url, user=mine["ANTDT_NATS__USER"], password=mine["ANTDT_NATS__PASSWORD"]
            )
            bus = await Bus(settings, name=user).connect(retry_for_s=3)
            await bus.close()
        kept = (tmp_path / "auth" / "credentials.json").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    again, _url = _start_up(tmp_path, "--job", "j1")
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=30) == 0
    assert (tmp_path / "auth" / "credentials.json").read_text() == kept
