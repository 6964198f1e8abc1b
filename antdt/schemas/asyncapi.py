"""The AsyncAPI 3 document of the contract, made from the channel catalogue (channels.py),
the subject builders and the pydantic models: nothing in it is written by hand. Operations
are seen from the control plane's side: `send` when a service publishes or requests,
`receive` when it subscribes or answers; `x-antdt-from` and `x-antdt-to` name both ends."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from antdt.schemas.base import (
    COMPRESS_OVER_BYTES,
    ENCODING_HEADER,
    GZIP,
    REPLY_HEADER,
    SCHEMA_VERSION,
)
from antdt.schemas.channels import CHANNELS, MESSAGES, PARAMETERS, Channel, Transport
from antdt.schemas.subjects import DEFAULT_SUBJECT_PREFIX, Subjects

ASYNCAPI_VERSION = "3.0.0"
SERVICES = frozenset({"monitor", "controller", "shards"})
COMPONENT_REF = "#/components/schemas/{model}"

DESCRIPTION = """\
The wire contract of AntDT's control plane (monitor, controller, shards services) with
its agents and custom policies. Every subject starts with a configurable prefix
(`ANTDT_NATS__SUBJECT_PREFIX`, default `{prefix}`). Every payload is one JSON object,
closed (unknown fields are refused with `bad_request`), carrying `schema_version`; trace
context travels in the W3C `traceparent` header. Every reply carries the header
`{header}`: the name of its message, or `ErrorReply` for a refusal (`ErrorCode` says
what a client should do about each code). A payload over {compress_over} bytes (a large
job's JobHealth, its figures per rank; a large job's plan, published or requested) is gzipped
and carries `{encoding}: gzip`: inflate it before parsing."""


def component_schemas() -> dict[str, Any]:
    """Every message's JSON Schema and those it refers to, by name, with references as
    `#/components/schemas/<Name>`."""
    inputs = [(name, "validation", _adapter(target)) for name, target in MESSAGES.items()]
    by_key, definitions = TypeAdapter.json_schemas(inputs, ref_template=COMPONENT_REF)  # type: ignore[arg-type]
    schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
    for (name, _), schema in by_key.items():
        if schema.get("$ref") != COMPONENT_REF.format(model=name):
            schemas[name] = schema  # a union: no definition of its own
    return {name: _asyncapi_schema(schema) for name, schema in sorted(schemas.items())}


def asyncapi_document(prefix: str = DEFAULT_SUBJECT_PREFIX) -> dict[str, Any]:
    """The AsyncAPI 3 document of every channel under `prefix`."""
    subjects = Subjects(prefix)
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for channel in CHANNELS:
        channels[channel.id] = _channel(channel, subjects)
        if channel.replies:
            channels[f"{channel.id}_reply"] = _reply_channel(channel)
        operations[channel.id] = _operation(channel)
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "AntDT wire contract",
            "version": f"{SCHEMA_VERSION}.0.0",
            "description": DESCRIPTION.format(
                prefix=prefix,
                header=REPLY_HEADER,
                compress_over=COMPRESS_OVER_BYTES,
                encoding=ENCODING_HEADER,
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "nats": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": "nats-server with JetStream (ANTDT_NATS__URL)",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": _messages(), "schemas": component_schemas()},
    }


def _adapter(target: Any) -> TypeAdapter[Any]:
    return target if isinstance(target, TypeAdapter) else TypeAdapter(target)


def _asyncapi_schema(schema: Any) -> Any:
    """Pydantic's JSON Schema as an AsyncAPI Schema: an OpenAPI-style `discriminator`
    object is dropped (AsyncAPI's is a property name); each variant's `const` says it."""
    if isinstance(schema, dict):
        return {k: _asyncapi_schema(v) for k, v in schema.items() if k != "discriminator"}
    if isinstance(schema, list):
        return [_asyncapi_schema(v) for v in schema]
    return schema


def _message_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/messages/{name}"}


def _channel(channel: Channel, subjects: Subjects) -> dict[str, Any]:
    out: dict[str, Any] = {
        "address": channel.address(subjects),
        "title": channel.id,
        "summary": channel.summary,
        "description": _direction(channel),
        "messages": {channel.message: _message_ref(channel.message)},
        "x-antdt-transport": channel.transport.value,
    }
    if channel.parameters:
        out["parameters"] = {p: {"description": PARAMETERS[p]} for p in channel.parameters}
    if channel.stream:
        out["x-antdt-stream"] = channel.stream
    return out


def _reply_channel(channel: Channel) -> dict[str, Any]:
    return {
        "address": None,
        "title": f"{channel.id} reply",
        "description": f"The requester's reply subject (an inbox). Header `{REPLY_HEADER}` "
        f"names the message: {', '.join(channel.reply_messages())}.",
        "messages": {name: _message_ref(name) for name in channel.reply_messages()},
    }


def _operation(channel: Channel) -> dict[str, Any]:
    served = any(s in SERVICES for s in channel.senders)
    out: dict[str, Any] = {
        "action": "send" if served else "receive",
        "channel": {"$ref": f"#/channels/{channel.id}"},
        "summary": channel.summary,
        "messages": [{"$ref": f"#/channels/{channel.id}/messages/{channel.message}"}],
        "x-antdt-from": list(channel.senders),
        "x-antdt-to": list(channel.receivers),
    }
    if channel.queue:
        out["bindings"] = {"nats": {"queue": channel.queue, "bindingVersion": "0.1.0"}}
    if channel.replies:
        reply_id = f"{channel.id}_reply"
        out["reply"] = {
            "channel": {"$ref": f"#/channels/{reply_id}"},
            "messages": [
                {"$ref": f"#/channels/{reply_id}/messages/{name}"}
                for name in channel.reply_messages()
            ],
        }
    return out


def _direction(channel: Channel) -> str:
    how = {
        Transport.PUBLISH: "core NATS publish (at most once, to whoever subscribes now)",
        Transport.REQUEST: "request/reply: one reply",
        Transport.GATHER: "one request, a reply from every responder",
        Transport.JETSTREAM: f"published into the JetStream stream `{channel.stream}`",
    }[channel.transport]
    text = f"{', '.join(channel.senders)} → {', '.join(channel.receivers)}; {how}."
    if channel.replies:
        text += f" Replies: {', '.join(channel.reply_messages())}."
    if channel.stream and channel.transport is not Transport.JETSTREAM:
        text += f" Recorded in the stream `{channel.stream}` when recording is on."
    if channel.queue:
        text += f" Served by one replica of the queue group `{channel.queue}`."
    return text


def _messages() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, target in MESSAGES.items():
        doc = (getattr(target, "__doc__", None) or "").strip()
        if isinstance(target, TypeAdapter):
            doc = "A controller command: AdjustBatch or KillRestart, by `kind`."
        out[name] = {
            "name": name,
            "title": name,
            "summary": doc.split("\n\n")[0].replace("\n", " "),
            "contentType": "application/json",
            "headers": _headers(name),
            "payload": {"$ref": COMPONENT_REF.format(model=name)},
        }
    return out


def _headers(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            REPLY_HEADER: {
                "type": "string",
                "const": name,
                "description": "On a reply only: the name of the reply's message",
            },
            "traceparent": {"type": "string", "description": "W3C trace context (optional)"},
            ENCODING_HEADER: {
                "type": "string",
                "const": GZIP,
                "description": f"On a payload over {COMPRESS_OVER_BYTES} bytes only: it is "
                "gzipped (RFC 1952); inflate it before parsing",
            },
        },
    }
