"""Every message of the contract, decoded where a service decodes it (`Bus` subscriptions,
the same path JetStream consumers take) from arbitrary bytes and from mutations of a valid
message: the handler gets a valid model, or the bus refuses it with a typed rejection that
is counted and logged. Replies (`decode_reply`) give the reply, RequestRefused or BusError.
ANTDT_FUZZ_INPUTS sets the inputs per decoder and strategy (`make chaos`: 100,000)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter
from structlog.testing import capture_logs

from antdt.runtime.bus import Bus, BusError, Decoder, Delivery, RequestRefused, decode_reply
from antdt.runtime.config import NatsSettings
from antdt.schemas import ENCODING_HEADER, GZIP, REPLY_HEADER, ErrorCode
from antdt.schemas.channels import MESSAGES
from tests.unit.fuzzing import FUZZ, INPUTS, RAW, batches, corpus, mutations, seed

#: Seeds the schema alone cannot make valid (a union's tag).
OVERRIDES = {"Command": {"kind": "adjust_batch"}}
#: Reply types the services answer requests with (every one a model).
REPLIES = [m for n, m in MESSAGES.items() if not isinstance(m, TypeAdapter) and n != "ErrorReply"]


def run_now(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never waits (the handler below returns at once)."""
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("the dispatch waited on something")


class Boundary:
    """One subscription's way in (Bus._dispatch over the message's Decoder), and what came
    out of it: models handed to the handler, rejections counted by the bus."""

    def __init__(self, name: str) -> None:
        self.target = MESSAGES[name]
        self.bus = Bus(NatsSettings(), name="fuzz")
        self.decoder: Decoder[Any] = Decoder(self.target)
        self.pattern = f"fuzz.{name}"
        self.accepted = 0
        self.sent = 0

    async def handler(self, model: Any, delivery: Delivery) -> None:
        adapter = self.target if isinstance(self.target, TypeAdapter) else None
        assert adapter is not None or isinstance(model, self.target)
        self.accepted += 1

    def feed(self, data: bytes, headers: dict[str, str] | None = None) -> None:
        msg = SimpleNamespace(subject=self.pattern, data=data, headers=headers, reply="")
        run_now(self.bus._dispatch(self.pattern, self.decoder, self.handler, None, msg))
        self.sent += 1
        assert self.bus.handler_errors == 0, "an exception escaped the decoder"
        assert self.accepted + self.bus.rejections.total(self.pattern) == self.sent

    def assert_logged(self, logs: list[dict[str, Any]]) -> None:
        """Each (subscription, code) counted was logged with its reason."""
        logged = {e["code"] for e in logs if e["event"] == "message rejected"}
        assert {code for (_, code) in self.bus.rejections.counts} <= logged


def fuzz(name: str, strategy: st.SearchStrategy[bytes]) -> Boundary:
    boundary = Boundary(name)
    with capture_logs() as logs:

        @FUZZ
        @given(batches(strategy))
        def feed(inputs: list[bytes]) -> None:
            for data in inputs:
                boundary.feed(data)

        feed()
    boundary.assert_logged(logs)
    assert boundary.sent >= INPUTS
    return boundary


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_arbitrary_bytes_are_refused_counted_and_logged(name: str) -> None:
    boundary = fuzz(name, RAW)
    assert boundary.bus.rejections.total() > 0


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_mutated_messages_are_decoded_or_refused_counted_and_logged(name: str) -> None:
    valid = seed(MESSAGES[name], OVERRIDES.get(name))
    boundary = fuzz(name, mutations(valid))
    assert boundary.bus.rejections.total() > 0
    # Oversized messages are refused before they are parsed, with their own code.
    boundary.feed(b" " * (boundary.decoder.max_bytes + 1))
    assert boundary.bus.rejections.counts[(boundary.pattern, ErrorCode.TOO_LARGE)] >= 1


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_gzipped_payloads_are_inflated_within_their_limit_or_refused(name: str) -> None:
    boundary = Boundary(name)
    valid = json.dumps(seed(MESSAGES[name], OVERRIDES.get(name))).encode()
    with capture_logs() as logs:
        boundary.feed(gzip.compress(valid), {ENCODING_HEADER: GZIP})
        assert boundary.accepted == 1
        refused = {
            ErrorCode.BAD_REQUEST: [
                (valid, {ENCODING_HEADER: GZIP}),  # not gzipped
                (gzip.compress(valid)[:-9], {ENCODING_HEADER: GZIP}),  # truncated
                (gzip.compress(valid) + b"x", {ENCODING_HEADER: GZIP}),  # trailing bytes
                (gzip.compress(valid), {ENCODING_HEADER: "br"}),  # an encoding not ours
            ],
            # a small payload inflating past the limit (a bomb) is cut off there
            ErrorCode.TOO_LARGE: [
                (gzip.compress(b" " * (boundary.decoder.max_bytes + 1)), {ENCODING_HEADER: GZIP})
            ],
        }
        for code, cases in refused.items():
            for data, headers in cases:
                boundary.feed(data, headers)
            assert boundary.bus.rejections.counts[(boundary.pattern, code)] == len(cases)
    assert boundary.accepted == 1
    boundary.assert_logged(logs)


HEADERS = st.one_of(
    st.none(),
    st.sampled_from([*(m.__name__ for m in REPLIES), "ErrorReply", "", "Nope"]).map(
        lambda marker: {REPLY_HEADER: marker}
    ),
)


@pytest.mark.parametrize("reply_type", REPLIES, ids=lambda m: m.__name__)
def test_replies_decode_to_their_type_or_a_typed_error(reply_type: Any) -> None:
    valid = seed(reply_type)

    @FUZZ
    @given(batches(st.one_of(RAW, mutations(valid))), HEADERS, st.booleans())
    def decode(inputs: list[bytes], headers: dict[str, str] | None, strict: bool) -> None:
        for data in inputs:
            try:
                reply = decode_reply(data, reply_type, headers, require_type=strict)
            except (RequestRefused, BusError):
                continue
            assert isinstance(reply, reply_type)

    decode()


@pytest.mark.parametrize("path", corpus(), ids=lambda p: p.name)
def test_past_crashes_are_refused_by_every_decoder(path: Path) -> None:
    data = path.read_bytes()
    for name in MESSAGES:
        Boundary(name).feed(data)
    for reply_type in REPLIES:
        for headers in (None, {REPLY_HEADER: reply_type.__name__}):
            with pytest.raises(BusError):
                decode_reply(data, reply_type, headers)
