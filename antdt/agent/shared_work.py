"""A step's micro-batches as the training script computes them: `step.claims()`.

Without work sharing: the rank's own micro-batches, each loss weighted by its share of
the rank's ids (as `step.micro_batches`). With it (`work_sharing` on): its own (drawn
ticket by ticket when it offered them), then what it takes over from offering ranks,
each loss weighted by its share of the step's total; `sync` then weights the rank by the
samples it computed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from antdt.agent.claimstore import Claimed, CountTag, StoreClaims
from antdt.agent.errors import AgentError
from antdt.sharing import (
    Holder,
    Lane,
    Pace,
    ShareParams,
    head_size,
    helper_lanes,
    holds_back,
    late_offer,
    late_slots,
    micro_samples,
    offering,
    one_piece_scale,
    read_late_slots,
)

#: Reads of its counter in a row that find no helper took a micro-batch, all after a
#: helper should be free, before a holding-back owner draws after all: one such read is
#: a helper finishing its own share a little later than its last step's pace said.
IDLE_READS = 2

#: The count all-reduce: the element-wise SUM of every rank's vector.
AllSum = Callable[[list[int]], list[int]]

if TYPE_CHECKING:
    from antdt.schemas import JobSpec, Plan


@dataclass(frozen=True)
class MicroBatch:
    """Ids to run forward and backward on, and the weight of their mean loss; on the
    DataLoader path (`agent.batches`) also their data, as the loader collates it."""

    owner: int  # the rank whose share of the step they are
    index: int
    ids: list[int]
    weight: float
    batch: Any = None


def own_micro_batches(chunks: list[list[int]], rank: int) -> Iterator[MicroBatch]:
    n = sum(len(ids) for ids in chunks)
    for index, ids in enumerate(chunks):
        yield MicroBatch(rank, index, ids, len(ids) / n)


@dataclass
class _Tally:
    """Seconds spent on samples: a pace."""

    seconds: float = 0.0
    samples: int = 0

    def add(self, seconds: float, samples: int) -> None:
        self.seconds += seconds
        self.samples += samples

    @property
    def pace(self) -> float:
        return self.seconds / self.samples if self.samples else 0.0


@dataclass(frozen=True)
class CountPosts:
    """One count's legs through the claim store (routing.Posts)."""

    client: StoreClaims
    tag: CountTag

    def post(self, values: list[int]) -> None:
        self.client.post_part(self.tag, values)

    def read(self, owner: int) -> list[int]:
        return self.client.read_part(self.tag, owner)

    def post_sum(self, owner: int, values: list[int]) -> None:
        self.client.post_sum(self.tag, owner, values)

    def read_sum(self) -> list[int]:
        return self.client.read_sum(self.tag)


@dataclass
class WorkSharing:
    """The job's work sharing on one rank: its offers, its claim store client (made at
    the first step: the process group may be formed after the agent starts) and its own
    compute per sample, which the step's exchange (appended to its gradient all-reduce)
    carries to every rank for the next step's offers."""

    params: ShareParams
    make_client: Callable[[], StoreClaims]
    _client: StoreClaims | None = None
    #: Seconds the open step spent drawing tickets (its publish is part of the count):
    #: the driver reports them as communication, so compute_s stays the rank's own.
    claim_s: float = 0.0
    #: Samples of other ranks' shares computed in the open step, by owner.
    helped: dict[int, int] = field(default_factory=dict)
    #: This rank's compute per sample in its last step, and the ranks that offered then
    #: (every rank's `open` computes the same set).
    pace: Pace = field(default_factory=Pace)
    offered: frozenset[int] = frozenset()
    #: Every rank's paces and claim round trips (s) in the last step, from its exchange
    #: (empty before the first), and whether this rank decides after its head whether
    #: to offer its tail (`share_late`).
    paces: list[Pace] = field(default_factory=list)
    trips: list[float] = field(default_factory=list)
    deciding: bool = False
    #: The step last opened and the offers of the step before it: a step opened again
    #: (the epoch ran out of data at its count; the next epoch's first step has its
    #: index) decides its offers from the same paces and offers as the first time.
    _opened: int = -1
    _offered_before: frozenset[int] = frozenset()
    #: The seconds the open step's own share would take in one pass at this rank's pace
    #: (None: not known, or the step ran it so; see `one_piece_s`).
    one_piece: float | None = None
    #: The open step's plan (samples by rank), and, while this rank's offer lasts, the
    #: helpers as it expects them and its own last micro-batch's seconds, ticket included.
    _samples: tuple[int, ...] = ()
    _counted_at: float = 0.0
    #: Counts opened so far: the same number on every rank.
    _counts: int = 0
    _lanes: list[Lane] = field(default_factory=list)
    _own_micro_s: float = 0.0
    #: Seconds per sample of this rank's head when it offered its tail late this step.
    _late_pace: float | None = None

    @property
    def client(self) -> StoreClaims:
        if self._client is None:
            self._client = self.make_client()
        return self._client

    def open(
        self,
        step_index: int,
        plan: Plan,
        rank: int,
        ids: list[int],
        sums: AllSum,
        may_decide: bool = True,
    ) -> int:
        """The step's count all-reduce. Every rank decides the same offers from the paces
        and round trips the last step's `exchange` gave all of them; the count carries
        the step's total, each offering rank's samples and, under `share_late`, which
        ranks may offer late (their share in one piece, `may_decide`: the script's path
        computes through claims()). A step without offers counts one number, as without
        sharing. The offers are opened (this rank's published when it offers). Returns
        the step's total samples."""
        world = len(plan.local_batch)
        micro = plan.micro_batch or (0,) * world
        offered, before = self._offers(step_index, plan)
        self._opened, self._offered_before, self.offered = step_index, before, offered
        owners = sorted(offered)
        self._counts += 1
        vector = self._vector(plan, rank, len(ids), owners, may_decide)
        summed, self.pace = sums(vector), Pace()  # a script without claims(): no pace
        self._counted_at = time.perf_counter()  # every rank leaves the count about now
        counts = dict(zip(owners, summed[1 : 1 + len(owners)], strict=True))
        deciders = read_late_slots(summed[1 + len(owners) :], world) - self.offered
        offers = {o: (counts[o], micro[o]) for o in owners}
        own = ids if rank in offers else None
        owner_paces = {r: p.own for r, p in enumerate(self.paces)}
        self.client.open(step_index, offers, self.params.chunks, own, deciders, owner_paces)
        self.deciding = rank in deciders
        self.claim_s, self.helped, self.one_piece, self._late_pace = 0.0, {}, None, None
        self._samples = tuple(plan.local_batch)
        return summed[0]

    def _offers(self, step_index: int, plan: Plan) -> tuple[frozenset[int], frozenset[int]]:
        """Step `step_index`'s offers under `plan`, and the offers they follow (those of
        the step before; a step opened again keeps its first opening's): pure, the same
        on every rank, from the paces and round trips of the last exchange."""
        before = self._offered_before if step_index == self._opened else self.offered
        if len(self.paces) != len(plan.local_batch):
            return frozenset(), before
        params = self.params
        found = offering(
            self.paces, before, plan.local_batch, params.ratio, self.trips, params.chunks
        )
        return found, before

    def _vector(
        self, plan: Plan, rank: int, samples: int, owners: list[int], may_decide: bool
    ) -> list[int]:
        """A rank's part of a count: its samples, its offer's slot per owner and, under
        `share_late`, whether it may decide late."""
        world = len(plan.local_batch)
        micro = plan.micro_batch or (0,) * world
        in_one_piece = micro[rank] == 0 or micro[rank] >= samples
        late = self.params.late and may_decide and in_one_piece and head_size(samples) > 0
        vector = [samples, *(samples if o == rank else 0 for o in owners)]
        if self.params.late:
            vector += late_slots(world, rank, late)
        return vector

    def posts(self, epoch: int, step_index: int) -> CountPosts:
        """The open count's legs through the claim store (routing.Posts), tagged with
        the count's number (the same on every rank: a step counted again at an epoch's
        end has another), its epoch and its step."""
        return CountPosts(self.client, (self._counts, epoch, step_index))

    @property
    def around(self) -> frozenset[int]:
        """The ranks the step's collectives go around (routing.py): the open step's
        offering ranks, the same on every rank; none under `share_route=off`."""
        return self.offered if self.params.route else frozenset()

    def report(self) -> list[int]:
        """The rank's slots of the step's exchange (`learn` reads the sum): its own and
        helping seconds per sample this step and its claim round trip, in ns."""
        client = self.client
        world, rank = client.world, client.rank
        vector = [0] * (3 * world)
        vector[rank] = round(self.pace.own * 1e9)
        vector[world + rank] = round(self.pace.helping * 1e9)
        vector[2 * world + rank] = round(client.round_trip_s * 1e9)
        return vector

    def learn(self, summed: list[int]) -> None:
        """Every rank's paces and round trips from the sum of their `report`s: the next
        step's offers follow from them."""
        world = len(summed) // 3
        self.paces = [Pace(summed[r] / 1e9, summed[world + r] / 1e9) for r in range(world)]
        self.trips = [t / 1e9 for t in summed[2 * world :]]

    def exchange(self, sums: AllSum) -> None:
        """`report` summed over the ranks, then `learn`: for a step whose gradients are
        not reduced with the report appended (the driver's own path appends it)."""
        self.learn(sums(self.report()))

    def claims(
        self, own: list[list[int]], total: int, computed: list[int], slowdown: float = 1.0
    ) -> Iterator[MicroBatch]:
        """The rank's own micro-batches (`own`; claimed ticket by ticket when it
        offered), then the offered ones it can help with, until each has its holder;
        the ids of each one computed are appended to `computed`. `slowdown`: an
        injected straggler's factor, slept after each micro-batch (tests, demos)."""
        client, own_tally, help_tally = self.client, _Tally(), _Tally()
        head = head_size(len(own[0])) if self.deciding and len(own) == 1 else 0
        if head:
            own = [own[0][:head], own[0][head:]]
        self._expect_helpers(client, self._counted_at)
        for mb, held in self._held(client, own):
            t0 = time.perf_counter()
            yield MicroBatch(mb.owner, mb.index, mb.ids, len(mb.ids) / total)
            if slowdown > 1:
                time.sleep((slowdown - 1) * (time.perf_counter() - t0))
            took = time.perf_counter() - t0
            helping = mb.owner != client.rank
            (help_tally if helping else own_tally).add(took, len(mb.ids))
            computed.extend(mb.ids)
            self.claim_s += held
            if helping:
                self.helped[mb.owner] = self.helped.get(mb.owner, 0) + len(mb.ids)
            else:
                self._own_micro_s = took + held
            if head and mb.ids is own[0]:  # the head, just computed
                self._decide(client, own[1], took, head)
        self.pace = Pace(own_tally.pace, help_tally.pace)
        self.one_piece = self._one_piece(own_tally, sum(map(len, own)))

    def _decide(self, client: StoreClaims, tail: list[int], head_s: float, head: int) -> None:
        """After the head: offer the tail when the head was slow (its round trips count
        as claim time)."""
        t0 = time.perf_counter()
        slow = late_offer(head_s, head, self.paces, self.params.ratio)
        client.decide_late(tail if slow else None, head_s / head)
        self._late_pace = head_s / head if slow else None
        self.claim_s += time.perf_counter() - t0

    def _held(self, client: StoreClaims, own: list[list[int]]) -> Iterator[tuple[Claimed, float]]:
        """Each micro-batch to compute, with the claim store seconds it took to get: the
        own pieces (until a late offer hands the rest to tickets), then tickets, then,
        once, the late offers of the step. Seconds an owner held back count as claim time
        here, not in its micro-batch's."""
        if not client.offered:
            for index, ids in enumerate(own):
                yield Claimed(client.rank, index, ids, Holder.OWNER), 0.0
                if client.offered:  # offered its tail late: drawn by tickets now
                    break
        while True:
            self.claim_s += self._hold_back(client)
            t0 = time.perf_counter()
            held = client.claim_next()
            if held is None and client.join_late():
                held = client.claim_next()
            if held is None:
                self.claim_s += time.perf_counter() - t0
                return
            yield held, time.perf_counter() - t0

    def _expect_helpers(self, client: StoreClaims, start: float) -> None:
        """When this rank offered: the helpers' lanes from their last step's paces, from
        `start` (the count's end: the helpers begin then, the owner once it published).
        Its own micro-batch's seconds are unknown (0) until it has computed one."""
        self._lanes, self._own_micro_s = [], 0.0
        if not client.own_left or len(self.paces) != client.world:
            return
        samples, micro = client.share_size(client.rank)
        size = micro_samples(samples, micro, self.params.chunks)
        others = self.offered | {client.rank}
        self._lanes = helper_lanes(self.paces, others, self._samples, self.trips, size, start)

    def _hold_back(self, client: StoreClaims) -> float:
        """Before this rank draws its next own ticket: wait while the helpers would have
        all its unclaimed micro-batches computed before it finished one (`holds_back`),
        reading its counter at once (its last draw's count is old), then every fastest
        helper's micro-batch; draw once none is left without a holder, or once IDLE_READS
        reads in a row found no helper took one while a helper should be free (the step
        never waits long on a helper that is not coming). Not before its first micro-batch of
        the step: its pace in this step is known from it alone (a burst that ended with
        the last step would leave a fast owner idle). Returns the seconds it waited."""
        if not self._lanes or self._own_micro_s == 0.0:
            return 0.0
        # a read more often than a round trip only queues behind the last
        poll = max(min(lane.micro_s for lane in self._lanes), client.round_trip_s)
        first_free = min(lane.free_at for lane in self._lanes)
        remaining = client.own_unclaimed
        start = now = time.perf_counter()
        reads = idle = 0
        while client.own_left and holds_back(now, self._own_micro_s, remaining, self._lanes):
            if reads:
                time.sleep(poll)
            before, remaining = remaining, client.read_own()
            now, reads = time.perf_counter(), reads + 1
            idle = idle + 1 if reads > 1 and remaining == before and now > first_free else 0
            if idle >= IDLE_READS:
                break
        return now - start

    def _one_piece(self, own: _Tally, share: int) -> float | None:
        """The seconds this rank's share (`share` samples) would take in one pass at its
        pace this step, when the step ran otherwise: its own part's pace when it did not
        offer (it helped), else its micro-batches' pace times the job's one-piece ratio
        (None while unknown); its head's pace when it offered its tail late (the head ran
        in one piece this step). None when it neither offered nor helped."""
        if self._late_pace is not None:
            return self._late_pace * share
        offered = self.client.rank in self.offered
        if not (offered or self.helped) or own.samples == 0:
            return None
        scale = one_piece_scale(self.paces, self.offered) if offered else 1.0
        return own.pace * scale * share if scale > 0 else None

    def settle_late(self) -> None:
        """At sync: a rank that was to decide whether to offer late and did not (its
        script computed without claims()) offers nothing, so no helper waits for it."""
        if self.deciding:
            self.client.decide_late(None)

    def keep_own(self, step_index: int) -> None:
        """The script computed its own ids without `claims()`: claim those it offered
        now; an error if a helper holds one (it computed it too)."""
        taken = self.client.keep_own()
        if taken:
            raise AgentError(
                f"step {step_index}: helpers hold micro-batches {taken} that this rank "
                "computed itself: under work sharing, every rank iterates step.claims()"
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

    return WorkSharing(params, make_client)
