"""The `none` policy: observe only. The baseline every benchmark reports."""

from __future__ import annotations

from antdt.schemas import Incident, JobHealth
from antdt.services.controller.actions import Action
from antdt.services.controller.view import JobView


class NonePolicy:
    """Never acts; the monitor still detects and reports."""

    name = "none"

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]:
        return []
