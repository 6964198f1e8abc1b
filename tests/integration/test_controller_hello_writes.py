"""Rank hellos are stored in batches: a large job's hellos (all unsaved at registration,
or arriving together after it) cost a few transactions, not one each."""

from __future__ import annotations

import time

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import ServiceSettings
from antdt.schemas import Keys, RankHello, RegisterReply, Subjects
from tests.e2e.conftest import start_services
from tests.helpers import wait_for
from tests.integration.test_services import spec

pytestmark = pytest.mark.integration
RANKS = 300


async def test_a_large_job_s_hellos_are_stored_a_batch_per_transaction(
    bus: Bus, settings: ServiceSettings, unique: str
) -> None:
    running = await start_services(settings, ("controller",))
    try:
        controller = running.by_name["controller"]
        subjects, keys = Subjects(settings.nats.subject_prefix), Keys(settings.etcd.key_prefix)
        job = f"wide-{unique}"

        async def say_hellos(started_at: float) -> None:
            for rank in range(RANKS):
                hello = RankHello(
                    job=job,
                    rank=rank,
                    world_size=RANKS,
                    host=f"h{rank}",
                    pid=rank + 1,
                    started_at=started_at,
                )
                await bus.publish(subjects.hello(job, rank), hello)
            await bus.flush()

        async def stored_at(started_at: float) -> bool:
            items = await controller.store.get_prefix(keys.rank_hellos(job))
            hellos = [RankHello.model_validate_json(i.value) for i in items]
            return len(hellos) == RANKS and all(h.started_at == started_at for h in hellos)

        first = time.time()
        await say_hellos(first)  # before registering, as agents do: nobody owns the job
        await wait_for(
            lambda: len(controller.hellos._heard.get(job) or {}) == RANKS, what="every hello heard"
        )
        wide = spec(job, world_size=RANKS, global_batch=RANKS * 2)
        await bus.request(subjects.register(job), wide, RegisterReply)
        await wait_for(lambda: stored_at(first), what="the hellos stored at registration")
        assert controller.hellos.writes <= 5  # 3 batches of 100
        # The group restarts: new processes say hello again, the job owned now.
        before, second = controller.hellos.writes, first + 60
        await say_hellos(second)
        await wait_for(lambda: stored_at(second), what="the new hellos stored")
        assert controller.hellos.writes - before <= RANKS // 5
    finally:
        await running.runtime.shutdown()
