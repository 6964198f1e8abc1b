"""The shards service's settings (`ANTDT_` environment, `antdt serve shards` options)."""

from __future__ import annotations

from pydantic import Field

from antdt.runtime.config import ServiceSettings
from antdt.services.shards.checkpoints import DEFAULT_KEEP


class ShardsSettings(ServiceSettings):
    cas_retries: int = Field(default=20, ge=1, description="Ledger CAS attempts per batch")
    checkpoints_kept: int = Field(
        default=DEFAULT_KEEP, ge=2, le=100, description="Ledger snapshots kept per job"
    )
    fetch_concurrency: int = Field(
        default=1024,
        ge=1,
        le=65536,
        description="Fetch (and, apart, commit) requests one replica handles at once, per "
        "subject: the most one ledger write can carry when every rank asks at once",
    )
    request_backlog: int = Field(
        default=20_000,
        ge=1,
        description="Requests that may wait for a handler, per subject (fetch, commit, ...: "
        "the shared one and the replica's own): past it, or past request_backlog_bytes, a "
        "request is dropped and counted (refused, code slow_consumer); its rank times out "
        "and asks again. Bounds the replica's memory under a flood of requests",
    )
    request_backlog_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="Bytes of those requests, per subject"
    )
    flush_interval_s: float = Field(
        default=0.015,
        ge=0,
        le=1.0,
        description="Seconds, at most, between a change whose answer went out early and "
        "that granted shards ahead of need (a reservation) and its write; changes someone "
        "waits on are written at once. A reservation is topped up while its rank still "
        "holds half of it, so it is durable long before the rank reaches it; a rank that "
        "gets there first waits for the write, which then starts at once",
    )
    done_flush_interval_s: float = Field(
        default=0.025,
        ge=0,
        le=1.0,
        description="Seconds, at most, between a change whose answer went out early and "
        "that only marked shards done and its write (never less than flush_interval_s): "
        "ranks report such marks again until a reply says they are durable, so waiting "
        "longer loses nothing and lets one write carry more requests",
    )
    ledger_write_bytes_per_s: float = Field(
        default=1024**2,
        ge=0,
        description="Bytes per second that one job's ledger writes to etcd, on average "
        "over ledger_write_burst_s: past it a write waits, and carries every request that "
        "came meanwhile. Each write is the whole ledger (about 14-20 bytes per shard in "
        "flight) and stays in etcd's history until etcd compacts it; 0: no limit",
    )
    ledger_write_burst_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="Seconds of ledger_write_bytes_per_s a job may write in a burst before "
        "its writes are paced (0: every write waits its own bytes' worth)",
    )
    idle_job_s: float = Field(
        default=600.0,
        ge=0.05,
        description="Seconds without a request after which this replica drops a job: its "
        "cached ledger and its ownership (the next request loads and claims it again)",
    )
    max_txn_bytes: int = Field(
        default=1_500_000,
        ge=10_000,
        description="Bytes, at most, of keys and values in one ledger transaction. Keep it "
        "under etcd's --max-request-bytes (1.5 MiB by default): etcd refuses a larger "
        "request, and a ledger that outgrew it could never be written again. A change "
        "past it is refused with code too_large, naming the sizes, and nothing is written",
    )
    reserve_shards: int = Field(
        default=64,
        ge=0,
        le=256,
        description="Shards granted to a rank ahead of its asking (capped near the end of "
        "an epoch), so that handing them out needs no etcd write; 0: never",
    )
