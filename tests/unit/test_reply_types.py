"""Typed replies: every reply says in its Antdt-Reply header which message it is, and the
bus's reply decoding goes by it (by the payload's fields only for a service older than
the header, and not at all when the header is required)."""

from __future__ import annotations

import pytest

from antdt.runtime.bus.messages import (
    BusError,
    RequestRefused,
    decode_reply,
    encode,
    reply_headers,
)
from antdt.schemas import REPLY_HEADER, ErrorCode, ErrorReply, Plan, ShardReply

PLAN = Plan(job="j", version=2, local_batch=(3, 5), effective_step=4, created_at=1.0)
REFUSAL = ErrorReply(error="nope", code=ErrorCode.JOB_ENDED)


def test_a_reply_names_its_type_and_keeps_the_request_trace_context() -> None:
    request = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert reply_headers(request, PLAN) == {**request, REPLY_HEADER: "Plan"}
    assert reply_headers(None, REFUSAL) == {REPLY_HEADER: "ErrorReply"}


def test_the_header_says_which_of_the_two_a_reply_is() -> None:
    assert decode_reply(encode(PLAN), Plan, {REPLY_HEADER: "Plan"}) == PLAN
    with pytest.raises(RequestRefused) as refused:
        decode_reply(encode(REFUSAL), Plan, {REPLY_HEADER: "ErrorReply"}, require_type=True)
    assert refused.value.reply == REFUSAL and refused.value.reply.code.action == "give_up"


def test_a_reply_of_another_type_or_not_what_its_header_says_is_a_bad_reply() -> None:
    with pytest.raises(BusError, match="reply of type 'Plan', expected ShardReply"):
        decode_reply(encode(PLAN), ShardReply, {REPLY_HEADER: "Plan"})
    with pytest.raises(BusError, match="bad reply") as bad:
        decode_reply(encode(REFUSAL), Plan, {REPLY_HEADER: "Plan"})
    assert not isinstance(bad.value, RequestRefused)
    with pytest.raises(BusError, match="bad error reply"):
        decode_reply(encode(PLAN), Plan, {REPLY_HEADER: "ErrorReply"})


def test_without_the_header_the_fields_tell_unless_the_header_is_required() -> None:
    assert decode_reply(encode(PLAN), Plan) == PLAN  # an older service
    with pytest.raises(RequestRefused):
        decode_reply(encode(REFUSAL), Plan, {})
    with pytest.raises(BusError, match="without its Antdt-Reply header"):
        decode_reply(encode(PLAN), Plan, {"traceparent": "x"}, require_type=True)
