"""EndedJobs against a real etcd: the `ended` key is the truth, read through a bounded
memory of the ends read or noted, until the job runs again (`forget`)."""

from __future__ import annotations

import pytest

from antdt.runtime.config import ServiceSettings
from antdt.runtime.coordination.ended import EndedJobs
from antdt.runtime.store import Store
from antdt.schemas import JobHealth, Keys

pytestmark = pytest.mark.integration


def _health(job: str, step: int, at: float = 1000.0) -> JobHealth:
    return JobHealth(
        job=job,
        at=at,
        step=step,
        step_s=0.1,
        samples_per_s=0.0,
        balance_efficiency=1.0,
        plan_version=0,
        ranks=(),
        open_incidents=(),
    )


async def test_an_end_is_read_from_etcd_and_remembered_until_the_job_runs_again(
    settings: ServiceSettings, store: Store
) -> None:
    keys = Keys(settings.etcd.key_prefix)
    ended = EndedJobs(store, keys)
    assert await ended.read("a") is None and not await ended.is_ended("a")
    await store.put(keys.ended("a"), _health("a", 7).model_dump_json().encode())
    # Not remembered as "not ended": the key is read again.
    assert await ended.is_ended("a")
    end = ended.known("a")
    assert end is not None and (end.job, end.step, end.at) == ("a", 7, 1000.0)
    stored = await store.get(keys.ended("a"))
    assert stored is not None and end.revision == stored.mod_revision
    # Registered again elsewhere (the key deleted): remembered here until forgotten.
    await store.delete(keys.ended("a"))
    assert await ended.is_ended("a")
    ended.forget("a")
    assert not await ended.is_ended("a") and ended.known("a") is None
    # A fresh read says what etcd says, whatever is remembered.
    ended.note(_health("a", 9))
    assert ended.known("a") is not None and await ended.read("a") is None
    assert ended.known("a") is None


async def test_an_unreadable_end_counts_as_ended_and_the_memory_is_bounded(
    settings: ServiceSettings, store: Store
) -> None:
    keys = Keys(settings.etcd.key_prefix)
    ended = EndedJobs(store, keys, limit=2)
    await store.put(keys.ended("bad"), b"not a health")
    end = await ended.read("bad")
    assert end is not None and not end.readable and await ended.is_ended("bad")
    for job, step in (("x", 1), ("y", 2)):
        ended.note(_health(job, step))
    assert len(ended) == 2 and ended.known("bad") is None  # the least recent went first
    assert await ended.is_ended("bad")  # read again from etcd
