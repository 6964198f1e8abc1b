"""torchrun's rendezvous backend `antdt` (entry point `torchrun.handlers`): c10d's dynamic
rendezvous behind a gate. Before each round the node asks the controller whether it may
join; refused (blocklisted host, or its name held by another live torchrun), it leaves
the round it was in and torchrun exits BLOCKED_EXIT_CODE without closing the others'
rendezvous. A NodeGate heartbeats the node meanwhile, so that the controller counts a
torchrun waiting in the redundancy list as a spare."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import structlog
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
)

from antdt.agent.nodegate import GateSettings, NodeGate
from antdt.agent.restart import BLOCKED_EXIT_CODE
from antdt.schemas import ErrorCode, ErrorReply, NodeState

log = structlog.get_logger("antdt.agent.rendezvous")
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
#: How long a spare whose rendezvous store went away asks whether the job ended, seconds.
ENDED_WAIT_S = 30.0


class GatedRendezvousHandler(RendezvousHandler):
    """`inner` (c10d's handler) with the node registry's gate before every round."""

    def __init__(self, inner: RendezvousHandler, gate: NodeGate, backend: str) -> None:
        self.inner = inner
        self.gate = gate
        self.backend = backend
        self.refusal: ErrorReply | None = None

    def next_rendezvous(self) -> RendezvousInfo:
        if self.refusal is None:
            self.refusal = self.gate.join()
        if self.refusal is not None:
            self._refuse(self.refusal)
        try:
            info = self.inner.next_rendezvous()
        except RendezvousGracefulExitError:
            # The job closed its rendezvous while this node waited as a spare: done, not
            # failed (torch's agent would return no result, and its launcher trip on it).
            self._finished()
        except RendezvousConnectionError:
            # The store's host left: a finished job (its first node exits while a spare
            # waits), or a broken one. Ask the controller which before calling it a failure.
            if not self.gate.job_ended(ENDED_WAIT_S):
                raise
            self._finished()
        self.gate.state = NodeState.PARTICIPANT
        return info

    def _finished(self) -> NoReturn:
        self.gate.close()
        print(f"antdt: {self.gate.settings.job} finished; spare node leaves", file=sys.stderr)
        raise SystemExit(0) from None

    def _refuse(self, refusal: ErrorReply) -> None:
        if refusal.code == ErrorCode.JOB_ENDED:
            self._finished()
        self._leave()
        self.gate.close()
        print(
            f"antdt: node {self.gate.settings.host} may not join job "
            f"{self.gate.settings.job} ({refusal.code}): {refusal.error}; torchrun exits "
            f"{BLOCKED_EXIT_CODE}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(BLOCKED_EXIT_CODE)  # passes the launcher's `except Exception`

    def _leave(self) -> None:
        """Leave the round this node was a participant of, so that the next one need not
        wait for our keep-alives to lapse. c10d has no public leave: run the exit op that
        its next_rendezvous runs first. Failing that (torch's internals changed), stop the
        heartbeats: the others then drop this node after keep_alive_max_attempts beats."""
        inner: Any = self.inner
        try:
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
                _RendezvousExitOp,
            )

            inner._stop_heartbeats()
            deadline = time.monotonic() + inner.settings.timeout.close.total_seconds()
            inner._op_executor.run(_RendezvousExitOp(), deadline)
        except Exception as exc:
            log.warning("left the rendezvous by silence only", error=repr(exc))
            stop: Callable[[], None] | None = getattr(inner, "_stop_heartbeats", None)
            if stop is not None:
                stop()

    def shutdown(self) -> bool:
        """A refused node does not close the rendezvous: the job goes on without it."""
        if self.refusal is not None:
            return True
        self.gate.close()
        return self.inner.shutdown()

    def get_backend(self) -> str:
        return self.backend

    @property
    def use_agent_store(self) -> bool:
        return self.inner.use_agent_store

    def is_closed(self) -> bool:
        return self.inner.is_closed()

    def set_closed(self) -> None:
        self.inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self.inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self.inner.get_run_id()


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """c10d's dynamic handler (as torch's own `c10d` backend builds it), gated."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        create_handler as create_dynamic_handler,
    )

    settings = GateSettings()  # ANTDT_JOB missing: a clear error before any rendezvous
    # torch shares rank 0's rendezvous TCP store with the workers, and publishes its
    # address only when rank 0 changes: a spare joining a later round waits forever for
    # it. Unshared, every round publishes a fresh address (torch's own opt-out).
    os.environ[UNSHARED_STORE] = "1"
    backend, store = create_backend(params)
    inner = create_dynamic_handler(store, backend, params)
    return GatedRendezvousHandler(inner, NodeGate(settings, params.run_id), params.backend)


def handler_factory() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """What torchrun's `torchrun.handlers` entry point calls: the handler's creator."""
    return create_handler
