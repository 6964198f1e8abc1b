"""The node registry's shell: `node.join` and `node.heartbeat` (any replica, queue group)
judged by `nodes.admit` and written to `jobs/{job}/nodes/{host}` by compare-and-swap, and
the owner's copy of each owned job's live nodes, read again every REFRESH_S."""

from __future__ import annotations

import asyncio
import time

import structlog

from antdt.runtime.bus import Delivery, Rejected
from antdt.runtime.store import Store, StoredValueInvalid, Versioned, decode_stored
from antdt.schemas import (
    BlocklistEntry,
    ErrorCode,
    Keys,
    NodeAdmission,
    NodeHeartbeat,
    NodeJoin,
    NodeRecord,
    NodeReport,
    Subjects,
)
from antdt.services.controller.counts import JobCounts
from antdt.services.controller.jobs import OwnedJobs
from antdt.services.controller.nodes import NODE_TTL_S, Refusal, admit, live_nodes

log = structlog.get_logger("antdt.controller.nodes")
#: Seconds between two reads of an owned job's node registry.
REFRESH_S = 1.0
#: Compare-and-swap attempts of one report against concurrent writers.
CAS_ATTEMPTS = 5


class NodeDesk:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        subjects: Subjects,
        owned: OwnedJobs,
        *,
        ttl_s: float = NODE_TTL_S,
    ) -> None:
        self.store = store
        self.keys = keys
        self.subjects = subjects
        self.owned = owned
        self.ttl_s = ttl_s
        self.counts = JobCounts()  # (job, "joined" | "beat" | code): reports answered

    async def on_join(self, join: NodeJoin, delivery: Delivery) -> NodeAdmission:
        return await self._report(join, delivery, join=True)

    async def on_heartbeat(self, beat: NodeHeartbeat, delivery: Delivery) -> NodeAdmission:
        return await self._report(beat, delivery, join=False)

    async def _report(self, report: NodeReport, delivery: Delivery, *, join: bool) -> NodeAdmission:
        if self.subjects.job_of(delivery.subject) != report.job:
            raise Rejected(ErrorCode.BAD_REQUEST, "job does not match the subject")
        if join and await self.store.get(self.keys.ended(report.job)) is not None:
            self.counts.add(report.job, ErrorCode.JOB_ENDED.value)
            raise Rejected(ErrorCode.JOB_ENDED, f"job {report.job} has ended")
        key = self.keys.node(report.job, report.host)
        for _ in range(CAS_ATTEMPTS):
            now = time.time()
            current, revision = await self._read(key)
            blocklisted = join and await self._blocklisted(report.host, now)
            decision = admit(
                report, current, now=now, blocklisted=blocklisted, join=join, ttl_s=self.ttl_s
            )
            if isinstance(decision, Refusal):
                self.counts.add(report.job, decision.code.value)
                log.warning(
                    "node refused", job=report.job, host=report.host, code=decision.code.value
                )
                raise Rejected(decision.code, decision.reason)
            encoded = decision.model_dump_json().encode()
            if await self.store.cas(key, encoded, revision) is not None:
                self._tell_owner(report.job, decision)
                self.counts.add(report.job, "joined" if join else "beat")
                if join:
                    log.info("node admitted", job=report.job, host=report.host, state=report.state)
                return NodeAdmission(
                    host=report.host, expires_at=decision.expires_at, ttl_s=self.ttl_s
                )
        raise Rejected(ErrorCode.BUSY, f"node record {report.host} contended: retry")

    async def _read(self, key: str) -> tuple[NodeRecord | None, int]:
        """The record at `key` and its revision (0: absent); an unreadable one is replaced."""
        got = await self.store.get(key)
        if got is None:
            return None, 0
        try:
            return decode_stored(key, got.value, NodeRecord), got.mod_revision
        except StoredValueInvalid:
            log.warning("node record unreadable: replaced", key=key)
            return None, got.mod_revision

    async def _blocklisted(self, host: str, now: float) -> bool:
        """Read from etcd, not the followed copy: the owner may have blocked it just now.
        An unreadable entry blocks, as the controller's own Blocklist reads it."""
        got = await self.store.get(self.keys.blocklist(host))
        if got is None:
            return False
        try:
            return decode_stored(got.key, got.value, BlocklistEntry).active(now)
        except StoredValueInvalid:
            return True

    def _tell_owner(self, job: str, record: NodeRecord) -> None:
        state = self.owned.states.get(job)
        if state is not None:
            state.nodes[record.host] = record

    async def refresh_loop(self, interval_s: float = REFRESH_S) -> None:
        """Run as a task: each owned job's live nodes, as etcd holds them."""
        while True:
            for job, state in list(self.owned.states.items()):
                try:
                    found = await self.store.get_prefix(self.keys.nodes(job))
                except Exception as exc:  # etcd away: the next round
                    log.info("node registry not read", job=job, error=repr(exc))
                    continue
                state.nodes = live_nodes(_records(found), time.time())
            await asyncio.sleep(interval_s)


def _records(found: list[Versioned]) -> list[NodeRecord]:
    records = []
    for item in found:
        try:
            records.append(decode_stored(item.key, item.value, NodeRecord))
        except StoredValueInvalid:
            continue
    return records
