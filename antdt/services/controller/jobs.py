"""The jobs this replica owns. A job's state is loaded from etcd when the job is claimed
(at registration or in a claim round) and dropped when ownership goes or the job ends;
event handlers only look states up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from antdt.runtime.bus import Rejected
from antdt.runtime.coordination.ended import EndedJobs
from antdt.runtime.coordination.jobs import expired, read_ended, remove_job, scan_jobs
from antdt.runtime.coordination.ownership import Ownership
from antdt.runtime.shared import SharedCalls
from antdt.runtime.store import Compare, Delete, Get, Put, Store, decode_stored
from antdt.schemas import (
    ErrorCode,
    Incident,
    JobHealth,
    JobSpec,
    Keys,
    Plan,
    RegisterReply,
    RestartLedger,
)
from antdt.services.controller.hellos import RankHellos
from antdt.services.controller.plans import initial_plan
from antdt.services.controller.state import JobState

log = structlog.get_logger("antdt.controller.jobs")
#: Seconds between sweeps for ended jobs past their retention, at most.
RETENTION_SWEEP_S = 3600.0


#: The incidents a job's previous owner left open (leftopen.open_incidents), by job.
LeftOpen = Callable[[str], Awaitable[list[Incident]]]


class OwnedJobs:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        ownership: Ownership,
        hellos: RankHellos,
        left_open: LeftOpen | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.ownership = ownership
        self.hellos = hellos
        self.left_open = left_open
        self.states: dict[str, JobState] = {}
        self.ended = EndedJobs(store, keys)
        self.loads = 0  # states loaded from etcd so far
        self._loading: SharedCalls[JobState | None] = SharedCalls(failed=None)

    async def claim(self, job: str) -> JobState | None:
        """Claim `job` unless another replica owns it; load its state if not loaded."""
        if not self.ownership.owns(job):
            await self.ownership.try_acquire(job)
        if not self.ownership.owns(job):
            return None
        state = self.states.get(job)
        if state is not None:
            return state
        return await self._loading.run(job, lambda: self._load(job))

    async def get(self, job: str) -> JobState | None:
        """The state of `job` if owned, live and loaded (waits for a load under way)."""
        if self.ended.known(job) is not None:
            return None
        if not self.ownership.owns(job):
            self.states.pop(job, None)
            return None
        loading = self._loading.under_way(job)
        if loading is not None:
            await asyncio.shield(loading)
        return self.states.get(job)

    async def for_request(self, job: str) -> JobState | None:
        """The state to answer a request about `job` with (a proposal): ours, claimed now
        if nobody owns it; None when another replica owns it (it answers). Raises Rejected
        for a job with no spec (unknown_job) or one that ended (job_ended), whoever asks,
        and unavailable when etcd cannot say."""
        state = await self.get(job)
        if state is not None:
            return state
        try:
            if await self.store.get(self.keys.spec(job)) is None:
                raise Rejected(ErrorCode.UNKNOWN_JOB, f"job {job!r} is not registered")
            end = await self.ended.read(job)  # fresh: it may have been registered again
            if end is not None:
                raise Rejected(
                    ErrorCode.JOB_ENDED, f"job {job!r} ended (every rank exited at step {end.step})"
                )
            return await self.claim(job)
        except (Rejected, asyncio.CancelledError):
            raise
        except Exception as exc:  # etcd away: the asker retries
            raise Rejected(ErrorCode.UNAVAILABLE, f"job {job!r}: store unavailable") from exc

    def forget(self, job: str) -> None:
        self.states.pop(job, None)

    async def end(self, health: JobHealth) -> None:
        """Every rank stopped on purpose (the job's last health): drop the state, and give
        the job up (its registration claims it again)."""
        job = health.job
        self.states.pop(job, None)
        self.ended.note(health)
        log.info("job ended; state dropped", job=job)
        try:
            await self.ownership.release(job)
        except Exception as exc:  # etcd away: the job stays claimed, which is harmless
            log.warning("ended job not released", job=job, error=str(exc))

    async def _load(self, job: str) -> JobState | None:
        spec = await self.store.get_model(self.keys.spec(job), JobSpec)
        plan = await self.store.get_model(self.keys.plan(job), Plan)
        if spec is None or plan is None:
            return None
        ledger = await self.store.get_model(self.keys.restarts(job), RestartLedger)
        state = JobState(spec=spec[0], plan=plan[0], plan_revision=plan[1])
        if ledger is not None:
            state.restarts, state.restarts_revision = ledger
        for hello in await self.hellos.load(job):
            state.learn_hello(hello)
        for incident in await self._open_incidents(job):
            state.learn_incident(incident)
        # A takeover (or a restart of this replica): finish what was in flight.
        state.resume_pending = state.plan.version > 0 or state.restarts.pending is not None
        if not self.ownership.owns(job) or self.ended.known(job) is not None:
            return None  # lost, or ended, while loading
        self.loads += 1
        self.states[job] = state
        return state

    async def _open_incidents(self, job: str) -> list[Incident]:
        """The job's incidents still open: a takeover must decide knowing them (lb-bsp
        would undo a mitigation whose straggler it does not know of; antdt-nd would wait
        for a transition that, for an escalated incident, comes only as it resolves).
        None read when the stream cannot be (logged): the next transitions teach them."""
        if self.left_open is None:
            return []
        try:
            return await self.left_open(job)
        except Exception as exc:  # the stream away: the claim goes on
            log.warning("open incidents unread", job=job, error=str(exc))
            return []


async def register(store: Store, keys: Keys, spec: JobSpec, now: float) -> RegisterReply:
    """Store the spec and the initial plan if the job has none; else the stored ones.
    Either way its `ended` and `abandoned` marks go: a job registered again is live."""
    plan = initial_plan(spec, now)
    spec_key, plan_key = keys.spec(spec.job), keys.plan(spec.job)
    ended = [Delete(keys.ended(spec.job)), Delete(keys.abandoned(spec.job))]
    result = await store.txn(
        [Compare.absent(spec_key)],
        [
            Put(spec_key, spec.model_dump_json().encode()),
            Put(plan_key, plan.model_dump_json().encode()),
            *ended,
        ],
        [Get(spec_key), Get(plan_key), *ended],
    )
    if result.succeeded:
        log.info("job registered", job=spec.job, policy=spec.policy, world_size=spec.world_size)
        return RegisterReply(spec=spec, plan=plan, created=True)
    stored_spec, stored_plan = result.gets
    if stored_spec is None or stored_plan is None:
        raise Rejected(ErrorCode.UNAVAILABLE, "job is being registered; retry")
    return RegisterReply(
        spec=decode_stored(stored_spec.key, stored_spec.value, JobSpec),
        plan=decode_stored(stored_plan.key, stored_plan.value, Plan),
        created=False,
    )


async def remove_old_jobs(store: Store, keys: Keys, retention_s: float) -> None:
    """Run as a task: remove the keys of jobs ended `retention_s` ago. Each removal holds
    only while the job's `ended` key is unchanged: replicas never remove twice, and a
    job registered again is never removed."""
    interval_s = min(max(retention_s / 4, 0.1), RETENTION_SWEEP_S)
    while True:
        try:
            scanned, now = await scan_jobs(store, keys), time.time()
            ended = await read_ended(store, keys, scanned.ended, ledgers_before=now - retention_s)
            for record in expired(ended, now, retention_s):
                await remove_job(store, keys, record)
        except Exception as exc:  # etcd away: the next sweep
            log.info("job retention sweep failed", error=repr(exc))
        await asyncio.sleep(interval_s)
