"""The `none` policy: observe only. The baseline every benchmark reports."""

from __future__ import annotations

from antdt.schemas import Incident, JobHealth
from antdt.services.controller.actions import Action
from antdt.services.controller.view import JobView


class NonePolicy:
    """Never acts; the monitor still detects and reports."""

    name = "none"
    #: It decides nothing from what the monitor says: a simulator need not run the monitor
    #: for it (its run is the same step for step).
    observes_only = True

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]:
        return []
