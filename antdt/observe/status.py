"""`antdt status`, the pure part: a state object fed by JobHealth, incidents, actions and
the plan, and `render(state, now)` -> a rich renderable (a test renders it into a
Console(record=True) and reads the text)."""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from antdt.schemas import (
    ActionRecord,
    ActionResult,
    Incident,
    IncidentState,
    JobHealth,
    Plan,
    RankColumns,
    RankHealth,
    RankState,
)

SPARK = "▁▂▃▄▅▆▇█"
STATE_STYLE = {
    "ok": "green",
    "slow": "bold red",
    "leader": "cyan",
    "stalled": "bold magenta",
    "exited": "dim",
    "restarting": "yellow",
}
#: Rank rows a frame shows at most: a larger job's frame shows those not OK first, then
#: the slowest, and counts the rest (10,000 rows a second scroll past unread).
RANK_ROWS = 40
#: Ranks whose planned batches the plan line lists; a larger plan gives their range.
PLAN_BATCHES = 64


@dataclass
class StatusState:
    """What `antdt status` knows of one job; every `apply_*` ignores other jobs and
    anything older than what it holds, so replayed and live messages mix safely."""

    job: str
    recent: int = 8
    rank_rows: int = RANK_ROWS
    health: JobHealth | None = None
    plan: Plan | None = None
    incidents: dict[str, Incident] = field(default_factory=dict)
    actions: dict[str, ActionRecord] = field(default_factory=dict)
    efficiency: deque[float] = field(default_factory=lambda: deque(maxlen=40))
    notes: list[str] = field(default_factory=list)

    def apply_health(self, health: JobHealth) -> None:
        if health.job != self.job or (self.health and health.at < self.health.at):
            return
        self.health = health
        if health.ranks:
            self.efficiency.append(health.balance_efficiency)

    def apply_incident(self, incident: Incident) -> None:
        held = self.incidents.get(incident.id)
        if incident.job == self.job and (held is None or incident.updated_at >= held.updated_at):
            self.incidents[incident.id] = incident

    def apply_action(self, action: ActionRecord) -> None:
        if action.job == self.job:
            self.actions[action.action_id] = action

    def apply_plan(self, plan: Plan) -> None:
        if plan.job == self.job and (self.plan is None or plan.version >= self.plan.version):
            self.plan = plan

    def open_incidents(self) -> list[Incident]:
        open_ = [i for i in self.incidents.values() if i.state != IncidentState.RESOLVED]
        return sorted(open_, key=lambda i: (i.rank, i.opened_at))

    def recent_actions(self) -> list[ActionRecord]:
        return sorted(self.actions.values(), key=lambda a: a.decided_at)[-self.recent :]

    def rank_class(self, rank: int) -> str:
        """The straggler class of the rank's newest open incident, or of the one still
        open when its rank exited (a finished job shows what it ended with); '' if none."""
        mine = [
            i
            for i in self.incidents.values()
            if i.rank == rank and (i.state != IncidentState.RESOLVED or i.evidence.get("exited"))
        ]
        if not mine:
            return ""
        newest = max(mine, key=lambda i: i.updated_at)
        return f"{newest.kind.value}/{newest.straggler_class.value}"


def sparkline(values: list[float], lo: float = 0.0, hi: float = 1.0) -> str:
    span = hi - lo or 1.0
    top = len(SPARK) - 1
    return "".join(SPARK[min(top, max(0, round((v - lo) / span * top)))] for v in values)


def _age(now: float, t: float) -> str:
    return f"{max(0.0, now - t):.1f}s ago"


def render(state: StatusState, now: float) -> RenderableType:
    parts: list[RenderableType] = [_header(state, now), _ranks(state), _plan(state)]
    parts += [_incidents(state), _actions(state, now)]
    parts += [Text(n, style="yellow") for n in state.notes]
    return Group(*parts)


def _header(state: StatusState, now: float) -> RenderableType:
    h = state.health
    if h is None:
        body = Text("no JobHealth yet (is the monitor running, is the job training?)")
    else:
        eff_style = "green" if h.balance_efficiency >= 0.8 else "yellow"
        if h.balance_efficiency < 0.6:
            eff_style = "bold red"
        body = Text.assemble(
            f"step {h.step}   step time {h.step_s * 1000:.0f} ms   ",
            f"{h.samples_per_s:,.0f} samples/s   efficiency ",
            (f"{h.balance_efficiency:.2f}", eff_style),
            f" {sparkline(list(state.efficiency))}   health {_age(now, h.at)}",
        )
    return Panel(body, title=f"AntDT job {state.job}", title_align="left")


def _table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )


def shown_ranks(ranks: RankColumns, limit: int) -> list[RankHealth]:
    """The rows a frame shows, by rank: all up to `limit`, else those not OK first, then
    the highest ratios (the slowest), then the lowest ranks (chosen on the columns: only
    the rows shown are made)."""
    if len(ranks) <= limit:
        return list(ranks)
    ok = RankState.OK
    keys = zip((s is ok for s in ranks.state), (-r for r in ranks.ratio), ranks.rank, strict=True)
    chosen = heapq.nsmallest(limit, enumerate(keys), key=itemgetter(1))
    return sorted(map(ranks.__getitem__, (i for i, _ in chosen)), key=attrgetter("rank"))


def _ranks(state: StatusState) -> RenderableType:
    table = _table("ranks")
    for col in ("rank", "host", "state", "class"):
        table.add_column(col, no_wrap=True)
    for col in ("smp/s", "ms/smp", "ratio", "batch", "data", "comm"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("helped", no_wrap=True)  # work sharing: samples of whose it computed
    batches = state.plan.local_batch if state.plan else ()
    ranks = state.health.ranks if state.health else RankColumns.of_rows(())
    shown = shown_ranks(ranks, state.rank_rows)
    for r in shown:
        planned = str(batches[r.rank]) if r.rank < len(batches) else "?"
        table.add_row(
            str(r.rank),
            r.host,
            Text(r.state.value, style=STATE_STYLE.get(r.state.value, "")),
            state.rank_class(r.rank),
            f"{r.samples_per_s:,.0f}",
            f"{r.compute_s_per_sample * 1000:.3f}",
            f"{r.ratio:.2f}",
            planned,
            f"{r.data_wait_share:.0%}",
            f"{r.comm_share:.0%}",
            " ".join(f"r{o}:{n}" for o, n in sorted((r.helped or {}).items())) or "-",
        )
    if len(shown) < len(ranks):
        ratios = sorted(ranks.ratio)
        table.caption = (
            f"{len(ranks) - len(shown):,} of {len(ranks):,} ranks not shown (those not ok "
            f"first, then the slowest); ratio over all ranks: min {ratios[0]:.2f}, "
            f"median {statistics.median(ratios):.2f}, max {ratios[-1]:.2f}"
        )
    return table


def _plan(state: StatusState) -> RenderableType:
    p = state.plan
    if p is None:
        return Text("plan: unknown")
    return Text(
        f"plan v{p.version} ({p.policy}) from step {p.effective_step}: "
        f"local batch {_batches(p.local_batch)} = {p.global_batch}   {p.reason}"
    )


def _batches(batches: tuple[int, ...]) -> str:
    if len(batches) <= PLAN_BATCHES:
        return str(list(batches))
    return f"{min(batches)}-{max(batches)} over {len(batches):,} ranks"


def _incidents(state: StatusState) -> RenderableType:
    open_ = state.open_incidents()
    if not open_:
        return Text("open incidents: none", style="green")
    table = _table("open incidents")
    for col in ("incident", "rank", "kind", "class", "cause", "state", "step", "ratio"):
        table.add_column(col, no_wrap=True)
    shown = open_
    if len(open_) > state.rank_rows:  # the most severe, in the usual order
        severe = {i.id for i in heapq.nlargest(state.rank_rows, open_, key=lambda i: i.ratio)}
        shown = [i for i in open_ if i.id in severe]
        table.caption = f"{len(open_) - len(shown):,} of {len(open_):,} not shown (the mildest)"
    for i in shown:
        table.add_row(
            i.id,
            str(i.rank),
            i.kind.value,
            i.straggler_class.value,
            i.cause.value,
            i.state.value,
            str(i.step),
            f"{i.ratio:.2f}",
        )
    return table


def _actions(state: StatusState, now: float) -> RenderableType:
    recent = state.recent_actions()
    if not recent:
        return Text("recent actions: none")
    table = _table("recent actions")
    for col in ("action", "kind", "result", "plan", "local batch", "from step", "when"):
        table.add_column(col, no_wrap=True)
    table.add_column("reason", overflow="ellipsis", no_wrap=True, max_width=60)
    for a in recent:
        style = "bold green" if a.result == ActionResult.APPLIED else "yellow"
        table.add_row(
            a.action_id,
            a.kind,
            Text(a.result.value, style=style),
            "" if a.plan_version is None else f"v{a.plan_version}",
            _batches(a.local_batch or ()),
            "" if a.effective_step is None else str(a.effective_step),
            _age(now, a.completed_at),
            a.reason[:80],
        )
    return table
