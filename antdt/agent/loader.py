"""A `torch.utils.data.DataLoader` fed by the ledger: `agent.batch_sampler()` hands the
loader index lists from the shard stream (worker processes, prefetching and pinning stay
the loader's), and `agent.batches(loader)` turns its batches into steps.

Contract (docs/architecture.md, the agent's DataLoader): ids the loader read ahead count
for the ledger only once their step synced; a plan commanded for a step already read ahead
re-cuts: the loader's iteration restarts there and the ids not trained on come first."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Sampler

from antdt.agent.errors import DatasetTooSmall, LoaderError, PlanUnfillable
from antdt.agent.loaded import LoadedBatch, loader_reader
from antdt.agent.readahead import Lot
from antdt.agent.sampling import Taken
from antdt.agent.steps import Step, StepDriver
from antdt.schemas import Plan


@dataclass
class BatchFeed:
    """The sampler's and the step loop's shared record: one iteration (a generation) of
    the loader at a time; a new one rewinds whatever the last one read ahead."""

    driver: StepDriver
    rank: int
    dataset_size: int
    cap: int | None  # the largest local batch the loader may load
    live: Callable[[], object]  # raises AgentClosed once the agent closed
    generation: int = 0
    driving: bool = False  # inside agent.batches(): only then may the loader iterate
    exhausted: bool = False  # this generation found no more data in the epoch
    recuts: int = 0  # iterations restarted because a plan changed a step read ahead
    _next_step: int = 0  # the step the next lot is sampled for

    # -- the sampler's side (called by the DataLoader, in this process) -----------------

    def start(self) -> int:
        self.live()
        if not self.driving:
            raise LoaderError("iterate the DataLoader through agent.batches(loader)")
        self.generation += 1
        self.driver.stream.rewind_ahead()
        self.exhausted = False
        self._next_step = self.driver.plans.step
        return self.generation

    def next_ids(self, generation: int) -> list[int]:
        self.live()
        epoch = self.driver.epoch
        if generation != self.generation or self.exhausted or epoch is None:
            raise StopIteration
        want = self.want(self.driver.plans.plan_at(self._next_step))
        if want == 0:
            raise StopIteration  # paused: the step loop serves that step without data
        lot = self.driver.stream.take_lot(want, self._next_step, epoch)
        if lot is None:
            self.exhausted = True
            raise StopIteration
        self._next_step += 1
        return lot.ids

    def local_batch(self, plan: Plan) -> int:
        batch = plan.local_batch[self.rank]
        if self.cap is not None and batch > self.cap:
            raise PlanUnfillable(
                f"plan {plan.version} gives rank {self.rank} a batch of {batch}, over the "
                f"loader's max_local_batch {self.cap}"
            )
        return batch

    def want(self, plan: Plan) -> int:
        """The lot to sample for a step under `plan`: its local batch, more at an epoch's
        tail (a change re-cuts what was read ahead, as a plan does)."""
        self.local_batch(plan)
        return self.driver.ask(plan, self.cap)

    # -- the step loop -----------------------------------------------------------------

    def check(self, loader: Any) -> None:
        sampler = getattr(loader, "batch_sampler", None)
        if not isinstance(sampler, LedgerBatchSampler) or sampler.feed is not self:
            raise LoaderError("the DataLoader needs batch_sampler=agent.batch_sampler()")
        if getattr(loader, "in_order", True) is False:
            raise LoaderError("the DataLoader must deliver in order (in_order=True)")
        check_dataset(loader.dataset, self.dataset_size)

    def batches(self, loader: Any, empty: Any = None) -> Iterator[tuple[Step, Any]]:
        self.check(loader)
        driver = self.driver
        epoch = driver.epoch
        if epoch is None:
            raise RuntimeError("iterate agent.epochs() and call agent.batches() inside it")
        run, read = _Run(self, loader), loader_reader(loader)
        try:
            while True:
                t0 = time.perf_counter()
                driver.finish(t0)
                wall0 = time.time()
                index, plan = driver.plans.fix()
                want = self.want(plan)
                lot, batch = run.next_for(index, want)
                ids = lot.ids if lot else []
                t1 = time.perf_counter()
                total = driver.count(plan, want, ids, driver.opens(index, plan, ids))
                t2 = time.perf_counter()
                if total == 0:
                    if not driver.goes_on(epoch):
                        return
                    run.restart()  # shards came back into the epoch: a new iteration
                    continue
                step = Step(driver, index, epoch, plan, Taken(ids=ids), total)
                step._lot = lot
                # Also with no data of its own (an epoch's tail): it may help the others.
                step._loaded = LoadedBatch(empty if lot is None else batch, ids, read)
                yield driver.open_step(step, t0, wall0, t1, t2), empty if lot is None else batch
        finally:
            driver.finish(time.perf_counter(), abandoned=True)
            run.restart()


class _Run:
    """The loader's current iteration, matched batch by batch to its lots (in order)."""

    def __init__(self, feed: BatchFeed, loader: Any) -> None:
        self.feed, self.loader = feed, loader
        self.it: Iterator[Any] | None = None

    def restart(self) -> None:
        self.it = None  # dropping it stops its workers; the next iter() rewinds

    def next_for(self, step: int, want: int) -> tuple[Lot | None, Any]:
        """The lot and batch of `step`; (None, None) when this rank has no data for it."""
        stream = self.feed.driver.stream
        while want > 0:
            if self.it is None:
                self.feed.driving = True
                try:
                    self.it = iter(self.loader)
                finally:
                    self.feed.driving = False
            head = stream.next_lot()
            if head is not None and (head.step, head.want) != (step, want):
                self.feed.recuts += 1
                self.restart()  # read ahead under another plan: re-cut from this step
                continue
            try:
                batch = next(self.it)
            except StopIteration:
                if self.feed.exhausted:
                    return None, None
                self.restart()  # paused on a step with no batch: go on from here
                continue
            return stream.deliver_lot(), batch
        return None, None


class LedgerBatchSampler(Sampler[list[int]]):
    """The DataLoader's batch sampler: index lists from the ledger, sized by the plan of
    the step each will be trained at. Iterated only by agent.batches(loader)."""

    def __init__(self, feed: BatchFeed) -> None:
        self.feed = feed

    def __iter__(self) -> Iterator[list[int]]:
        return _Lots(self.feed, self.feed.start())


class _Lots:
    def __init__(self, feed: BatchFeed, generation: int) -> None:
        self.feed, self.generation = feed, generation

    def __iter__(self) -> _Lots:
        return self

    def __next__(self) -> list[int]:
        return self.feed.next_ids(self.generation)


def check_dataset(dataset: Any, dataset_size: int) -> None:
    try:
        size = len(dataset)
    except TypeError:
        raise LoaderError("the dataset must be map-style, with a length") from None
    if size < dataset_size:
        raise DatasetTooSmall(
            f"the dataset has {size} samples, the job's dataset size is {dataset_size}: "
            "ids past its end would fail or be lost"
        )
