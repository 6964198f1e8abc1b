"""Jobs as etcd sees them (`jobs/{job}/...`): which are registered, ended or dormant,
and the removal of an ended job's keys once its retention is over (nothing else deletes
them). Shared by the monitor, the controller (the sweep) and the CLI (`antdt jobs`);
ended.py answers "has this job ended" for the services."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import structlog

from antdt.runtime.store import (
    Compare,
    Delete,
    Store,
    StoredValueInvalid,
    decode_object,
    decode_stored,
)
from antdt.schemas import JobHealth, Keys

log = structlog.get_logger("antdt.jobs")


@dataclass(frozen=True)
class Ended:
    """An ended job: its last health's time (Unix s) and step, the mod revision of its
    `ended` key (a removal holds only while it is unchanged), and whether its data is
    finished (ledger complete or none; None: not read): an unfinished ledger is kept
    for a later run to restore."""

    job: str
    at: float
    step: int
    revision: int
    finished: bool | None = True
    readable: bool = True  # False: not a JobHealth (at and step are then 0)


@dataclass(frozen=True)
class JobKeys:
    """What one prefix scan of `jobs/` says: the registered jobs, the ended ones, and the
    dormant ones (ended as abandoned: they may step on), most recently abandoned first."""

    registered: frozenset[str]
    ended: frozenset[str]
    dormant: tuple[str, ...] = ()

    def live(self, also: Iterable[str] = ()) -> list[str]:
        """Registered (or in `also`) and not ended, sorted: the jobs worth claiming."""
        return sorted((self.registered | set(also)) - self.ended)


async def scan_jobs(store: Store, keys: Keys) -> JobKeys:
    found = await store.get_prefix(keys.jobs(), keys_only=True)
    registered = {job for job in (keys.job_of_spec_key(f.key) for f in found) if job}
    ended = {job for job in (keys.job_of_ended_key(f.key) for f in found) if job}
    abandoned = {job: f.mod_revision for f in found if (job := keys.job_of_abandoned_key(f.key))}
    dormant = sorted((j for j in abandoned if j in ended), key=abandoned.__getitem__, reverse=True)
    return JobKeys(frozenset(registered), frozenset(ended), tuple(dormant))


async def live_jobs(store: Store, keys: Keys, also: Iterable[str] = ()) -> list[str]:
    """Jobs registered (a spec), and `also` these, that have not ended, sorted: the ones
    worth claiming. An ended job's keys stay in etcd for its history (until its
    retention), but nobody owns it: claim rounds and ownership slots grow with live jobs
    only."""
    return (await scan_jobs(store, keys)).live(also)


async def read_ended(
    store: Store, keys: Keys, jobs: Iterable[str], *, ledgers_before: float = math.inf
) -> list[Ended]:
    """The `ended` records of `jobs` (those gone meanwhile are left out; an unreadable
    one counts as ended at time 0, so that a retention removes it). Whether the data
    finished is read (the ledger: up to a few hundred kB) only for jobs that ended
    before `ledgers_before`, Unix seconds: a sweep needs it only for those it may
    remove."""
    records = []
    for job in sorted(jobs):
        record = await read_end(store, keys, job)
        if record is None:
            continue
        if record.at < ledgers_before:
            record = replace(record, finished=await _ledger_finished(store, keys, job))
        records.append(record)
    return records


async def read_end(store: Store, keys: Keys, job: str) -> Ended | None:
    """The job's `ended` record, None if it has not ended; its data is not read
    (`finished` None). An unreadable one is logged and counts as ended at time 0."""
    stored = await store.get(keys.ended(job))
    if stored is None:
        return None
    try:
        health = decode_stored(stored.key, stored.value, JobHealth)
    except StoredValueInvalid:
        log.warning("ended record unreadable", job=job)
        return Ended(job, 0.0, 0, stored.mod_revision, None, readable=False)
    return Ended(job, health.at, health.step, stored.mod_revision, None)


async def _ledger_finished(store: Store, keys: Keys, job: str) -> bool:
    """No ledger, or one whose `complete` flag is set. Read as plain JSON (the ledger's
    model belongs to the shards service); an unreadable one counts as unfinished."""
    stored = await store.get(keys.ledger(job))
    if stored is None:
        return True
    try:
        return decode_object(stored.key, stored.value).get("complete") is True
    except StoredValueInvalid:
        return False


def expired(records: Iterable[Ended], now: float, retention_s: float) -> list[Ended]:
    """The finished jobs ended at least `retention_s` before `now` (none when
    retention_s <= 0: kept for good). An unfinished one is kept: a later run of the job
    restores its ledger from a checkpoint (`antdt jobs remove` deletes it by hand)."""
    if retention_s <= 0:
        return []
    return [r for r in records if r.finished is True and now - r.at >= retention_s]


async def remove_job(store: Store, keys: Keys, record: Ended) -> bool:
    """Delete every key of the ended job, only if its `ended` key is still the one read
    (registering the job again deletes it: a job run again is never removed)."""
    result = await store.txn(
        [Compare.mod_is(keys.ended(record.job), record.revision)],
        [Delete(keys.job(record.job), prefix=True)],
    )
    if result.succeeded:
        log.info("ended job removed", job=record.job, ended_at=record.at, step=record.step)
    return result.succeeded
