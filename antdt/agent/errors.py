"""The agent's exceptions."""

from __future__ import annotations


class AgentError(RuntimeError):
    """The agent cannot run: registration failed or the job does not fit this process."""


class AgentClosed(AgentError):
    """The agent is closed: raised by its training API, also to a thread that was
    waiting for data when close() ran."""


class RestartMismatch(AgentError):
    """The launcher's restart count and the job's data ledger disagree in a way that
    would lose or repeat samples: e.g. a restarted process trains without restore()."""


class LoaderError(AgentError):
    """A DataLoader cannot serve the agent's batches (how it is built or iterated)."""


class DatasetTooSmall(LoaderError):
    """The dataset has fewer samples than the job's dataset size: ids would be missing."""


class PlanUnfillable(LoaderError):
    """The plan gives this rank a batch the DataLoader may not load (over its cap)."""
