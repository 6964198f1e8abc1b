"""`antdt shards`: run a Shards replica (no sub-command), or look at and act on a job's
data ledger: `antdt shards status --job J`, `antdt shards release --job J --rank R`."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from antdt.cli.clients import client_settings
from antdt.cli.options import EtcdOpt, JobOpt, MetricsOpt, NatsOpt
from antdt.cli.serve import run_services
from antdt.schemas import ReleaseReply, ShardRelease, ShardStatus, ShardStatusRequest, Subjects
from antdt.schemas.shards import STATUS_LISTED_MAX

shards_app = typer.Typer(help=__doc__)
out = Console()


@shards_app.callback(invoke_without_command=True)
def shards(
    ctx: typer.Context,
    nats_url: NatsOpt = None,
    etcd_endpoint: EtcdOpt = None,
    metrics_port: MetricsOpt = None,
) -> None:
    """Run one Shards replica against the given NATS and etcd (without a sub-command)."""
    if ctx.invoked_subcommand is not None:
        return
    run_services(["shards"], nats_url, etcd_endpoint, metrics_port)


@shards_app.command("status")
def status_command(
    job: JobOpt,
    rank: Annotated[
        list[int] | None,
        typer.Option("--rank", min=0, help="Only this rank's shards (repeat for more)"),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=0, max=STATUS_LISTED_MAX, help="In-flight shards listed at most")
    ] = 200,
    nats_url: NatsOpt = None,
) -> None:
    """Epoch, progress, in-flight shards per rank, checkpoints and incarnation of a job."""
    req = ShardStatusRequest(job=job, ranks=tuple(rank or ()), limit=limit)
    status = asyncio.run(_request(nats_url, job, "status", req, ShardStatus))
    out.print(render_status(status))


@shards_app.command("release")
def release_command(
    job: JobOpt,
    rank: Annotated[int, typer.Option("--rank", min=0, help="The rank to remove")],
    reason: Annotated[str, typer.Option(help="Why (recorded in the logs)")] = "operator",
    incarnation: Annotated[int, typer.Option(help="The job's current incarnation")] = 0,
    nats_url: NatsOpt = None,
) -> None:
    """Remove a dead or drained rank without a rollback: its shards go back from its last
    committed positions, to be granted to the other ranks."""
    req = ShardRelease(job=job, rank=rank, incarnation=incarnation, reason=reason)
    reply = asyncio.run(_request(nats_url, job, "release", req, ReleaseReply))
    out.print(f"rank {reply.rank} removed from {reply.job}: {reply.returned} shards handed back")


async def _request(nats_url: str | None, job: str, verb: str, req: Any, reply_type: Any) -> Any:
    from antdt.runtime.bus import Bus, BusError, RequestRefused

    settings = client_settings(nats_url=nats_url).nats
    try:
        bus = await Bus(settings, name="antdt-cli").connect(retry_for_s=5.0)
    except BusError as exc:
        raise typer.BadParameter(f"cannot reach NATS at {settings.url}: {exc}") from None
    try:
        subject = Subjects(settings.subject_prefix).shards(job, verb)
        return await bus.request(subject, req, reply_type, timeout=5.0)
    except RequestRefused as exc:
        Console(stderr=True).print(f"[red]refused[/] ({exc.reply.code}): {exc.reply.error}")
        raise typer.Exit(1) from None
    except BusError as exc:
        Console(stderr=True).print(f"[red]no answer from the shards service[/]: {exc}")
        raise typer.Exit(1) from None
    finally:
        await bus.close()


def render_status(status: ShardStatus) -> Group:
    """The ledger of one job as a rich renderable (pure: tests render it to text)."""
    done_pct = 100.0 * status.done / status.num_shards if status.num_shards else 0.0
    progress = (
        "complete"
        if status.complete
        else f"{status.done}/{status.num_shards} shards done ({done_pct:.1f}%)"
    )
    head = Text.assemble(
        (f"job {status.job}", "bold"),
        f"  epoch {status.epoch + 1}/{status.epochs}  ",
        (progress, "green"),
        f"  todo {status.todo}  in flight {max(status.in_flight_total, len(status.in_flight))}  "
        f"incarnation {status.incarnation}",
        f"  served by {status.owner}" if status.owner else "",
    )
    per_rank: dict[int, list[str]] = defaultdict(list)
    for entry in status.in_flight:
        per_rank[entry.rank].append(f"{entry.shard}@{entry.position} (a{entry.attempt})")
    shown = len(status.in_flight)
    total = max(status.in_flight_total, shown)  # 0 from a service that did not count
    more = f"; {shown:,} of {total:,} listed (--rank, --limit)" if shown < total else ""
    table = Table(
        "rank",
        "in flight: shard@position (attempt)",
        title=f"in flight per rank (held, or reserved ahead{more})",
    )
    for rank in sorted(per_rank):
        table.add_row(str(rank), ", ".join(per_rank[rank]))
    checkpoints = ", ".join(map(str, status.checkpoints)) or "none"
    lines: list[Text | Table] = [head, table, Text(f"checkpoints (steps): {checkpoints}")]
    if status.pending_checkpoint is not None:
        committed = _ranks_text(status.committed_ranks)
        lines.append(
            Text(f"pending checkpoint at step {status.pending_checkpoint}: committed {committed}")
        )
    if status.left:
        lines.append(Text(f"removed ranks: {', '.join(map(str, status.left))}", "yellow"))
    return Group(*lines)


def _ranks_text(ranks: tuple[int, ...], shown: int = 32) -> str:
    """Ranks as a list, or, for many, how many and the first few."""
    if not ranks:
        return "none"
    if len(ranks) <= shown:
        return ", ".join(map(str, ranks))
    return f"{len(ranks):,} ranks ({', '.join(map(str, ranks[:shown]))}, ...)"
