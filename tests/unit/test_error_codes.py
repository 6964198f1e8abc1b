"""ErrorCode: the closed set of refusal codes, on the wire as the strings they always were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from antdt.runtime.bus.messages import BusError, Rejected, RequestRefused, decode_reply, encode
from antdt.schemas import ErrorCode, ErrorReply, ShardReply
from antdt.schemas.export import export_schemas

#: Literal: other-language policies and older agents read these strings.
WIRE_CODES = [
    "bad_request",
    "too_large",
    "internal",
    "unknown_job",
    "unknown_rank",
    "unknown_checkpoint",
    "unavailable",
    "busy",
    "stale",
    "fenced",
    "removed",
    "incarnation",
    "not_read",
    "guardrail",
    "no_change",
    "hold",
    "bad_ack",
    "bad_reply",
    "slow_consumer",
    "job_ended",
    "blocklisted",
    "node_taken",
]


def test_codes_are_the_wire_strings() -> None:
    assert [code.value for code in ErrorCode] == WIRE_CODES


@pytest.mark.parametrize("text", WIRE_CODES)
def test_a_code_encodes_and_decodes_as_its_string(text: str) -> None:
    reply = ErrorReply(error="why", code=ErrorCode(text))
    assert encode(reply) == b'{"schema_version":1,"error":"why","code":"%s"}' % text.encode()
    with pytest.raises(RequestRefused) as refused:
        decode_reply(encode(reply), ShardReply)
    assert refused.value.reply.code is ErrorCode(text) and refused.value.reply.code == text


def test_a_code_prints_as_its_string_and_says_when_it_applies() -> None:
    code = ErrorCode.STALE
    assert (str(code), f"{code}", f"{code:>6}") == ("stale", "stale", " stale")
    assert all(c.description and len(c.description) < 200 for c in ErrorCode)


def test_an_unknown_code_is_refused_by_producers_and_consumers() -> None:
    with pytest.raises(ValueError):
        Rejected("no_such_code", "a typo")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ErrorReply(error="x", code="no_such_code")  # type: ignore[arg-type]
    with pytest.raises(BusError) as bad:  # a bad reply, never a pydantic error
        decode_reply(b'{"error": "x", "code": "no_such_code"}', ShardReply)
    assert not isinstance(bad.value, RequestRefused) and "code" in str(bad.value)


def test_the_exported_schema_lists_every_code(tmp_path: Path) -> None:
    export_schemas(tmp_path)
    alone = json.loads((tmp_path / "ErrorCode.schema.json").read_text())
    reply = json.loads((tmp_path / "ErrorReply.schema.json").read_text())
    assert alone["enum"] == WIRE_CODES and alone["type"] == "string"
    assert reply["$defs"]["ErrorCode"]["enum"] == WIRE_CODES
    assert reply["properties"]["code"]["$ref"] == "#/$defs/ErrorCode"
    for code in map(ErrorCode, WIRE_CODES):  # each with what a client should do about it
        assert f"`{code}` ({code.action.value}): {code.description}" in alone["description"]
        assert alone["x-client-action"][code.value] == code.action.value
