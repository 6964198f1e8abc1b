"""The step cursor and the plans it runs under: the one record of which step comes next.
The training thread fixes a step's plan as its take starts; the loop accepts commanded
plans against the cursor under the same lock (an ack's `applied_step`: the earliest step
the plan can start at), and a plan starts once a step's count found every rank holding
it, at the same step on every rank."""

from __future__ import annotations

import threading

from antdt.agent.errors import AgentError
from antdt.agent.plans import Judgement, PlanBook, Verdict, applied_step
from antdt.schemas import Plan


class StepPlans:
    """Thread-safe: the plan book, the next step's index and the plan fixed for it."""

    def __init__(self, job: str, world_size: int) -> None:
        self._job = job
        self._world_size = world_size
        self._lock = threading.Lock()
        self._book = PlanBook()
        self._next = 0  # the global index of the next step to run
        self._fixed: Plan | None = None  # the plan of step `_next`, once its take started

    @property
    def step(self) -> int:
        """The global index of the next step."""
        return self._next

    def _first_open(self) -> int:
        """The first step whose plan is not fixed yet (a new plan can start there)."""
        return self._next + (self._fixed is not None)

    @property
    def first_open(self) -> int:
        with self._lock:
            return self._first_open()

    @property
    def plan(self) -> Plan:
        """The plan of the first step whose plan is not fixed yet."""
        with self._lock:
            return self._book.select(self._first_open())

    def plan_at(self, step: int) -> Plan:
        """The plan step `step` (>= the next) runs under as things stand; not fixed: a plan
        commanded meanwhile may still change it (a DataLoader reading ahead re-cuts)."""
        with self._lock:
            if step == self._next and self._fixed is not None:
                return self._fixed
            return self._book.select(step)

    # -- the training thread ------------------------------------------------------------

    def fix(self) -> tuple[int, Plan]:
        """The next step's index and its plan, fixed from now on (a repeat returns both)."""
        with self._lock:
            if self._fixed is None:
                self._fixed = self._book.select(self._next)
            return self._next, self._fixed

    def began(self) -> None:
        """The step whose plan was fixed has begun: the cursor moves to the one after."""
        with self._lock:
            self._next += 1
            self._fixed = None

    def rewind(self, first: int) -> None:
        """A restore: the next step is `first` (a checkpoint's step + 1), no plan fixed."""
        with self._lock:
            self._next, self._fixed = first, None

    # -- the loop -----------------------------------------------------------------------

    def adopt(self, plan: Plan) -> None:
        """The plan registration answered with, run from its effective step: the job's
        plan, which every rank is given. A newer one a command brought is kept, to start
        once a step's count finds every rank holding it."""
        with self._lock:
            judgement = self._judge(plan)
            if judgement.verdict is Verdict.BAD:
                raise AgentError(f"registered plan unusable: {judgement.reason}")
            first_open = self._first_open()
            self._book = self._book.add(plan, plan.effective_step, first_open, agreed=True)

    def offer(self, plan: Plan) -> tuple[Judgement, int]:
        """A commanded plan: the judgement, and the step it applies at (ACCEPT, SAME): the
        earliest it can, until a step's count agrees on it (`agree`)."""
        with self._lock:
            judgement = self._judge(plan)
            if judgement.verdict is Verdict.SAME:
                return judgement, self._book.applied_step(plan)
            if judgement.verdict is not Verdict.ACCEPT:
                return judgement, -1
            at = applied_step(plan, self._first_open())
            alone = self._world_size == 1  # a job of one rank holds what it holds
            self._book = self._book.add(plan, at, self._first_open(), agreed=alone)
            return judgement, at

    @property
    def newest_version(self) -> int:
        """The version of the newest plan this rank holds (-1: none), for a step's count."""
        with self._lock:
            newest = self._book.newest
            return -1 if newest is None else newest.version

    def agree(self, newest_sum: int, newest_squares: int) -> None:
        """A step's count summed every rank's `newest_version` and its square: when they
        are all one version (then and only then the sums are n x v and n x v^2), every
        rank holds that plan and all start it at the same step, its effective one or the
        first whose plan is not fixed yet (the count's step is fixed everywhere)."""
        n = self._world_size
        version, rest = divmod(newest_sum, n)
        if rest or version < 0 or newest_squares != n * version * version:
            return
        with self._lock:
            self._book = self._book.agree(version, self._first_open())

    def _judge(self, plan: Plan) -> Judgement:
        return self._book.judge(plan, job=self._job, world_size=self._world_size)
