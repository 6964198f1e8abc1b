"""`antdt schemas`: the wire contract."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

schemas_app = typer.Typer(no_args_is_help=True, help="The wire contract.")
PrefixOpt = Annotated[
    str | None,
    typer.Option(
        "--prefix",
        envvar="ANTDT_NATS__SUBJECT_PREFIX",
        help="Subject prefix the AsyncAPI document's addresses use (default antdt.v1)",
    ),
]


@schemas_app.command("export")
def schemas_export(directory: Path, prefix: PrefixOpt = None) -> None:
    """Write into DIRECTORY the JSON Schema of every wire message, and the AsyncAPI 3
    document of every subject (asyncapi.json, and asyncapi.html to read)."""
    from antdt.schemas import DEFAULT_SUBJECT_PREFIX
    from antdt.schemas.export import export_schemas

    console = Console(stderr=True)
    for path in export_schemas(directory, prefix or DEFAULT_SUBJECT_PREFIX):
        console.print(f"wrote {path}")
