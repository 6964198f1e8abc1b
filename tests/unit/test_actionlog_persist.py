"""ActionLog keeps publishing a record while its ack does not come or its stream does not
answer (a replicated stream electing a leader), with the same Nats-Msg-Id, and gives up
at once on other errors."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from antdt.runtime.bus import StreamUnanswered
from antdt.schemas import ActionRecord, ActionResult, Subjects
from antdt.services.controller import actionlog
from antdt.services.controller.actionlog import ActionLog


class Stream:
    """The stream's side of publish: raises the queued errors first, then acks."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.tries: list[str | None] = []

    async def publish(self, subject: str, model: Any, *, msg_id: str | None = None) -> int:
        self.tries.append(msg_id)
        if self.errors:
            raise self.errors.pop(0)
        return len(self.tries)


class Owned:
    def owns(self, job: str) -> bool:
        return True


class BusWith:
    def __init__(self, stream: Stream) -> None:
        self.jetstream = stream


def record() -> ActionRecord:
    return ActionRecord(
        action_id="j-plan-1",
        job="j",
        kind="adjust_batch",
        policy="antdt-nd",
        result=ActionResult.APPLIED,
        reason="test",
        local_batch=(2, 2),
        effective_step=10,
        decided_at=1.0,
        completed_at=2.0,
    )


@pytest.fixture(autouse=True)
def quick_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actionlog, "RETRY_PAUSE_S", 0.001)
    monkeypatch.setattr(actionlog, "RETRY_PAUSE_MAX_S", 0.002)


def log_of(stream: Stream) -> ActionLog:
    return ActionLog(BusWith(stream), Subjects("antdt"), Owned())  # type: ignore[arg-type]


async def test_a_record_whose_ack_times_out_is_published_again_with_its_msg_id() -> None:
    stream = Stream(TimeoutError("nats: timeout"), TimeoutError("nats: timeout"))
    with capture_logs() as logs:
        await log_of(stream).record(record())
    assert stream.tries == ["j-plan-1"] * 3
    assert not [e for e in logs if e["event"] == "action record not persisted"]


async def test_a_stream_without_a_leader_is_published_to_again() -> None:
    stream = Stream(StreamUnanswered("ACTIONS did not answer"))
    with capture_logs() as logs:
        await log_of(stream).record(record())
    assert stream.tries == ["j-plan-1"] * 2
    assert not [e for e in logs if e["event"] == "action record not persisted"]


async def test_a_refusal_is_not_tried_again() -> None:
    stream = Stream(RuntimeError("stream missing"))
    with capture_logs() as logs:
        await log_of(stream).record(record())
    assert stream.tries == ["j-plan-1"]
    lost = [e for e in logs if e["event"] == "action record not persisted"]
    assert [(e["tries"], e["error"]) for e in lost] == [(1, "stream missing")]


async def test_timeouts_past_the_deadline_give_up_and_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(actionlog, "PERSIST_FOR_S", 0.05)
    stream = Stream(*[TimeoutError("nats: timeout")] * 1000)
    with capture_logs() as logs:
        await log_of(stream).record(record())
    assert 2 <= len(stream.tries) < 1000
    lost = [e for e in logs if e["event"] == "action record not persisted"]
    assert [e["tries"] for e in lost] == [len(stream.tries)]


async def test_the_log_line_lists_a_small_plan_and_sums_up_a_large_one() -> None:
    large = record().model_copy(update={"local_batch": (4,) * 9_999 + (1,)})
    with capture_logs() as logs:
        await log_of(Stream()).record(record())
        await log_of(Stream()).record(large)
    lines = [e["local_batch"] for e in logs if e["event"] == "action"]
    assert lines == [(2, 2), {"ranks": 10_000, "min": 1, "max": 4, "sum": 39_997}]
