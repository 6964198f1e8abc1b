"""A large job's health through a real nats-server: its ranks' columns make a JobHealth
of 10,000 ranks ~1.7 MB of JSON, past nats-server's default max_payload (1 MiB) and the
256 KiB every other message is held to. The bus sends it gzipped; a subscriber, core or
JetStream, inflates it within JobHealth's own limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus, BusError, Delivery
from antdt.runtime.config import NatsSettings, ServiceSettings
from antdt.runtime.servers import EmbeddedNats
from antdt.schemas import (
    ENCODING_HEADER,
    GZIP,
    JobHealth,
    RankColumns,
    RegisterReply,
    Subjects,
)
from antdt.services.monitor.service import ENDED_RECORD_BYTES, ended_record
from antdt.testing import drawn_health
from tests.e2e.conftest import start_services
from tests.helpers import wait_for
from tests.integration.test_services import spec, step

pytestmark = pytest.mark.integration

#: nats-server's own default: what a user's server has unless they raised it.
DEFAULT_MAX_PAYLOAD = 1024 * 1024


@pytest.fixture
def default_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "n", max_payload_bytes=DEFAULT_MAX_PAYLOAD).start()
    yield server
    server.stop()


async def test_a_health_of_ten_thousand_ranks_reaches_core_and_stream_readers_gzipped(
    default_nats: EmbeddedNats, unique: str
) -> None:
    bus = await Bus(NatsSettings(url=default_nats.url), name="big").connect()
    try:
        subjects, stream = Subjects(f"antdt.{unique}"), f"HEALTH_{unique}"
        await bus.jetstream.ensure_stream(stream, [subjects.health(unique)])
        got: list[tuple[JobHealth, Delivery]] = []

        async def on_health(health: JobHealth, delivery: Delivery) -> None:
            got.append((health, delivery))

        await bus.subscribe(subjects.health(unique), JobHealth, on_health)
        health = drawn_health(unique, 10_000)
        assert len(health.model_dump_json()) > DEFAULT_MAX_PAYLOAD
        await bus.publish(subjects.health(unique), health)
        await wait_for(lambda: bool(got), timeout=10)
        received, delivery = got[0]
        assert received == health and delivery.headers[ENCODING_HEADER] == GZIP
        stored = await bus.jetstream.last(stream, subjects.health(unique), JobHealth)
        assert stored == health
        assert bus.rejections.total() == 0
    finally:
        await bus.close()


async def test_a_health_over_max_payload_even_gzipped_is_refused_with_its_size(
    default_nats: EmbeddedNats, unique: str
) -> None:
    bus = await Bus(NatsSettings(url=default_nats.url), name="big").connect()
    try:
        with pytest.raises(BusError, match=r"JobHealth of \d+ bytes .* max_payload \(1048576"):
            await bus.publish(f"antdt.{unique}.health", drawn_health(unique, 40_000))
        await bus.flush(timeout=2)  # the connection is still good
    finally:
        await bus.close()


def test_an_ended_record_keeps_its_rows_while_they_fit_the_store() -> None:
    small, large = drawn_health("j", 100), drawn_health("j", 10_000)
    assert JobHealth.model_validate_json(ended_record(small)) == small
    record = ended_record(large)
    assert len(record) <= ENDED_RECORD_BYTES
    kept = JobHealth.model_validate_json(record)
    assert kept == large.model_copy(update={"ranks": RankColumns.of_rows(())})


async def test_the_controller_hears_the_health_of_a_job_of_two_thousand_ranks(
    bus: Bus, settings: ServiceSettings, unique: str
) -> None:
    """The monitor's health of a job whose rows are over 256 KiB (~800 ranks) reaches
    the controller, which refused every one of them as too large."""
    ranks, job = 2_000, f"wide-{unique}"
    running = await start_services(settings, ("monitor", "controller"))
    try:
        controller = running.by_name["controller"]
        subjects = Subjects(settings.nats.subject_prefix)
        wide = spec(job, world_size=ranks, global_batch=ranks * 2, dataset_size=ranks * 200)
        await bus.request(subjects.register(job), wide, RegisterReply)
        steps = iter(range(1, 1000))

        async def heard_after_a_step() -> bool:
            """A step of every rank (until the monitor, claiming the job, hears them)."""
            n = next(steps)
            for rank in range(ranks):
                await bus.publish(subjects.step(job, rank), step(job, rank, n))
            await bus.flush()
            return controller.counts[(job, "health")] >= 2

        await wait_for(heard_after_a_step, timeout=30, interval=0.5, what="two healths heard")
        assert controller.bus.rejections.total() == 0
    finally:
        await running.runtime.shutdown()
