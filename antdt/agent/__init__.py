"""antdt.agent: the library a training script imports.

    agent = antdt.agent.init()            # settings from ANTDT_* env, kwargs override
    antdt.agent.init_process_group()      # or your own torch.distributed (gloo) setup
    for epoch in agent.epochs():
        for step in agent.steps():
            loss = mean loss over step.sample_ids; loss.backward()
            step.sync(model)               # batch-weighted gradient all-reduce
            optimizer.step(); optimizer.zero_grad()
    agent.close()

Importing this package does not import torch; the parts that need it import it lazily."""

from __future__ import annotations

from typing import Any

import structlog

from antdt.agent.agent import Agent
from antdt.agent.errors import AgentClosed, AgentError
from antdt.agent.gradients import WeightedHookState, allreduce_weighted, weighted_allreduce_hook
from antdt.agent.inject import Injection, InjectionSchedule, parse_inject
from antdt.agent.launch import init_process_group, launch
from antdt.agent.restart import RESTART_EXIT_CODE
from antdt.agent.settings import AgentSettings
from antdt.agent.steps import Step


def init(settings: AgentSettings | None = None, **overrides: Any) -> Agent:
    """Build AgentSettings from the environment (kwargs override fields), start an Agent
    (connect, hello, register) and return it."""
    if settings is None:
        settings = AgentSettings(**overrides)
    elif overrides:  # re-validated, unlike model_copy(update=...)
        settings = AgentSettings(**{**settings.model_dump(), **overrides})
    if not structlog.is_configured():
        from antdt.runtime.logs import configure_logging

        configure_logging(settings.telemetry.log_level, settings.telemetry.log_format)
    return Agent(settings).start()


__all__ = [
    "RESTART_EXIT_CODE",
    "Agent",
    "AgentClosed",
    "AgentError",
    "AgentSettings",
    "Injection",
    "InjectionSchedule",
    "Step",
    "WeightedHookState",
    "allreduce_weighted",
    "init",
    "init_process_group",
    "launch",
    "parse_inject",
    "weighted_allreduce_hook",
]
