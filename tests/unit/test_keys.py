"""etcd key names: a job is read back from its spec and ended keys, and from nothing else."""

from __future__ import annotations

from antdt.schemas import Keys


def test_jobs_are_read_back_from_their_spec_and_ended_keys_only() -> None:
    keys = Keys("/p/")
    assert keys.job_of_spec_key(keys.spec("train-7")) == "train-7"
    assert keys.job_of_ended_key(keys.ended("train-7")) == "train-7"
    assert keys.job_of_spec_key(keys.ended("train-7")) is None
    assert keys.job_of_ended_key(keys.spec("train-7")) is None
    # Keys deeper under a job that happen to end like one are not a job's.
    assert keys.job_of_spec_key("/p/jobs/train-7/ledger/spec") is None
    assert keys.job_of_ended_key("/p/jobs//ended") is None
    assert keys.job_of_spec_key("/q/jobs/train-7/spec") is None
