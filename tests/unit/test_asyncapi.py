"""The AsyncAPI document against the code it is made from: one channel per subject builder,
every subject the code builds is a channel of it, no subject is made by hand, and every
message of the contract (the six checkpoint ones included) is in it and in the export."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from antdt.observe.recorder import HEALTH_STREAM, STEP_STREAM
from antdt.schemas import SCHEMA_VERSION, ErrorCode, Subjects
from antdt.schemas.asyncapi import asyncapi_document
from antdt.schemas.channels import (
    CHANNELS,
    CONTROLLER_QUEUE,
    MESSAGES,
    SHARDS_QUEUE,
    Transport,
    builders,
)
from antdt.schemas.export import ASYNCAPI_HTML, ASYNCAPI_JSON, export_schemas
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.service import QUEUE_GROUP as CONTROLLER_GROUP
from antdt.services.shards.service import QUEUE_GROUP as SHARDS_GROUP

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "antdt"
#: Expressions a Subjects object goes by in the code.
RECEIVER = re.compile(r"(^|\.)_?subjects$|^s$|^Subjects\(.*\)$")
#: Methods of the bus that take a subject, and the position of the subject argument.
BUS_CALLS = {
    "subscribe": 0,
    "publish": 0,
    "publish_raw": 0,
    "request": 0,
    "request_bytes": 0,
    "request_raw": 0,
    "durable": 1,
    "read": 1,
    "last": 1,
}
CHECKPOINTING = {"ShardCommit", "CommitReply", "ShardRestore", "RestoreReply"}
CHECKPOINTING |= {"ShardRelease", "ReleaseReply"}
WILD = "\0"  # a token the code fills in at run time


def product_files() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PRODUCT.rglob("*.py")):
        if "schemas" not in path.relative_to(PRODUCT).parts:
            yield path, ast.parse(path.read_text(), str(path))


def channel_tokens(prefix: str) -> dict[str, list[str]]:
    subjects = Subjects(prefix)
    return {
        c.id: [WILD if re.fullmatch(r"\{\w+\}", t) else t for t in _tokens(c.address(subjects))]
        for c in CHANNELS
    }


def _tokens(subject: str) -> list[str]:
    # "{job}" parameters hold no dot; neither does a wildcard
    return subject.split(".")


def _fits(call: list[str], channel: list[str]) -> bool:
    return len(call) == len(channel) and all(
        a == b or WILD in (a, b) or a in ("*", ">") for a, b in zip(call, channel, strict=True)
    )


def builder_call_tokens(call: ast.Call, prefix: str) -> list[str]:
    """The subject a builder call makes, arguments unknown until run time as WILD."""
    method = call.func.attr  # type: ignore[attr-defined]
    if method == "any_job":
        (tail,) = call.args
        if isinstance(tail, ast.Constant):
            text = str(tail.value)
        else:
            assert isinstance(tail, ast.JoinedStr), ast.unparse(call)
            text = "".join(
                str(v.value) if isinstance(v, ast.Constant) else WILD for v in tail.values
            )
        return [*_tokens(prefix), "*", *text.split(".")]
    args = [
        str(a.value) if isinstance(a, ast.Constant) and a.value != "*" else WILD for a in call.args
    ]
    return _tokens(getattr(Subjects(prefix), method)(*args))


def builder_calls() -> Iterator[tuple[str, ast.Call]]:
    known = builders() | {"any_job"}
    for path, tree in product_files():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in known
                and RECEIVER.search(ast.unparse(node.func.value))
            ):
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def test_every_subject_builder_makes_a_channel_and_every_channel_a_builder() -> None:
    made = {c.builder for c in CHANNELS}
    assert builders() == made, "a Subjects method without a channel (or the reverse)"
    assert len({c.id for c in CHANNELS}) == len(CHANNELS)
    document = asyncapi_document("antdt.v1")
    for channel in CHANNELS:
        assert document["channels"][channel.id]["address"] == channel.address(Subjects())
        assert document["operations"][channel.id]["x-antdt-from"] == list(channel.senders)
        assert (channel.transport is Transport.REQUEST) <= bool(channel.replies)


def test_every_subject_the_code_builds_is_a_channel() -> None:
    prefix = "antdt.v1"
    channels = channel_tokens(prefix)
    seen = 0
    for where, call in builder_calls():
        tokens = builder_call_tokens(call, prefix)
        assert any(_fits(tokens, c) for c in channels.values()), (where, ast.unparse(call))
        seen += 1
    assert seen > 40  # the scan does find the code's subjects


def test_no_subject_is_made_by_hand() -> None:
    """Subjects come from the builders: no bus call takes a string it formats itself, and
    no string anywhere starts with a subject prefix of its own."""
    for path, tree in product_files():
        if path.is_relative_to(PRODUCT / "runtime" / "bus"):
            continue  # the seam itself: its inboxes are NATS's own subjects
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                index = BUS_CALLS.get(node.func.attr)
                if index is not None and len(node.args) > index:
                    subject = node.args[index]
                    assert not isinstance(subject, ast.JoinedStr | ast.BinOp), where
                    assert not isinstance(subject, ast.Constant), where
            if isinstance(node, ast.JoinedStr) and len(node.values) > 2:  # f"{prefix}.{job}"
                first, dot, job = node.values[:3]
                made = (
                    isinstance(first, ast.FormattedValue)
                    and "prefix" in ast.unparse(first.value)
                    and isinstance(dot, ast.Constant)
                    and dot.value == "."
                    and isinstance(job, ast.FormattedValue)
                )
                assert not made, (where, ast.unparse(node))


def test_streams_and_queue_groups_are_the_services_own() -> None:
    streams = {c.id: c.stream for c in CHANNELS}
    assert streams["step"] == STEP_STREAM and streams["health"] == HEALTH_STREAM
    assert (CONTROLLER_QUEUE, SHARDS_QUEUE) == (CONTROLLER_GROUP, SHARDS_GROUP)


def test_every_message_and_reply_is_in_the_document_with_its_schema() -> None:
    document = asyncapi_document()
    messages, schemas = document["components"]["messages"], document["components"]["schemas"]
    assert set(messages) == set(MESSAGES) and set(messages) >= CHECKPOINTING
    for name, message in messages.items():
        assert message["payload"] == {"$ref": f"#/components/schemas/{name}"}
        assert message["headers"]["properties"]["Antdt-Reply"]["const"] == name
        assert name in schemas
    replies = {c.id: c.reply_messages() for c in CHANNELS}
    assert replies["proposal"] == ("ActionRecord", "ErrorReply")
    assert replies["spec_get"] == ("SpecReply", "ErrorReply")
    assert replies["shards_commit"] == ("CommitReply", "ErrorReply")
    for channel in CHANNELS:
        operation = document["operations"][channel.id]
        if channel.replies:
            got = [m["$ref"].rsplit("/", 1)[-1] for m in operation["reply"]["messages"]]
            assert got == list(channel.reply_messages())
        else:
            assert "reply" not in operation
    refs = re.findall(r'"\$ref": "#/components/schemas/(\w+)"', json.dumps(document))
    assert set(refs) <= set(schemas)  # every reference resolves
    assert "$defs" not in json.dumps(schemas) and '"discriminator"' not in json.dumps(schemas)


def test_every_field_of_every_schema_is_described() -> None:
    schemas = asyncapi_document()["components"]["schemas"]
    for name, schema in schemas.items():
        for field, spec in schema.get("properties", {}).items():
            assert spec.get("description"), f"{name}.{field}"


def test_the_guardrail_settings_are_the_controllers(tmp_path: Path) -> None:
    from antdt.schemas import GuardrailSettings

    assert set(GuardrailSettings.model_fields) - {"schema_version"} == set(
        Guardrails.__dataclass_fields__
    )


def test_the_export_writes_the_document_and_its_page_beside_the_schemas(tmp_path: Path) -> None:
    paths = export_schemas(tmp_path, "acme.prod")
    names = {p.name for p in paths}
    assert {f"{m}.schema.json" for m in MESSAGES} | {ASYNCAPI_JSON, ASYNCAPI_HTML} <= names
    document = json.loads((tmp_path / ASYNCAPI_JSON).read_text())
    assert document["asyncapi"] == "3.0.0" and document["info"]["version"].startswith(
        str(SCHEMA_VERSION)
    )
    assert document["channels"]["spec_get"]["address"] == "acme.prod.{job}.spec.get"
    page = (tmp_path / ASYNCAPI_HTML).read_text()
    assert "<script" not in page and "http" not in page.replace("https://json-schema", "")
    for channel in CHANNELS:
        assert f"<code>{channel.address(Subjects('acme.prod'))}</code>" in page
    for code in ErrorCode:
        assert f"<td><code>{code.value}</code></td><td>{code.action.value}</td>" in page
    commit = json.loads((tmp_path / "ShardCommit.schema.json").read_text())
    assert commit["title"] == "ShardCommit" and "positions" in commit["properties"]


@pytest.mark.parametrize("name", sorted(CHECKPOINTING))
def test_a_checkpointing_message_is_exported(tmp_path: Path, name: str) -> None:
    export_schemas(tmp_path)
    assert json.loads((tmp_path / f"{name}.schema.json").read_text())["title"] == name


def test_the_contract_doc_lists_every_subject_code_and_default() -> None:
    doc = (ROOT / "docs" / "contract.md").read_text()
    for channel in CHANNELS:
        assert f"`{channel.address(Subjects('{p}'))}`" in doc, channel.id
    for code in ErrorCode:
        assert f"| `{code.value}` | {code.action.value} |" in doc, code
    for name, default in vars(Guardrails()).items():
        assert f"| `{name}` | {default} |" in doc, name
