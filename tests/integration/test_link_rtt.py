"""A slow link measured for real: one stand-in rank reaches nats-server through a TCP
proxy that holds every byte for a while (a real socket relay in the test, as netem would
on a host's link); the agent's LinkProbe measures its round trip over that connection,
its step events carry it, and the monitor opens a SLOW incident with cause communication
for that rank only, with the round trips in its evidence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from antdt.agent.linkprobe import LinkProbe
from antdt.runtime.bus import Bus, BusError
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.store import Store
from antdt.schemas import Cause, Incident, IncidentKind, JobSpec, Keys, StepEvent, Subjects
from antdt.services.monitor.service import MonitorService, MonitorSettings
from antdt.services.runner import start_service
from tests.helpers import step_event, wait_for
from tests.relays import DelayingRelay

pytestmark = pytest.mark.integration

ONE_WAY_S = 0.040  # the proxy's delay each way: a round trip of 80 ms and more
WORLD, SLOW_LINK, STEPS = 4, 2, 48


@pytest.fixture
async def monitor(settings: ServiceSettings) -> AsyncIterator[MonitorService]:
    runtime = ServiceRuntime("test-monitor")
    service = await start_service("monitor", MonitorSettings(**settings.model_dump()), runtime)
    yield service
    await runtime.shutdown()


def with_link(event: StepEvent, rtt: float | None) -> StepEvent:
    return event.model_copy(update={"link_rtt_s": rtt})


async def test_a_rank_behind_a_slow_link_is_a_communication_straggler(
    monitor: MonitorService, bus: Bus, store: Store, settings: ServiceSettings
) -> None:
    job = "linkjob"
    keys, subjects = Keys(settings.etcd.key_prefix), Subjects(settings.nats.subject_prefix)
    spec = JobSpec(job=job, world_size=WORLD, dataset_size=1000, shard_size=10, global_batch=16)
    await store.put(keys.spec(job), spec.model_dump_json().encode())
    host, port = settings.nats.url.split("://", 1)[1].rsplit(":", 1)
    proxy = DelayingRelay((host, int(port)), ONE_WAY_S)
    proxied = settings.nats.model_copy(update={"url": await proxy.start()})
    slow_bus = await Bus(proxied, name="rank-behind-the-proxy").connect()
    probes = {r: LinkProbe(slow_bus if r == SLOW_LINK else bus) for r in range(WORLD)}
    incidents: list[Incident] = []

    async def on_incident(incident: Incident, _: object) -> None:
        incidents.append(incident)

    try:
        await bus.subscribe(subjects.incident(job), Incident, on_incident)
        await wait_for(lambda: monitor.ownership.owns(job), what="job claimed")
        for _ in range(3):  # the probes the agent takes every 2 s, here back to back
            for probe in probes.values():
                await probe.probe()
        rtt = {r: p.rtt_s for r, p in probes.items()}
        assert rtt[SLOW_LINK] is not None and rtt[SLOW_LINK] >= 2 * ONE_WAY_S
        assert all(v is not None and v < ONE_WAY_S for r, v in rtt.items() if r != SLOW_LINK)
        for n in range(STEPS):  # every rank's exchange slowed alike (a ring), compute equal
            for rank in range(WORLD):
                event = with_link(step_event(job, rank, n, comm_s=0.09), rtt[rank])
                sender = slow_bus if rank == SLOW_LINK else bus
                await sender.publish(subjects.step(job, rank), event)
        await wait_for(lambda: incidents, timeout=20, what="an incident")
    finally:
        await slow_bus.close()
        await proxy.close()
    opened = incidents[0]
    assert (opened.rank, opened.kind, opened.cause) == (
        SLOW_LINK,
        IncidentKind.SLOW,
        Cause.COMMUNICATION,
    )
    assert {i.rank for i in incidents} == {SLOW_LINK}
    assert opened.evidence["link_rtt_s"] == pytest.approx(rtt[SLOW_LINK])
    assert opened.evidence["others_link_rtt_s"] < ONE_WAY_S
    assert monitor.bus.rejections.total() == 0


async def test_a_probe_answered_after_its_timeout_leaves_the_connection_reading(
    bus: Bus, settings: ServiceSettings
) -> None:
    """A link cut for longer than a probe's timeout: the PONG comes late. The connection
    must go on reading (nats-py once died quietly on such a PONG: a rank that heard
    nothing more, its shard fetches timing out, until its group was restarted)."""
    host, port = settings.nats.url.split("://", 1)[1].rsplit(":", 1)
    proxy = DelayingRelay((host, int(port)), 0.3)
    proxied = settings.nats.model_copy(update={"url": await proxy.start()})
    late = await Bus(proxied, name="rank-behind-a-late-link").connect()
    heard: list[StepEvent] = []

    async def on_step(event: StepEvent, _: object) -> None:
        heard.append(event)

    try:
        subject = Subjects(settings.nats.subject_prefix).step("latejob", 0)
        await late.subscribe(subject, StepEvent, on_step)
        with pytest.raises(BusError, match="no PONG"):
            await late.rtt(timeout=0.1)
        await asyncio.sleep(1.0)  # the PONG arrives, late
        assert await late.rtt(timeout=3.0) >= 0.6
        with pytest.raises(BusError, match="no PONG"):
            await late.flush(timeout=0.1)
        await asyncio.sleep(1.0)
        sample = step_event("latejob", 0, 1)
        await bus.publish(subject, sample)
        await wait_for(lambda: heard, timeout=10, what="a message after the late PONGs")
        assert heard == [sample]
    finally:
        await late.close()
        await proxy.close()
