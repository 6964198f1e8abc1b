"""Controller policies: pure decision cores, found by entry point group `antdt.policies`."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from antdt.services.controller.actions import Action, AdjustBatchAction, KillRestartAction
from antdt.services.controller.policies.base import Policy, PolicyEvent
from antdt.services.controller.policies.dd import DdPolicy
from antdt.services.controller.policies.lbbsp import LbBspPolicy
from antdt.services.controller.policies.nd import AntDtNdPolicy
from antdt.services.controller.policies.none import NonePolicy
from antdt.services.controller.view import JobView

ENTRY_POINT_GROUP = "antdt.policies"

#: Used when the package metadata (and so its entry points) is not installed.
BUILTIN_POLICIES: dict[str, Callable[[], Policy]] = {
    "none": NonePolicy,
    "lb-bsp": LbBspPolicy,
    "antdt-nd": AntDtNdPolicy,
    "antdt-dd": DdPolicy,
}


def available_policies() -> tuple[str, ...]:
    """Names load_policy accepts: installed entry points plus the built-ins."""
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return tuple(sorted(names | BUILTIN_POLICIES.keys()))


def load_policy(name: str) -> Policy:
    """A new instance of the policy registered as `name`; ValueError when unknown."""
    factory: Callable[[], object] | None = None
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory = ep.load()
            break
    else:
        factory = BUILTIN_POLICIES.get(name)
    if factory is None:
        known = ", ".join(available_policies())
        raise ValueError(f"unknown policy {name!r} (known: {known})")
    policy = factory()
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {name!r} does not implement decide(view, event)")
    return policy


__all__ = [
    "BUILTIN_POLICIES",
    "ENTRY_POINT_GROUP",
    "Action",
    "AdjustBatchAction",
    "AntDtNdPolicy",
    "DdPolicy",
    "JobView",
    "KillRestartAction",
    "LbBspPolicy",
    "NonePolicy",
    "Policy",
    "PolicyEvent",
    "available_policies",
    "load_policy",
]
