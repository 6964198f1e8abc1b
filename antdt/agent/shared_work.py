"""A step's micro-batches as the training script computes them: `step.claims()`.

Without work sharing: the rank's own micro-batches, each loss weighted by its share of
the rank's ids (as `step.micro_batches`). With it (`work_sharing` on): whatever the claim
store hands this rank, its own first, each loss weighted by its share of the step's
total; `sync` then weights the rank by the samples it computed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from antdt.agent.errors import AgentError
from antdt.agent.sharing import ShareParams, cut

if TYPE_CHECKING:
    from antdt.agent.claimstore import StoreClaims
    from antdt.schemas import JobSpec, Plan


@dataclass(frozen=True)
class MicroBatch:
    """Ids to run forward and backward on, and the weight of their mean loss."""

    owner: int  # the rank whose share of the step they are
    index: int
    ids: list[int]
    weight: float


def own_micro_batches(chunks: list[list[int]], rank: int) -> Iterator[MicroBatch]:
    n = sum(len(ids) for ids in chunks)
    for index, ids in enumerate(chunks):
        yield MicroBatch(rank, index, ids, len(ids) / n)


@dataclass
class WorkSharing:
    """The job's work sharing: how a rank's ids are cut, and its claim store client
    (made at the first step: the process group may be formed after the agent starts)."""

    chunks: int
    make_client: Callable[[], StoreClaims]
    _client: StoreClaims | None = None
    #: Seconds the open step spent in claim store round trips, publish apart: the
    #: driver reports them as communication, so compute_s stays the rank's own compute.
    publish_s: float = 0.0
    claim_s: float = 0.0
    #: Samples of other ranks' shares computed in the open step, by owner.
    helped: dict[int, int] = field(default_factory=dict)

    @property
    def client(self) -> StoreClaims:
        if self._client is None:
            self._client = self.make_client()
        return self._client

    def publish(self, step_index: int, plan: Plan, rank: int, ids: list[int]) -> None:
        micro = plan.micro_batch[rank] if plan.micro_batch else 0
        chunks = cut(ids, micro, self.chunks)
        client, t0 = self.client, time.perf_counter()
        client.publish(step_index, chunks)
        self.publish_s, self.claim_s = time.perf_counter() - t0, 0.0
        self.helped = {}

    def claims(self, total_samples: int, computed: list[int]) -> Iterator[MicroBatch]:
        """Claim, yield, mark done, until every micro-batch of the step is claimed; the
        ids of each one computed are appended to `computed`."""
        client = self.client
        while True:
            t0 = time.perf_counter()
            held = client.claim_next()
            self.claim_s += time.perf_counter() - t0
            if held is None:
                return
            yield MicroBatch(held.owner, held.index, held.ids, len(held.ids) / total_samples)
            t0 = time.perf_counter()
            client.done(held)
            self.claim_s += time.perf_counter() - t0
            computed.extend(held.ids)
            if held.owner != client.rank:
                self.helped[held.owner] = self.helped.get(held.owner, 0) + len(held.ids)

    def keep_own(self, step_index: int) -> None:
        """The script computed its own ids without `claims()`: claim them all now; an
        error if a helper holds one (it computed it too)."""
        taken = self.client.keep_own()
        if taken:
            held = [(c.index, c.claim.rank) for c in taken]
            raise AgentError(
                f"step {step_index}: helpers hold micro-batches (index, rank) {held} that "
                "this rank computed itself: under work sharing, every rank iterates "
                "step.claims()"
            )


def sharing_for(spec: JobSpec, rank: int) -> WorkSharing | None:
    """The job's WorkSharing when its policy params turn it on and it has several ranks."""
    try:
        params = ShareParams.from_params(spec.policy_params, spec.policy)
    except ValueError as exc:
        raise AgentError(f"job {spec.job}: {exc}") from None
    if not params.enabled or spec.world_size < 2:
        return None

    def make_client() -> StoreClaims:
        import torch.distributed as dist

        from antdt.agent.claimstore import StoreClaims

        store: Any = dist.distributed_c10d._get_default_store()
        return StoreClaims(store, rank, spec.world_size)

    return WorkSharing(params.chunks, make_client)
