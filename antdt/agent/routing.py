"""A step's collectives (its count, its gradient exchange) routed around the ranks that
offered their share (work sharing): a rank slowed by a noisy neighbour pays each hop of
a collective at its throttled pace, and a ring all-reduce runs at its slowest member's.
Under a step's offers, each offering rank sends its tensor (the count's vector, its
weighted gradients) to a partner among the others and receives the sum from it; the
others all-reduce among themselves, the partners adding what they received first. The
same sums as the ring (each rank's part once), in another order; every rank ends with
the partner's buffer, so the replicas agree. The count's two legs between an offering
rank and its partner go through the claim store (`Posts`), so the partner never waits
to hand the sum back.

Every rank learns the offers before the step's count, so all of them take the same route
and create the same subgroups in the same order (torch's `new_group` is collective).
torch is imported inside the functions: importing this module does not need torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

#: Subgroups kept (one per set of offering ranks): each holds connections to its
#: members. A step whose offers would need one more takes the ring instead.
MAX_ROUTES = 8
#: The largest job routed: a gloo subgroup connects each pair of its members.
MAX_ROUTED_WORLD = 64
#: The backends routed. Under nccl the reduction runs on the GPU, where a starved CPU
#: slows it far less, and each subgroup is a communicator with buffers of its own: not
#: measured there, the ring stays.
ROUTED_BACKENDS = frozenset({"gloo"})


@dataclass(frozen=True)
class Route:
    """The ranks outside the offers (`fast`, ascending) and each offering rank's partner
    among them."""

    fast: tuple[int, ...]
    partner: dict[int, int]

    def served_by(self, rank: int) -> list[int]:
        """The offering ranks whose gradients `rank` adds and returns, ascending."""
        return sorted(s for s, p in self.partner.items() if p == rank)


def route_around(world: int, offering: frozenset[int]) -> Route | None:
    """The route for a step whose offering ranks are `offering` (pure): partners dealt
    round robin over the other ranks. None (the ring) when no rank offered, or every
    rank did."""
    slow = sorted(r for r in offering if 0 <= r < world)
    fast = tuple(r for r in range(world) if r not in offering)
    if not slow or not fast:
        return None
    return Route(fast, {s: fast[i % len(fast)] for i, s in enumerate(slow)})


class Posts(Protocol):
    """The count's legs between an offering rank and its partner, through the claim
    store rather than a send and a receive: a gloo send waits until its receiver posts
    the receive, so the partner's send of the sum waited for the offering rank's
    throttled work between the steps. A post does not wait; the offering rank reads the
    sum when it gets there."""

    def post(self, values: list[int]) -> None: ...

    def read(self, owner: int) -> list[int]: ...

    def post_sum(self, owner: int, values: list[int]) -> None: ...

    def read_sum(self) -> list[int]: ...


class RoutedExchange:
    """The SUM all-reduce of a step's tensors, routed around its offering ranks
    (`route_around`), with the subgroups it needs made once and kept (at most
    MAX_ROUTES; beyond them, and without offers, the group's plain all-reduce)."""

    def __init__(self, rank: int, world: int, backend: str, group: Any = None) -> None:
        self.rank, self.world, self._group = rank, world, group
        # A job on a process group of its own: its ranks are not the world's.
        self.enabled = group is None and backend in ROUTED_BACKENDS and world <= MAX_ROUTED_WORLD
        self._subgroups: dict[tuple[int, ...], Any] = {}

    def all_reduce(
        self, tensor: Any, offering: frozenset[int] = frozenset(), posts: Posts | None = None
    ) -> None:
        """`tensor` summed over the ranks, in place, around the step's `offering` ranks.
        Called by every rank at the same point of the step (a new subgroup is made here).
        `posts` (the count): the offering ranks' parts go through it, not a send."""
        import torch.distributed as dist

        route = route_around(self.world, offering) if self.enabled else None
        subgroup = None if route is None else self._subgroup(route.fast)
        if route is None or subgroup is None:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._group)
        else:
            self._exchange(tensor, route, subgroup, posts)

    def _subgroup(self, fast: tuple[int, ...]) -> Any:
        """The subgroup of `fast`, made now if new; None past MAX_ROUTES."""
        subgroup = self._subgroups.get(fast)
        if subgroup is None and len(self._subgroups) < MAX_ROUTES:
            import torch.distributed as dist

            subgroup = self._subgroups[fast] = dist.new_group(list(fast))
        return subgroup

    def _exchange(self, flat: Any, route: Route, subgroup: Any, posts: Posts | None) -> None:
        import torch
        import torch.distributed as dist

        partner = route.partner.get(self.rank)
        if partner is not None and posts is not None:
            posts.post([int(v) for v in flat.tolist()])
            flat.copy_(torch.tensor(posts.read_sum(), dtype=flat.dtype, device=flat.device))
            return
        if partner is not None:
            dist.send(flat, partner)
            dist.recv(flat, partner)
            return
        served = route.served_by(self.rank)
        if served:
            received = torch.empty_like(flat)
            for rank in served:
                if posts is None:
                    dist.recv(received, rank)
                else:
                    part = posts.read(rank)
                    received.copy_(torch.tensor(part, dtype=flat.dtype, device=flat.device))
                flat.add_(received)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=subgroup)
        for rank in served:
            if posts is None:
                dist.send(flat, rank)
            else:
                posts.post_sum(rank, [int(v) for v in flat.tolist()])
