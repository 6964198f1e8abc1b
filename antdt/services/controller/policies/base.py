"""The policy contract: a pure `decide(view, event) -> list[Action]`. Policies never do
I/O nor read the clock; the executor alone carries actions out, after checking the
same guardrails again."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from antdt.schemas import Incident, JobHealth
from antdt.services.controller.actions import Action
from antdt.services.controller.view import JobView

#: What a decision reacts to: the 1 Hz health or an incident transition.
PolicyEvent = JobHealth | Incident


@runtime_checkable
class Policy(Protocol):
    """A decision core, registered under entry point group `antdt.policies`."""

    name: str

    def decide(self, view: JobView, event: JobHealth | Incident) -> list[Action]: ...
