"""Simulator scenario files (TOML): the cluster, its slowdowns and the policies to
compare. Validated by pydantic: an unknown or bad field is refused with its name and
the reason (`ScenarioError`). Format: docs/architecture.md, "The simulator"."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # the `sim` extra installs tomli there
    import tomli as tomllib

Positive = Annotated[float, Field(gt=0)]
Factor = Annotated[float, Field(gt=0, le=1000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Generation(_Strict):
    """A share of the ranks whose compute takes `factor` x the base (a slower GPU
    generation > 1, a faster one < 1): deterministic, the whole run."""

    share: float = Field(gt=0, le=1)
    factor: Factor


class Slowdown(_Strict):
    """A fixed slowdown: `ranks`, or every rank of `nodes`, from `start_step` for `steps`
    steps (None: to the end); `compute` multiplies their compute, `link` their part of
    every step's gradient exchange (everyone waits for the slowest link)."""

    ranks: tuple[Annotated[int, Field(ge=0)], ...] = ()
    nodes: tuple[Annotated[int, Field(ge=0)], ...] = ()
    start_step: int = Field(default=0, ge=0)
    steps: int | None = Field(default=None, ge=1)
    factor: Factor
    kind: Literal["compute", "link"] = "compute"

    @model_validator(mode="after")
    def _someone(self) -> Slowdown:
        if not self.ranks and not self.nodes:
            raise ValueError("a slowdown needs ranks or nodes")
        return self


class Contention(_Strict):
    """Random noisy-neighbour episodes (a non-dedicated cluster): each rank has about
    `episodes_per_rank` over the run, starting uniformly; a `persistent_share` of them
    last to the end, the others `transient_steps` (uniform, inclusive); each slows
    compute by a factor drawn uniformly from `factor`."""

    episodes_per_rank: float = Field(ge=0, le=100)
    transient_steps: tuple[int, int] = (5, 50)
    persistent_share: float = Field(default=0.2, ge=0, le=1)
    factor: tuple[Factor, Factor] = (1.5, 4.0)

    @model_validator(mode="after")
    def _ranges(self) -> Contention:
        if not 1 <= self.transient_steps[0] <= self.transient_steps[1]:
            raise ValueError("transient_steps must be [low, high] with 1 <= low <= high")
        if not self.factor[0] <= self.factor[1]:
            raise ValueError("factor must be [low, high] with low <= high")
        return self


POLICY_NAMES = ("none", "lb-bsp", "antdt-nd", "antdt-dd")


class ScenarioFile(_Strict):
    """One scenario: a job of `ranks` ranks on nodes of `ranks_per_node`, `steps` steps
    of `local_batch` samples per rank (the global batch kept), compute per step
    (fixed_s + per_sample_s x batch) x the rank's factors x noise, plus comm_s."""

    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    seed: int = Field(default=0, ge=0)
    ranks: int = Field(ge=2, le=100_000)
    ranks_per_node: int = Field(default=8, ge=1)
    steps: int = Field(ge=1, le=1_000_000)
    local_batch: int = Field(default=32, ge=1)
    fixed_s: float = Field(default=0.002, ge=0)
    per_sample_s: Positive = 0.001
    comm_s: float = Field(default=0.005, ge=0)
    noise_cv: float = Field(default=0.03, ge=0, le=1)
    link_rtt_s: Positive = 0.005
    restart_cost_s: float = Field(default=30.0, ge=0)
    spares: int = Field(default=2, ge=0)
    health_period_s: Positive = 1.0
    monitor_every: int = Field(default=1, ge=1)
    policies: tuple[str, ...] = POLICY_NAMES
    policy_params: dict[str, float | int | str | bool] = Field(default_factory=dict)
    generations: tuple[Generation, ...] = ()
    slowdowns: tuple[Slowdown, ...] = ()
    contention: Contention | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioFile:
        if sum(g.share for g in self.generations) > 1 + 1e-9:
            raise ValueError("generations: shares sum to more than 1")
        nodes = -(-self.ranks // self.ranks_per_node)
        for s in self.slowdowns:
            if any(r >= self.ranks for r in s.ranks) or any(n >= nodes for n in s.nodes):
                raise ValueError(f"slowdowns: ranks < {self.ranks} and nodes < {nodes}")
        unknown = [p for p in self.policies if p not in POLICY_NAMES]
        if unknown:
            raise ValueError(f"policies: unknown {unknown} (known: {list(POLICY_NAMES)})")
        return self

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)


class ScenarioError(ValueError):
    """A scenario file that is not valid: every bad field, with its reason."""


def parse_scenario(text: str, source: str = "<scenario>") -> ScenarioFile:
    """The scenario in TOML `text`; ScenarioError naming each bad field and why."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not TOML: {exc}") from exc
    try:
        return ScenarioFile.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {field_problems(exc)}") from exc


def field_problems(exc: ValidationError) -> str:
    """Each bad field of a scenario and why, on one line: `field: reason; ...`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors()
    )


def load_scenario(path: Path, **overrides: object) -> ScenarioFile:
    """The scenario file at `path`, with `overrides` (e.g. ranks, steps) applied and
    validated as if written in the file."""
    scenario = parse_scenario(path.read_text(), str(path))
    if not overrides:
        return scenario
    try:
        return ScenarioFile.model_validate({**scenario.model_dump(), **overrides})
    except ValidationError as exc:
        raise ScenarioError(f"{path}: {field_problems(exc)}") from exc
