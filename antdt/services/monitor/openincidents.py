"""The open incidents of one job's detector: their ranks, their ids, their closing (pure)."""

from __future__ import annotations

from antdt.schemas import Incident, IncidentKind, IncidentState


class OpenIncidents:
    """Open incident id -> rank, in opening order. Ids carry the owner's `epoch` (its
    claim's etcd revision), so that the ids of two owners of a job never meet."""

    def __init__(self, job: str, epoch: int) -> None:
        self.job = job
        self._epoch = epoch
        self._made = 0
        self._rank_of: dict[str, int] = {}

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._rank_of)

    def __contains__(self, incident_id: object) -> bool:
        return incident_id in self._rank_of

    def rank_of(self, incident_id: str) -> int:
        return self._rank_of[incident_id]

    def new_id(self, rank: int, kind: IncidentKind) -> str:
        self._made += 1
        # Job ids may be 128 characters, incident ids too: keep room for the suffix.
        return f"{self.job[:80]}-r{rank}-{kind.value}-e{self._epoch}-{self._made}"

    def opened(self, incident: Incident) -> Incident:
        self._rank_of[incident.id] = incident.rank
        return incident

    def closed(self, incident: Incident, now: float, **update: object) -> Incident:
        """`incident` resolved at `now` (with `update` applied), and no longer open."""
        del self._rank_of[incident.id]
        return incident.model_copy(
            update={"state": IncidentState.RESOLVED, "updated_at": now, **update}
        )
