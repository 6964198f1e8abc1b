"""antdt.agent: the library a training script imports (README, "Using it in a training
script"): `init()`, then `epochs()`, `steps()` (or `batches(loader)` over a DataLoader
built with `batch_sampler()`) and `step.sync(model)`, then `close()`;
`agent.weighted(model)` and `accumulate` for DDP and FSDP2 models.
Importing it does not import torch; the parts that need it import it lazily."""

from __future__ import annotations

from typing import Any

import structlog

from antdt.agent.accumulate import accumulate
from antdt.agent.agent import Agent
from antdt.agent.devices import choose_backend, collective_device, model_device
from antdt.agent.errors import (
    AgentClosed,
    AgentError,
    DatasetTooSmall,
    LoaderError,
    PlanUnfillable,
    RestartMismatch,
)
from antdt.agent.gradients import (
    WeightedHookState,
    WeightedReduceScatter,
    allreduce_weighted,
    weighted,
    weighted_allreduce_hook,
)
from antdt.agent.group import destroy_process_group, init_process_group
from antdt.agent.inject import Injection, InjectionSchedule, parse_inject
from antdt.agent.launch import launch
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
    from antdt.runtime.telemetry.logs import bind_process, configure_logging

    if not structlog.is_configured():
        configure_logging(settings.telemetry.log_level, settings.telemetry.log_format)
    bind_process(job=settings.job, rank=settings.rank)
    _dump_stacks_on(settings.stack_dump_signal)
    return Agent(settings, tracer_provider=_tracer_provider(settings)).start()


def _dump_stacks_on(name: str) -> None:
    """`kill -<name> <pid>` makes this rank write every thread's stack to stderr and go on
    (a handler the application set before runs too; one it sets later replaces this)."""
    if name:
        import faulthandler
        import signal
        import sys

        sig = signal.Signals[name]
        chain = signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=chain)


def _tracer_provider(settings: AgentSettings) -> Any:
    """With an OTLP endpoint: this process's tracer provider (service `antdt-agent`),
    global unless the application has its own, flushed when the agent closes."""
    if not settings.telemetry.otlp_endpoint:
        return None
    from antdt.runtime.telemetry import setup_tracing

    attributes: dict[str, str | int] = {"antdt.job": settings.job, "antdt.rank": settings.rank}
    return setup_tracing(
        "antdt-agent",
        settings.telemetry.otlp_endpoint,
        attributes=attributes,
        export_timeout_s=2.0,  # close() must not hang on a collector that is away
    )


__all__ = [
    "RESTART_EXIT_CODE",
    "Agent",
    "AgentClosed",
    "AgentError",
    "AgentSettings",
    "DatasetTooSmall",
    "Injection",
    "InjectionSchedule",
    "LoaderError",
    "PlanUnfillable",
    "RestartMismatch",
    "Step",
    "WeightedHookState",
    "WeightedReduceScatter",
    "accumulate",
    "allreduce_weighted",
    "choose_backend",
    "collective_device",
    "destroy_process_group",
    "init",
    "init_process_group",
    "launch",
    "model_device",
    "parse_inject",
    "weighted",
    "weighted_allreduce_hook",
]
