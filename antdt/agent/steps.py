"""The training thread's side of the agent: epochs, steps, timing and sync.

Per step: a few clock reads, the plan lock twice, list slicing for the ids, one
bounded-queue append. Network work goes to the loop through `emit`, `log_ids` and the
shard stream."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from antdt.agent.devices import wait_for_device
from antdt.agent.inject import InjectionSchedule
from antdt.agent.outbox import SampleLine, StepRecord
from antdt.agent.sampling import Taken
from antdt.agent.shared_work import AllSum, MicroBatch, WorkSharing, own_micro_batches
from antdt.agent.stream_state import SETTLE_CODES, SETTLE_WAIT, Settled
from antdt.agent.tail import TailCatchUp

if TYPE_CHECKING:
    from antdt.agent.collectives import Collectives
    from antdt.agent.gradients import WeightedHookState
    from antdt.agent.loaded import LoadedBatch
    from antdt.agent.readahead import Lot
    from antdt.agent.shards import ShardStream
    from antdt.agent.timeline import StepPlans
    from antdt.schemas import Plan


class Step:
    """One step of this rank: its sample ids, and `sync` to end it. `local_batch` is what
    the plan gives the rank; `sample_ids` may hold fewer (its data ran out) or, at an
    epoch's tail, more (the share of ranks that ran out, up to the plan's largest local
    batch and the rank's `max_local_batch`)."""

    __slots__ = (
        "_claiming",
        "_comm_s",
        "_computed",
        "_count_s",
        "_data_s",
        "_driver",
        "_finished",
        "_loaded",
        "_lot",
        "_t0",
        "_t_yield",
        "_wall0",
        "epoch",
        "index",
        "local_batch",
        "micro_batch",
        "plan_version",
        "sample_ids",
        "synced",
        "total_samples",
    )

    def __init__(
        self, driver: StepDriver, index: int, epoch: int, plan: Plan, taken: Taken, total: int
    ) -> None:
        self._driver = driver
        self.index = index
        self.epoch = epoch
        self.plan_version = plan.version
        self.local_batch = plan.local_batch[driver.rank]
        micro = plan.micro_batch[driver.rank] if plan.micro_batch else 0
        self.micro_batch = micro or max(1, self.local_batch, len(taken.ids))
        self.sample_ids: list[int] = taken.ids
        self.total_samples = total
        self.synced = False
        self._finished = taken.finished
        self._lot: Lot | None = None  # its ids' read-ahead record (a DataLoader's step)
        self._loaded: LoadedBatch | None = None  # and its batch, for `claims()`
        self._t0 = self._t_yield = self._wall0 = 0.0
        self._data_s = self._count_s = self._comm_s = 0.0
        self._computed: list[int] | None = None  # under work sharing, once claims() began
        self._claiming = False  # claims() began and has not reached its end

    @property
    def micro_batches(self) -> list[list[int]]:
        """The step's ids in chunks of the plan's micro-batch for this rank (antdt-dd:
        what fits in memory); accumulate their gradients, each loss weighted by
        len(chunk) / len(sample_ids), so the step's gradient is the mean over all ids."""
        ids, size = self.sample_ids, self.micro_batch
        return [ids[i : i + size] for i in range(0, len(ids), size)]

    def claims(self) -> Iterator[MicroBatch]:
        """The micro-batches to compute, each mean loss scaled by its `weight` before
        backward. The same as `micro_batches` unless the job shares work (policy param
        `work_sharing`): then iterate it to its end, also when the own ids ran out, since
        it hands out other ranks' micro-batches too. On the DataLoader path each comes
        with its data (`batch`): compute on that, not on the step's whole batch."""
        return self._driver.claims(self)

    def sync(self, model: Any = None) -> int:
        """End the step's compute: apply any injected slowdown, exchange batch-weighted
        gradients of `model` (a module, DDP or not, or its parameters; None when they were
        already exchanged, e.g. by the DDP hook), record the ids as having reached the
        model and report finished shards. Every rank must call it every step. Returns
        the step's total sample count."""
        return self._driver.sync(self, model)

    def __repr__(self) -> str:
        return (
            f"Step(index={self.index}, epoch={self.epoch}, samples={len(self.sample_ids)}, "
            f"total={self.total_samples}, plan_version={self.plan_version})"
        )


@dataclass
class StepDriver:
    rank: int
    host: str
    stream: ShardStream
    plans: StepPlans
    collectives: Callable[[], Collectives]
    schedule: InjectionSchedule
    emit: Callable[[StepRecord], None]
    log_ids: Callable[[SampleLine], None] | None = None
    hook_state: WeightedHookState | None = None
    ddp_model: Any = None
    sharing: WorkSharing | None = None
    max_local_batch: int | None = None
    epoch: int | None = None
    restarts: RestartVotes | None = None
    _open: Step | None = None
    _tail: TailCatchUp = field(default_factory=TailCatchUp)

    @property
    def step(self) -> int:
        """The global index of the next step (kept by `plans`, which the loop reads)."""
        return self.plans.step

    # -- iteration -----------------------------------------------------------------

    def epochs(self) -> Iterator[int]:
        wanted = 0
        while True:
            epoch = self.stream.begin_epoch(wanted)
            if epoch is None:
                return
            self.epoch = epoch
            self._tail.reset()
            yield epoch
            self.finish(time.perf_counter())
            self.stream.finish_epoch(epoch)
            wanted = epoch + 1

    def steps(self) -> Iterator[Step]:
        epoch = self.epoch
        if epoch is None:
            raise RuntimeError("iterate agent.epochs() and call agent.steps() inside it")
        try:
            while True:
                t0 = time.perf_counter()
                self.finish(t0)
                step = self._begin(epoch, t0)
                if step is None:
                    return
                yield step
        finally:
            self.finish(time.perf_counter(), abandoned=True)

    def _begin(self, epoch: int, t0: float) -> Step | None:
        wall0 = time.time()
        index, plan = self.plans.fix()
        while True:
            asked = self.ask(plan)
            taken = self.stream.take(asked, epoch)
            t1 = time.perf_counter()
            total = self.count(plan, asked, taken.ids, self.opens(index, plan, taken.ids))
            t2 = time.perf_counter()
            if total > 0:
                break
            if not self.goes_on(epoch):
                return None  # no rank has data left, nor will: over everywhere at once
        return self.open_step(Step(self, index, epoch, plan, taken, total), t0, wall0, t1, t2)

    def _all_sum(self, vector: list[int]) -> list[int]:
        """The step's count (and a path's pace exchange without gradients), routed
        around the ranks that offer in it (known to every rank before it: routing.py)."""
        around = self.sharing.around if self.sharing is not None else frozenset()
        return self.collectives().all_sum(vector, around)

    def _count_sum(self, vector: list[int]) -> list[int]:
        """The step's count: routed as `_all_sum`, with an offering rank's part and its
        sum passing between it and its partner through the claim store (routing.Posts)."""
        sharing = self.sharing
        if sharing is None:
            return self._all_sum(vector)
        epoch = -1 if self.epoch is None else self.epoch
        posts = sharing.posts(epoch, self.plans.step)
        return self.collectives().all_sum(vector, sharing.around, posts)

    def ask(self, plan: Plan, cap: int | None = None) -> int:
        """The samples this rank takes for a step under `plan`: its local batch, or at an
        epoch's tail the share of ranks that ran out too (tail.py), within `cap` and its
        `max_local_batch`."""
        caps = [c for c in (cap, self.max_local_batch) if c is not None]
        return self._tail.ask(plan.local_batch, self.rank, min(caps) if caps else None)

    def opens(self, index: int, plan: Plan, ids: list[int]) -> Callable[[AllSum], int] | None:
        """Under work sharing, the step's count that opens its offers (claims follow it);
        on both data paths. None without sharing."""
        if self.sharing is None:
            return None
        may_decide = self.hook_state is None
        return partial(self.sharing.open, index, plan, self.rank, ids, may_decide=may_decide)

    def count(
        self,
        plan: Plan,
        asked: int,
        ids: list[int],
        opens: Callable[[AllSum], int] | None = None,
    ) -> int:
        """The step's count all-reduce (through `opens` under work sharing, which adds
        its offers), with the tail slot: the step's total; the next `ask` follows it."""
        local = plan.local_batch[self.rank]
        full_share = TailCatchUp.full_share(local, asked, len(ids))
        holds = int(local == 0 and self.epoch is not None and self.stream.holds(self.epoch))
        index, newest = self.plans.step, self.plans.newest_version
        vote = self.restarts.restart_vote(index) if self.restarts is not None else 0
        slots = [full_share, holds, newest, newest * newest, vote]
        counting = _TailCount(self._count_sum, slots)
        total = opens(counting) if opens is not None else counting([len(ids)])[0]
        full_sum, holders, newest_sum, newest_squares, votes = counting.sums
        self._tail.counted(plan.local_batch, full_sum, holders, holds)
        self.plans.agree(newest_sum, newest_squares)
        if self.restarts is not None:
            self.restarts.restart_counted(index, votes)
        return total

    def open_step(self, step: Step, t0: float, wall0: float, t1: float, t2: float) -> Step:
        """Begin `step` (its data came between t0 and t1, its count until t2)."""
        step._t0, step._wall0, step._t_yield = t0, wall0, t2
        step._data_s, step._count_s = t1 - t0, t2 - t1
        if self.hook_state is not None:
            self.hook_state.update(len(step.sample_ids), step.total_samples)
        self._open = step
        self.plans.began()
        return step

    def goes_on(self, epoch: int) -> bool:
        """A step's count summed zero samples: True when the group goes on in `epoch`. It
        does while a rank the plan gives 0 still holds samples (it takes them next step:
        the ledger counts them in flight until trained, so settling would wait for them
        for good), else as the ledger and the group agree (`_taken_up_again`)."""
        return self._tail.drains or self._taken_up_again(epoch)

    def _taken_up_again(self, epoch: int) -> bool:
        """The group is out of data in `epoch`: True when it goes on in it. Each rank asks
        the ledger and the group agrees, round after round: any REOPENED takes all back
        into the epoch; else any "wait" makes all ask again; else all leave it."""
        answer = self.stream.settle(epoch)
        while (agreed := self.collectives().agree_max(SETTLE_CODES[answer])) == SETTLE_WAIT:
            answer = self.stream.settle_again()
        reopen = agreed == SETTLE_CODES[Settled.REOPENED]
        self.stream.end_settle(reopen)
        return reopen

    def open_step_unsynced(self) -> bool:
        return self._open is not None and not self._open.synced

    # -- compute, sync and bookkeeping ------------------------------------------------

    def claims(self, step: Step) -> Iterator[MicroBatch]:
        if step is not self._open or step.synced:
            raise RuntimeError(f"step {step.index} is not open")
        if self.sharing is None or self.hook_state is not None:
            # DDP's hook weights by the own count: the rank's own micro-batches only.
            micro = own_micro_batches(step.micro_batches, self.rank)
        else:
            if step._computed is not None:  # a second pass would hand out nothing it may redo
                raise RuntimeError(f"step.claims() of step {step.index} was already iterated")
            step._computed, step._claiming = [], True
            factor = self.schedule.factor(self.rank, self.host, step.index) if self.schedule else 1
            micro = self.sharing.claims(
                step.micro_batches, step.total_samples, step._computed, factor
            )
        loaded = step._loaded
        yield from micro if loaded is None else loaded.attach(micro, self.rank)
        step._claiming = False

    def _computed_ids(self, step: Step, model: Any) -> list[int]:
        """The ids whose gradients this rank holds; under work sharing they are scaled
        to the mean over them, so the weighted all-reduce weighs them by their count. A
        script that never iterated `claims()` computed its own ids: they are claimed now
        (so no helper takes one), and it is an error if a helper already has one."""
        if self.sharing is None:
            return step.sample_ids
        if step._computed is None:
            self.sharing.keep_own(step.index)
            return step.sample_ids
        if step._claiming:
            raise RuntimeError("under work sharing, iterate step.claims() to its end before sync")
        if model is not None and step._computed:
            from antdt.agent.gradients import scale_gradients

            scale_gradients(model, step.total_samples / len(step._computed))
        return step._computed

    def _claim_s(self, step: Step) -> float:
        """The step's claim store round trips: communication, not the rank's compute (a
        rank behind a slow link would look slow in compute)."""
        if self.sharing is None:
            return 0.0
        return self.sharing.claim_s

    def _slowed_in_claims(self, step: Step) -> bool:
        """Under work sharing the injected slowdown is slept per micro-batch computed
        (a helper computes another's at its own speed), not at sync."""
        return self.sharing is not None and step._computed is not None

    def _helped(self, step: Step) -> tuple[tuple[int, int], ...]:
        if self.sharing is None:
            return ()
        return tuple(sorted(self.sharing.helped.items()))

    def _one_piece_s(self, step: Step) -> float | None:
        if self.sharing is None:
            return None
        return self.sharing.one_piece

    def sync(self, step: Step, model: Any) -> int:
        if step is not self._open or step.synced:
            raise RuntimeError(f"step {step.index} is not open (sync called twice or late)")
        wait_for_device()  # on a GPU the backward is queued: time its end, not its launch
        t_sync = time.perf_counter()
        if self.schedule and not self._slowed_in_claims(step):
            extra = self.schedule.extra_sleep(
                self.rank, self.host, step.index, t_sync - step._t_yield
            )
            if extra > 0:
                time.sleep(extra)  # the injected straggler: compute takes factor x as long
        t_a = time.perf_counter()
        if self.sharing is not None:
            self.sharing.settle_late()  # a path that never decided: no helper waits on it
        ids = self._computed_ids(step, model)
        step._computed = ids
        self._reduce(step, model, len(ids))
        step._comm_s = step._count_s + self._claim_s(step) + (time.perf_counter() - t_a)
        step.synced = True
        if self.log_ids is not None:
            self.log_ids(SampleLine(step.epoch, step.index, ids))
        if step._lot is not None:
            self.stream.reached(step._lot)
        else:
            self.stream.synced(step._finished)
        return step.total_samples

    def _reduce(self, step: Step, model: Any, samples: int) -> None:
        """The step's gradient all-reduce (unless DDP's hook did it), with work sharing's
        pace report appended: every rank learns the others' paces for the next step's
        offers at no extra latency. On a path without it, the report goes alone; none on
        the path where sharing cannot act (the DDP hook)."""
        reduce = model is not None and model is not self.ddp_model
        sharing = self.sharing
        if sharing is None or self.hook_state is not None:
            if reduce:
                self.collectives().reduce_gradients(model, samples)
        elif reduce:
            report = sharing.report()
            summed = self.collectives().reduce_gradients_and_sum(
                model, samples, report, sharing.around
            )
            sharing.learn(summed)
        else:
            sharing.exchange(self._all_sum)

    def finish(self, t_end: float, *, abandoned: bool = False) -> None:
        """Close the open step at `t_end` (the next step's start, or the epoch's end) and
        hand its record to the loop."""
        step = self._open
        if step is None:
            return
        if not step.synced:
            if abandoned:  # the script left the loop mid-step: nothing reached the model
                self._open = None
                return
            raise RuntimeError(f"call step.sync(model) before starting step {step.index + 1}")
        self._open = None
        self.emit(
            StepRecord(
                step=step.index,
                epoch=step.epoch,
                plan_version=step.plan_version,
                local_batch=step.local_batch,
                samples=len(step._computed or ()),  # computed: others' too, under sharing
                data_wait_s=step._data_s,
                comm_s=step._comm_s,
                step_s=t_end - step._t0,
                started_at=step._wall0,
                helped=self._helped(step),
                one_piece_s=self._one_piece_s(step),
            )
        )


class _TailCount:
    """An AllSum for the step's count that carries more slots the step's ranks agree
    through and keeps their sums (`sums`): the rank's full share and whether the plan
    gives it 0 while it holds samples (TailCatchUp), its newest plan version and that
    squared (StepPlans.agree), its vote for a restart checkpointing at the step
    (RestartVotes)."""

    def __init__(self, sums: AllSum, slots: list[int]) -> None:
        self._sums, self._slots = sums, slots
        self.sums: list[int] = []  # filled by the count, which every step runs once

    def __call__(self, vector: list[int]) -> list[int]:
        summed = self._sums([*vector, *self._slots])
        cut = len(summed) - len(self._slots)
        self.sums = summed[cut:]
        return summed[:cut]


class RestartVotes(Protocol):
    """A restart the ranks must all take or none (the agent's command handler)."""

    def restart_vote(self, step: int) -> int:
        """1 when this rank took a restart checkpointing at `step`, else 0."""
        ...

    def restart_counted(self, step: int, votes: int) -> None:
        """`step`'s count found `votes` ranks holding its restart."""
        ...
