"""`antdt actions --job J` after real actions: applied (one with gradient accumulation) and
refused proposals executed by the real controller, read back from JetStream ANTDT_ACTIONS
and rendered (rich Console(record=True)); the `antdt actions` command prints the same."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from rich.console import Console

from antdt.cli.actions import actions_table, fetch_actions
from antdt.runtime.bus import Bus, RequestRefused
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    ActionProposal,
    ActionRecord,
    ActionResult,
    JobSpec,
    RegisterReply,
    Subjects,
)
from antdt.services.controller.service import ControllerSettings
from antdt.testing import acking_ranks
from tests.e2e.conftest import RunningServices, start_services

pytestmark = pytest.mark.integration

LEAD = ControllerSettings.model_fields["lead_steps"].default


@pytest.fixture
async def controller(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    running = await start_services(settings, ("controller",))
    yield running
    await running.runtime.shutdown()


async def make_actions(bus: Bus, job: str) -> list[ActionRecord]:
    subjects = Subjects(bus.settings.subject_prefix)
    spec = JobSpec(
        job=job,
        world_size=4,
        dataset_size=1000,
        shard_size=10,
        global_batch=64,
        policy_params={"cooldown_s": 0.0},
    )
    await bus.request(subjects.register(job), spec, RegisterReply)
    proposals = [
        dict(local_batch=(20, 20, 20, 4), reason="rank 3 is 3x slower", incident_id="inc-7"),
        dict(
            local_batch=(24, 20, 16, 4),
            micro_batch=(12, 20, 16, 4),
            accumulation=(2, 1, 1, 1),
            reason="rank 0: two micro-steps",
        ),
        dict(local_batch=(30, 20, 10, 10), reason="breaks the global batch"),
    ]
    records = []
    for n, fields in enumerate(proposals):
        p = ActionProposal(proposal_id=f"cli-{n}", job=job, source="cli-test", **fields)  # type: ignore[arg-type]
        try:
            records.append(await bus.request(subjects.proposal(job), p, ActionRecord, timeout=10))
        except RequestRefused as exc:
            assert exc.reply.code == "guardrail"
    return records


async def test_actions_lists_decisions_reasons_and_results(
    controller: RunningServices, settings: ServiceSettings, bus: Bus
) -> None:
    job = "cli-actions"
    ranks = await acking_ranks(settings.nats, job, 4).start()
    try:
        made = await make_actions(bus, job)
    finally:
        await ranks.close()
    assert [r.result for r in made] == [ActionResult.APPLIED, ActionResult.APPLIED]

    records, truncated = await fetch_actions(settings.nats, job, limit=100)
    assert not truncated
    assert [r.result for r in records] == [*(r.result for r in made), ActionResult.REFUSED]
    console = Console(record=True, width=220, file=io.StringIO())
    console.print(actions_table(job, records))
    text = console.export_text()
    assert f"actions of job {job}: 3" in text
    for expected in (
        "proposal:cli-test",
        "inc-7",
        "rank 3 is 3x slower",
        f"v1 @ step {LEAD}",  # the health says step 0: the plans start lead_steps on
        f"v2 @ step {LEAD}",
        "20 20 20 4",
        "24=12x2 20 16 4",
        "applied",
        "refused",
        "guardrail: plan sums to 70, global batch is 64",
    ):
        assert expected in text, expected

    # The command itself, as a user runs it (its own process: it configures logging).
    env = {**os.environ, "ANTDT_NATS__SUBJECT_PREFIX": settings.nats.subject_prefix}
    command = [
        sys.executable,
        "-m",
        "antdt.cli",
        "actions",
        "--job",
        job,
        "--nats-url",
        settings.nats.url,
    ]
    result = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "24=12x2" in result.stdout and "refused" in result.stdout

    none, _ = await fetch_actions(settings.nats, "no-such-job", limit=100)
    empty = Console(record=True, width=120, file=io.StringIO())
    empty.print(actions_table("no-such-job", none))
    assert "actions of job no-such-job: 0" in empty.export_text()


async def test_a_takeover_records_no_second_action_for_a_proposal_s_plan(
    controller: RunningServices, settings: ServiceSettings, bus: Bus
) -> None:
    """A replica taking a job over sends its plan again and records it if the dead owner
    did not: a plan a proposal wrote is recorded under the proposal's id, not the plan's,
    and must not be recorded a second time."""
    job = "cli-resume"
    service = controller.by_name["controller"]
    ranks = await acking_ranks(settings.nats, job, 4).start()
    try:
        made = await make_actions(bus, job)
        state = service.jobs[job]
        assert state.plan.version == 2 and not any(r.action_id.endswith("-plan-2") for r in made)
        await service.executor.resume(state, ())  # as after a takeover
    finally:
        await ranks.close()
    records, _ = await fetch_actions(settings.nats, job, limit=100)
    assert [r.plan_version for r in records] == [1, 2, None]  # the refused one: no plan
