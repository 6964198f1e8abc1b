"""Export JSON Schema for every wire message, so policies in any language can subscribe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from antdt import schemas

#: file stem → model (or the adapter of a union or an enum)
EXPORTED: dict[str, Any] = {
    "StepEvent": schemas.StepEvent,
    "RankHello": schemas.RankHello,
    "RankExit": schemas.RankExit,
    "JobHealth": schemas.JobHealth,
    "Incident": schemas.Incident,
    "JobSpec": schemas.JobSpec,
    "Plan": schemas.Plan,
    "RestartLedger": schemas.RestartLedger,
    "BlocklistEntry": schemas.BlocklistEntry,
    "PlanRequest": schemas.PlanRequest,
    "RegisterReply": schemas.RegisterReply,
    "Command": schemas.COMMAND_ADAPTER,
    "Ack": schemas.Ack,
    "ActionRecord": schemas.ActionRecord,
    "ActionProposal": schemas.ActionProposal,
    "ErrorReply": schemas.ErrorReply,
    "ErrorCode": TypeAdapter(schemas.ErrorCode),
    "ShardFetch": schemas.ShardFetch,
    "ShardReply": schemas.ShardReply,
    "ShardStatusRequest": schemas.ShardStatusRequest,
    "ShardStatus": schemas.ShardStatus,
    "CheckpointCompleted": schemas.CheckpointCompleted,
    "EpochFinished": schemas.EpochFinished,
    "ShardsReturned": schemas.ShardsReturned,
}


def json_schema(target: Any) -> dict[str, Any]:
    if isinstance(target, type) and issubclass(target, BaseModel):
        return target.model_json_schema()
    return dict(target.json_schema())


def export_schemas(directory: Path) -> list[Path]:
    """Write one `<Name>.schema.json` per message into `directory`; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, target in EXPORTED.items():
        path = directory / f"{name}.schema.json"
        schema = json_schema(target)
        schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
        schema.setdefault("title", name)
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
