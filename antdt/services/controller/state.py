"""The owning replica's record of one job: loaded from etcd when the job is claimed, then
kept current by the job's events and the executor's writes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from antdt.schemas import (
    Incident,
    IncidentState,
    JobHealth,
    JobSpec,
    NodeRecord,
    Plan,
    RankHello,
    RestartLedger,
)
from antdt.services.controller.columns import HealthColumns
from antdt.services.controller.restarts import Progress
from antdt.services.controller.view import JobView, remaining_samples


@dataclass
class JobState:
    """One per owned job. `busy`: one decision (policy or proposal) at a time;
    `ledger_lock`: one restart ledger write at a time; `resume_pending`: a takeover,
    finished on the job's first health (the executor's `resume`)."""

    spec: JobSpec
    plan: Plan
    plan_revision: int
    health: JobHealth | None = None
    incidents: dict[str, Incident] = field(default_factory=dict)
    memory_caps: dict[int, int] = field(default_factory=dict)
    last_action_at: float | None = None
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host, from RankHello
    restarts: RestartLedger = field(default_factory=RestartLedger)
    restarts_revision: int = 0  # mod revision of jobs/{job}/restarts (0: absent)
    ledger_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    resume_pending: bool = False
    started: dict[int, float] = field(default_factory=dict)  # rank -> its process's start
    progress: Progress | None = None  # where the job stands during a restart in flight
    refused_restart: tuple[str, str] | None = None  # (action id, why) last recorded refused
    nodes: dict[str, NodeRecord] = field(default_factory=dict)  # live registered nodes
    #: `health` as columns, built once per health message (`_health_columns`)
    _columns: HealthColumns | None = field(default=None, init=False, repr=False, compare=False)

    def view(self, now: float, blocklist: frozenset[str] = frozenset()) -> JobView:
        """The read-only view a policy decides on."""
        columns = self._health_columns()
        hosts = dict(columns.hosts) if columns is not None else {}
        hosts.update(self.hosts)  # a RankHello is newer than the health's window
        return JobView(
            spec=self.spec,
            plan=self.plan,
            health=self.health,
            open_incidents=tuple(self.incidents.values()),
            memory_caps=dict(self.memory_caps),
            last_action_at=self.last_action_at,
            now=now,
            hosts=hosts,
            blocklist=blocklist,
            restarts=self.restarts,
            remaining_samples=remaining_samples(self.spec, self.health),
            nodes={h: r for h, r in self.nodes.items() if r.live(now)},
            columns=columns,
        )

    def ranks_away(self) -> bool:
        """Some rank's process exited (finished, closed, or to be restarted), by the
        latest health: read from its columns, made once per health message (a large job
        decides on 100+ incident transitions a second)."""
        columns = self._health_columns()
        return columns is not None and columns.away

    def _health_columns(self) -> HealthColumns | None:
        if self.health is None:
            return None
        if self._columns is None or self._columns.health is not self.health:
            self._columns = HealthColumns.of(self.health, self.spec.world_size)
        return self._columns

    def learn_hello(self, hello: RankHello) -> None:
        """A rank's latest process: its host, start and memory cap (none said: none known)."""
        rank = hello.rank
        if rank >= self.spec.world_size or hello.world_size != self.spec.world_size:
            return
        self.hosts[rank] = hello.host
        self.started[rank] = hello.started_at
        if hello.max_local_batch is not None:
            self.memory_caps[rank] = hello.max_local_batch
        else:
            self.memory_caps.pop(rank, None)

    def learn_incident(self, incident: Incident) -> None:
        """Open incidents are kept (the latest transition of each); resolved ones go."""
        if incident.state == IncidentState.RESOLVED:
            self.incidents.pop(incident.id, None)
        else:
            self.incidents[incident.id] = incident
