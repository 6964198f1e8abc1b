"""The bus's message encoding: the bytes model_dump_json would give, for every kind of
field the wire models use (nested models, tuples, enums, floats, None, defaults)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from antdt.runtime.bus.messages import decode_reply, encode
from antdt.schemas import (
    ErrorReply,
    FetchStatus,
    Plan,
    ShardFetch,
    ShardGrant,
    ShardRef,
    ShardReply,
    StepEvent,
    replaced,
    trusted,
)

MODELS: list[BaseModel] = [
    ShardFetch(job="j", rank=3, epoch=1, done=(ShardRef(epoch=1, shard=7, attempt=2),), held=()),
    ShardFetch(job="j", rank=0, epoch=0),  # held None, defaults
    ShardReply(
        job="j",
        epoch=0,
        status=FetchStatus.OK,
        route="r1",
        grants=(ShardGrant(epoch=0, shard=7, attempt=0, start=70, end=80, position=3),),
    ),
    Plan(job="j", version=2, local_batch=(4, 4, 2), effective_step=10, created_at=1.5e9),
    StepEvent(
        job="j",
        rank=1,
        host="h1",
        step=5,
        epoch=0,
        plan_version=0,
        local_batch=8,
        samples=8,
        compute_s=0.125,
        data_wait_s=1e-4,
        comm_s=0.0,
        step_s=0.1251,
        started_at=1.7e9,
        ended_at=1.7e9 + 0.1251,
    ),
    ErrorReply(error="no such job", code="unknown_job"),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_encode_gives_model_dump_json_as_bytes(model: BaseModel) -> None:
    assert encode(model) == model.model_dump_json().encode()


def test_a_reply_encoded_decodes_to_itself() -> None:
    reply = MODELS[2]
    assert isinstance(reply, ShardReply)
    assert decode_reply(encode(reply), ShardReply) == reply


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_replaced_is_model_copy_with_an_update(model: BaseModel) -> None:
    """The shards hot path's copy gives what pydantic's model_copy(update=) gives: the
    same fields, the same fields-set, the same bytes; the original is left as it was."""
    name = "job" if "job" in type(model).model_fields else "error"
    before = encode(model)
    ours, theirs = replaced(model, {name: "other"}), model.model_copy(update={name: "other"})
    assert getattr(ours, name) == "other" and ours == theirs
    assert ours.model_fields_set == theirs.model_fields_set
    assert encode(ours) == encode(theirs)
    assert hash(ours) == hash(theirs)  # frozen: hashable like any copy
    assert encode(model) == before  # the original is untouched


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_trusted_builds_what_validation_builds(model: BaseModel) -> None:
    """The shards hot path's unvalidated construction gives the validated model: the same
    fields in the same order, fields-set, bytes, hash and repr."""
    given = {name: getattr(model, name) for name in model.model_fields_set}
    ours = trusted(type(model), given)
    assert ours == model and repr(ours) == repr(model)
    assert ours.model_fields_set == model.model_fields_set
    assert encode(ours) == encode(model)
    assert hash(ours) == hash(model)


def test_trusted_refuses_unknown_and_missing_fields_and_shared_defaults() -> None:
    from antdt.services.shards.state import InFlightEntry, LedgerState

    entry = trusted(InFlightEntry, {"shard": 1, "rank": 2, "attempt": 0, "position": 5})
    assert entry == InFlightEntry(shard=1, rank=2, attempt=0, position=5)
    with pytest.raises(TypeError, match="unknown or missing"):
        trusted(ShardRef, {"epoch": 0, "shard": 1})  # attempt missing
    with pytest.raises(TypeError, match="unknown or missing"):
        trusted(ShardRef, {"epoch": 0, "shard": 1, "attempt": 0, "atempt": 1})
    with pytest.raises(TypeError, match="default factory"):
        trusted(LedgerState, {})  # its in-flight default would be one shared table


def test_messages_carrying_a_plan_are_accepted_up_to_max_plan_bytes() -> None:
    """A batch per rank (and micro-batch, accumulation): Plan, AdjustBatch (also through
    the command union the agents decode with), ActionRecord and ActionProposal take up to
    MAX_PLAN_BYTES; JobHealth its own; every other message MAX_MESSAGE_BYTES."""
    from antdt.runtime.bus.messages import Decoder
    from antdt.schemas import (
        COMMAND_ADAPTER,
        MAX_HEALTH_BYTES,
        MAX_MESSAGE_BYTES,
        MAX_PLAN_BYTES,
        ActionProposal,
        ActionRecord,
        AdjustBatch,
        JobHealth,
        KillRestart,
        Plan,
        StepEvent,
    )

    limits = {
        name: Decoder(target).max_bytes  # type: ignore[arg-type]
        for name, target in (
            ("Plan", Plan),
            ("AdjustBatch", AdjustBatch),
            ("Command", COMMAND_ADAPTER),
            ("ActionRecord", ActionRecord),
            ("ActionProposal", ActionProposal),
            ("JobHealth", JobHealth),
            ("KillRestart", KillRestart),
            ("StepEvent", StepEvent),
        )
    }
    assert limits == {
        "Plan": MAX_PLAN_BYTES,
        "AdjustBatch": MAX_PLAN_BYTES,
        "Command": MAX_PLAN_BYTES,
        "ActionRecord": MAX_PLAN_BYTES,
        "ActionProposal": MAX_PLAN_BYTES,
        "JobHealth": MAX_HEALTH_BYTES,
        "KillRestart": MAX_MESSAGE_BYTES,
        "StepEvent": MAX_MESSAGE_BYTES,
    }
    assert MAX_PLAN_BYTES == 8 * 1024 * 1024
