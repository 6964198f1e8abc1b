"""The AsyncAPI document as one self-contained HTML page (no script, no network): the
channels with their direction, replies and streams, then every schema's fields."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from antdt.schemas.errors import ErrorCode

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222}
table{border-collapse:collapse;width:100%;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}code{background:#f6f6f6;padding:0 .2em}
h2{border-bottom:2px solid #444;margin-top:2em}h3{margin-bottom:.2em}
.desc{white-space:pre-wrap}.muted{color:#666}
"""


def render_html(document: dict[str, Any]) -> str:
    """The page for `document` (what `asyncapi_document` returns)."""
    info = document["info"]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(info['title'])}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(info['title'])} <small class=muted>{escape(info['version'])}</small></h1>",
        f"<p class=desc>{_text(info['description'])}</p>",
        f"<p class=muted>AsyncAPI {escape(document['asyncapi'])}, made by "
        "<code>antdt schemas export</code> from the code.</p>",
        _channels(document),
        _error_codes(),
        "<h2>Messages and schemas</h2>",
        *(_schema(name, s) for name, s in document["components"]["schemas"].items()),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _text(value: str) -> str:
    """Escaped text with `code` spans."""
    pieces = escape(value).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


def _link(name: str) -> str:
    return f'<a href="#schema-{escape(name)}">{escape(name)}</a>'


def _channels(document: dict[str, Any]) -> str:
    rows = []
    for op_id, op in document["operations"].items():
        channel = document["channels"][op_id]
        replies = [
            ref["$ref"].rsplit("/", 1)[-1] for ref in op.get("reply", {}).get("messages", [])
        ]
        queue = op.get("bindings", {}).get("nats", {}).get("queue", "")
        rows.append(
            "<tr>"
            f"<td><code>{escape(channel['address'])}</code></td>"
            f"<td>{escape(channel['x-antdt-transport'])}</td>"
            f"<td>{escape(', '.join(op['x-antdt-from']))} → "
            f"{escape(', '.join(op['x-antdt-to']))}</td>"
            f"<td>{', '.join(_link(m) for m in channel['messages'])}</td>"
            f"<td>{', '.join(_link(r) for r in replies)}</td>"
            f"<td>{escape(channel.get('x-antdt-stream', ''))}</td>"
            f"<td>{escape(queue)}</td>"
            f"<td>{_text(channel['summary'])}</td></tr>"
        )
    head = (
        "<tr><th>subject</th><th>transport</th><th>from → to</th><th>message</th>"
        "<th>replies</th><th>stream</th><th>queue group</th><th>what</th></tr>"
    )
    return f"<h2>Channels</h2><table>{head}{''.join(rows)}</table>"


def _error_codes() -> str:
    rows = "".join(
        f"<tr><td><code>{code.value}</code></td><td>{code.action.value}</td>"
        f"<td>{_text(code.description)}</td></tr>"
        for code in ErrorCode
    )
    head = "<tr><th>code</th><th>client action</th><th>when</th></tr>"
    return f"<h2>Error codes</h2><table>{head}{rows}</table>"


def _schema(name: str, schema: dict[str, Any]) -> str:
    out = [f'<h3 id="schema-{escape(name)}">{escape(name)}</h3>']
    if schema.get("description"):
        out.append(f"<p class=desc>{_text(schema['description'])}</p>")
    if "enum" in schema:
        values = ", ".join(f"<code>{escape(str(v))}</code>" for v in schema["enum"])
        out.append(f"<p>One of: {values}</p>")
    if "oneOf" in schema:
        out.append("<p>One of: " + ", ".join(_type(s) for s in schema["oneOf"]) + "</p>")
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", ()))
        rows = "".join(
            f"<tr><td><code>{escape(field)}</code></td><td>{_type(spec)}</td>"
            f"<td>{'yes' if field in required else _default(spec)}</td>"
            f"<td>{_text(spec.get('description', ''))}</td></tr>"
            for field, spec in properties.items()
        )
        head = "<tr><th>field</th><th>type</th><th>required</th><th>description</th></tr>"
        out.append(f"<table>{head}{rows}</table>")
    return "\n".join(out)


def _default(spec: dict[str, Any]) -> str:
    if "default" not in spec:
        return "no"
    return f"no (default <code>{escape(json.dumps(spec['default']))}</code>)"


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        return _link(spec["$ref"].rsplit("/", 1)[-1])
    if "const" in spec:
        return f"<code>{escape(json.dumps(spec['const']))}</code>"
    for union in ("anyOf", "oneOf"):
        if union in spec:
            return " | ".join(_type(s) for s in spec[union])
    kind = spec.get("type", "any")
    if kind == "array":
        item = _type(spec.get("items", {}))
        return f"({item})[]" if " | " in item else f"{item}[]"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map of {_type(spec['additionalProperties'])}"
    return escape(str(kind))
