"""The read commands (`status`, `report`, `actions`) on bad input and on a nats-server
without JetStream: a clear error and a non-zero exit, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from typer.testing import CliRunner

from antdt.cli.app import app
from antdt.runtime.servers.embedded import find_nats_server, free_port

pytestmark = pytest.mark.integration

READS = (["status", "--once"], ["report"], ["actions"])


@pytest.fixture(autouse=True)
def _logging_kept() -> Iterator[None]:
    """The commands point structlog at the runner's stderr, closed after each invoke:
    the next tests would log into a closed file."""
    kept = structlog.get_config()
    yield
    structlog.configure(**kept)


@pytest.fixture(scope="module")
def no_jetstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server of its own, JetStream off (as a user's own server may run)."""
    port = free_port()
    log = tmp_path_factory.mktemp("nats-nojs") / "nats.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [find_nats_server(), "-a", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(5)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("command", READS, ids=lambda c: c[0])
@pytest.mark.parametrize("job", ["a b", "a.b", "*", ""])
def test_a_job_id_the_wire_refuses_is_a_usage_error(command: list[str], job: str) -> None:
    result = CliRunner().invoke(app, [*command, "--job", job, "--nats-url", "nats://127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "letters, digits" in result.output and result.exception is not None
    assert not isinstance(result.exception, (ValueError, RuntimeError)), result.exception


@pytest.mark.parametrize("command", READS, ids=lambda c: c[0])
def test_a_server_without_jetstream_is_said_not_a_traceback(
    no_jetstream: str, command: list[str], tmp_path: Path
) -> None:
    out = ["--out", str(tmp_path)] if command == ["report"] else []
    result = CliRunner().invoke(app, [*command, *out, "--job", "j1", "--nats-url", no_jetstream])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "not readable" in result.output
