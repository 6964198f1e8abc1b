"""`antdt schemas export`: the JSON Schema of every wire message and stored value, and the
AsyncAPI 3 document of every channel (JSON, and a self-contained HTML page), so that
policies in any language can subscribe, request and validate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from antdt.schemas.asyncapi import asyncapi_document
from antdt.schemas.channels import MESSAGES, STORED
from antdt.schemas.html import render_html
from antdt.schemas.subjects import DEFAULT_SUBJECT_PREFIX

#: file stem → model (or the adapter of a union or an enum)
EXPORTED: dict[str, Any] = {**MESSAGES, **STORED}
ASYNCAPI_JSON = "asyncapi.json"
ASYNCAPI_HTML = "asyncapi.html"


def json_schema(target: Any) -> dict[str, Any]:
    if isinstance(target, type) and issubclass(target, BaseModel):
        return target.model_json_schema()
    return dict(target.json_schema())


def export_schemas(directory: Path, prefix: str = DEFAULT_SUBJECT_PREFIX) -> list[Path]:
    """Write one `<Name>.schema.json` per message and stored value into `directory`, and
    the AsyncAPI document of the subjects under `prefix` beside them (asyncapi.json,
    asyncapi.html); returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, target in EXPORTED.items():
        path = directory / f"{name}.schema.json"
        schema = json_schema(target)
        schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
        schema.setdefault("title", name)
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    document = asyncapi_document(prefix)
    api = directory / ASYNCAPI_JSON
    api.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    page = directory / ASYNCAPI_HTML
    page.write_text(render_html(document), encoding="utf-8")
    return [*written, api, page]
