"""`antdt schemas`: the wire contract."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

schemas_app = typer.Typer(no_args_is_help=True, help="The wire contract.")


@schemas_app.command("export")
def schemas_export(directory: Path) -> None:
    """Write the JSON Schema of every wire message into DIRECTORY."""
    from antdt.schemas.export import export_schemas

    console = Console(stderr=True)
    for path in export_schemas(directory):
        console.print(f"wrote {path}")
