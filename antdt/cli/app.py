"""The `antdt` command."""

from __future__ import annotations

import typer

from antdt.cli import local, serve, sim, views
from antdt.cli.actions import actions
from antdt.cli.blocklist import blocklist_app
from antdt.cli.jobs import jobs_app
from antdt.cli.schemas import schemas_app
from antdt.cli.shards import shards_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.command()(actions)
app.command()(serve.monitor)
app.command()(serve.controller)
app.command()(serve.services)
app.command()(serve.up)
app.command(context_settings=local.LAUNCH_CONTEXT)(local.launch)
app.command()(local.demo)
app.command()(views.status)
app.command()(views.report)
app.command()(sim.sim)
app.add_typer(schemas_app, name="schemas")
app.add_typer(shards_app, name="shards")
app.add_typer(blocklist_app, name="blocklist")
app.add_typer(jobs_app, name="jobs")


def main() -> None:
    app(prog_name="antdt")
