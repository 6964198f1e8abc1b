"""The `antdt` command: `app` (typer) and `main`, its console-script entry point."""

from antdt.cli.app import app, main

__all__ = ["app", "main"]
