"""The simulated cluster: every rank's compute factor and link factor at every step,
vectorized (numpy). Deterministic for the scenario's seed: the noise and episodes drawn
do not depend on what a policy does, so every policy of a run meets the same cluster.
A rank moved to a spare node (KILL_RESTART) leaves its node's slowdowns behind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from antdt.sim.files import ScenarioFile

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Episodes:
    """Slowdowns as columns: rank, first step, end step (exclusive), factor, link?"""

    rank: Ints
    start: Ints
    end: Ints
    factor: Floats
    link: Bools


def episodes(scenario: ScenarioFile, rng: np.random.Generator) -> Episodes:
    """The scenario's fixed slowdowns and its random contention, one row per rank."""
    rows: list[tuple[int, int, int, float, bool]] = []
    steps = scenario.steps
    for s in scenario.slowdowns:
        end = steps if s.steps is None else min(steps, s.start_step + s.steps)
        ranks = set(s.ranks)
        for node in s.nodes:
            first = node * scenario.ranks_per_node
            ranks.update(range(first, min(scenario.ranks, first + scenario.ranks_per_node)))
        rows.extend((r, s.start_step, end, s.factor, s.kind == "link") for r in sorted(ranks))
    table = np.array(rows, dtype=np.float64).reshape(-1, 5)
    c = scenario.contention
    if c is not None and c.episodes_per_rank > 0:
        count = rng.poisson(c.episodes_per_rank * scenario.ranks)
        start = rng.integers(0, steps, count)
        persistent = rng.random(count) < c.persistent_share
        length = rng.integers(c.transient_steps[0], c.transient_steps[1] + 1, count)
        ends = np.where(persistent, steps, np.minimum(steps, start + length))
        drawn = np.column_stack(
            (
                rng.integers(0, scenario.ranks, count),
                start,
                ends,
                rng.uniform(c.factor[0], c.factor[1], count),
                np.zeros(count),
            )
        )
        table = np.vstack((table, drawn))
    return Episodes(
        table[:, 0].astype(np.int64),
        table[:, 1].astype(np.int64),
        table[:, 2].astype(np.int64),
        table[:, 3],
        table[:, 4] > 0,
    )


def generation_factors(scenario: ScenarioFile, rng: np.random.Generator) -> Floats:
    """Per-rank compute factor of its hardware generation (1 where none is given),
    generations assigned to whole nodes in a seeded order."""
    factors = np.ones(scenario.ranks)
    nodes = rng.permutation(scenario.nodes)
    taken = 0
    for g in scenario.generations:
        count = round(g.share * scenario.nodes)
        for node in nodes[taken : taken + count]:
            first = int(node) * scenario.ranks_per_node
            factors[first : first + scenario.ranks_per_node] = g.factor
        taken += count
    return factors


class Cluster:
    """Per-step factors of one run. `step(s)` must be called with s = 0, 1, 2, ..."""

    def __init__(
        self, scenario: ScenarioFile, *, keep: Callable[[Episodes], Bools] | None = None
    ) -> None:
        """`keep`: which episodes this cluster has (the same generations and noise)."""
        rng = np.random.default_rng(scenario.seed)
        self.scenario = scenario
        self.base = generation_factors(scenario, rng)
        self.episodes = episodes(scenario, rng)
        if keep is not None:
            self.episodes = _where(self.episodes, keep(self.episodes))
        self._noise_seed = int(rng.integers(0, 2**63 - 1))
        self._noise = np.random.default_rng(self._noise_seed)
        self.moved_at = np.full(scenario.ranks, -1, dtype=np.int64)  # step of last move
        order = np.argsort(self.episodes.start, kind="stable")
        self._by_start = order
        self._active: Ints = np.zeros(0, dtype=np.int64)
        self._next = 0

    def step(self, s: int) -> tuple[Floats, Floats]:
        """(compute factor, link factor) of every rank at step `s`: generation x active
        episodes x noise, and the active link episodes' factor (1 where none)."""
        speed, jitter, link = self.step_parts(s)
        return speed * jitter, link

    def step_parts(self, s: int) -> tuple[Floats, Floats, Floats]:
        """`step`'s compute factor as its two parts, with the link factor: each rank's
        speed (generation x active episodes), which a policy can learn, and the step's
        random jitter (1 without noise), which nobody knows before the step."""
        e, order = self.episodes, self._by_start
        begin = self._next
        while self._next < len(order) and e.start[order[self._next]] <= s:
            self._next += 1
        self._active = np.concatenate((self._active, order[begin : self._next]))
        self._active = self._active[e.end[self._active] > s]
        live = self._active[e.start[self._active] > self.moved_at[e.rank[self._active]]]
        compute = self.base.copy()
        link = np.ones(self.scenario.ranks)
        on_link = e.link[live]
        np.multiply.at(compute, e.rank[live[~on_link]], e.factor[live[~on_link]])
        np.multiply.at(link, e.rank[live[on_link]], e.factor[live[on_link]])
        cv, jitter = self.scenario.noise_cv, np.ones(self.scenario.ranks)
        if cv > 0:
            jitter = self._noise.lognormal(-0.5 * cv * cv, cv, self.scenario.ranks)
        return compute, jitter, link

    def move(self, rank: int, s: int) -> None:
        """The rank runs on a spare node from step `s`: slowdowns begun before are not its."""
        self.moved_at[rank] = s


def _where(e: Episodes, mask: Bools) -> Episodes:
    return Episodes(e.rank[mask], e.start[mask], e.end[mask], e.factor[mask], e.link[mask])
