"""What a policy may look at: a read-only `JobView`, built for one decision. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from antdt.schemas import Incident, JobHealth, JobSpec, NodeRecord, Plan, RestartLedger
from antdt.services.controller.columns import HealthColumns
from antdt.services.controller.nodes import free_spares

T = TypeVar("T")


@dataclass(frozen=True)
class JobView:
    """One job at one instant (`now` is a value). The fields after `now` default to a
    job that never restarted, on hosts nobody blocklisted, of unknown remaining length."""

    spec: JobSpec
    plan: Plan
    health: JobHealth | None
    open_incidents: tuple[Incident, ...]
    memory_caps: Mapping[int, int]  # rank -> largest local batch its memory holds
    last_action_at: float | None
    now: float
    #: rank -> host it runs on now (its latest RankHello, else its JobHealth row)
    hosts: Mapping[int, str] = field(default_factory=dict)
    #: hosts no rank may be moved to (etcd `blocklist/{host}`, all jobs)
    blocklist: frozenset[str] = frozenset()
    #: restart budget used, measured costs, the restart in flight (etcd `jobs/{job}/restarts`)
    restarts: RestartLedger = field(default_factory=RestartLedger)
    #: samples left to train (spec: dataset_size x epochs, minus steps done x global batch)
    remaining_samples: int | None = None
    #: host -> live record of every node registered for the job (etcd
    #: `jobs/{job}/nodes/{host}`, torchrun's rendezvous gate); empty: none registered
    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    #: `health` as columns, built once per health message (None: built here when read)
    columns: HealthColumns | None = None

    def remembered(self, name: str, key: object, compute: Callable[[], T]) -> T:
        """`compute()`, once per `name` and equal `key` on this view: a decision derives
        the same figures more than once (a view never changes, so neither do they)."""
        entries: list[tuple[object, Any]] = self._derived.setdefault(name, [])
        for known, value in entries:
            if known is key or known == key:
                return value  # type: ignore[no-any-return]
        value = compute()
        entries.append((key, value))
        return value

    @property
    def health_columns(self) -> HealthColumns:
        """`columns` when they are this view's health's, else built (once per view)."""
        assert self.health is not None
        health, world, given = self.health, self.spec.world_size, self.columns
        if given is not None and given.health is self.health and given.world_size == world:
            return given
        return self.remembered("columns", None, lambda: HealthColumns.of(health, world))

    @cached_property
    def _derived(self) -> dict[str, list[tuple[object, Any]]]:
        return {}

    @property
    def free_spares(self) -> tuple[str, ...]:
        """Registered live nodes hosting no rank now and not blocklisted, sorted."""
        return free_spares(self.nodes, set(self.hosts.values()), self.blocklist)

    @property
    def remaining_steps(self) -> int | None:
        """Steps left at the current global batch (None: unknown)."""
        if self.remaining_samples is None:
            return None
        return -(-self.remaining_samples // self.spec.global_batch)


def remaining_samples(spec: JobSpec, health: JobHealth | None) -> int | None:
    """Samples left after the step health reports (steps count from 0). An estimate that
    errs towards too few: an epoch's last steps may be short."""
    if health is None:
        return None
    done = (health.step + 1) * spec.global_batch
    return max(0, spec.dataset_size * spec.epochs - done)
