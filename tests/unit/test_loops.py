"""Which event loop a process runs on (runtime/loops.py): uvloop where installed, chosen
by the settings' event_loop, with a clear error when uvloop is required and missing."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from antdt.agent.loopthread import LoopThread
from antdt.agent.settings import AgentSettings
from antdt.runtime import loops
from antdt.runtime.config import ServiceSettings

pytestmark = pytest.mark.skipif(
    not loops.uvloop_available(), reason="uvloop is not installed on this platform"
)


async def _kind() -> str:
    await asyncio.sleep(0)
    return loops.running_kind()


@pytest.mark.parametrize(
    ("kind", "expected"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")]
)
def test_run_uses_the_chosen_loop(kind: loops.LoopKind, expected: str) -> None:
    assert loops.run(_kind(), kind) == expected


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loops, "uvloop_available", lambda: False)
    assert loops.resolve("auto") == "asyncio"
    assert loops.run(_kind(), "auto") == "asyncio"
    with pytest.raises(RuntimeError, match=r"uvloop is not installed.*ANTDT_EVENT_LOOP"):
        loops.resolve("uvloop")


def test_the_agent_thread_runs_on_its_settings_loop() -> None:
    for kind, expected in (("auto", "uvloop"), ("asyncio", "asyncio")):
        thread = LoopThread("test-loop", kind).start()  # type: ignore[arg-type]
        try:
            assert thread.run(_kind(), timeout=5) == expected
        finally:
            thread.stop()


def test_event_loop_comes_from_the_environment_and_is_validated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = {
        "job": "j",
        "rank": 0,
        "world_size": 1,
        "dataset_size": 10,
        "shard_size": 5,
        "global_batch": 2,
    }
    assert AgentSettings(**base).event_loop == "asyncio"  # the training process's own
    assert ServiceSettings().event_loop == "auto"
    monkeypatch.setenv("ANTDT_EVENT_LOOP", "uvloop")
    assert AgentSettings(**base).event_loop == "uvloop"
    assert ServiceSettings().event_loop == "uvloop"
    monkeypatch.setenv("ANTDT_EVENT_LOOP", "trio")
    with pytest.raises(ValidationError, match="event_loop"):
        ServiceSettings()
