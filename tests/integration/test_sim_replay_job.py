"""`antdt sim --from-job J` on a real nats-server: the steps a real run recorded in
ANTDT_STEPS are read back as recorded and replay as the file they came from does."""

from __future__ import annotations

import numpy as np
import pytest

from antdt.cli.replay import recorded_steps
from antdt.observe import STEP_STREAM, ensure_recording
from antdt.runtime.bus import Bus
from antdt.runtime.config import RecordingSettings, ServiceSettings
from antdt.schemas import StepEvent, Subjects
from antdt.sim.recording import load_steps
from antdt.sim.replay import replay
from tests.helpers import wait_for
from tests.unit.test_sim_replay import FIXTURES, RUNS

pytestmark = pytest.mark.integration

LIMITS = RecordingSettings(steps_max_age_s=3600, steps_max_bytes=8 * 1024 * 1024)


async def test_a_jobs_recorded_steps_replay_as_its_steps_file(
    bus: Bus, settings: ServiceSettings
) -> None:
    subjects = Subjects(settings.nats.subject_prefix)
    await ensure_recording(bus, subjects, LIMITS)
    events = load_steps(FIXTURES / RUNS["lb-bsp"])
    job = events[0].job
    for event in events:  # as the agents publish them; the recorder stream keeps them
        await bus.publish(subjects.step(job, event.rank), event)
    await bus.flush()

    async def stored() -> bool:
        read = await bus.jetstream.read(STEP_STREAM, subjects.step(job, "*"), StepEvent, limit=1)
        return read.available >= len(events)

    await wait_for(stored, what=f"{len(events)} steps recorded")
    back = await recorded_steps(settings.nats, job)
    assert back == events
    from_job, from_file = replay(back, ["lb-bsp"]), replay(events, ["lb-bsp"])
    assert np.array_equal(from_job.runs[0].step_s, from_file.runs[0].step_s)
    with pytest.raises(ValueError, match="no steps recorded"):
        await recorded_steps(settings.nats, "never-ran")
