"""Recording for after-the-fact reports: bounded JetStream streams ANTDT_STEPS (every
StepEvent) and ANTDT_HEALTH (every JobHealth), captured by the server from core NATS, so
publishers and the agent's cost do not change. Whoever starts the services ensures them
(idempotent: every replica may)."""

from __future__ import annotations

from dataclasses import dataclass

from antdt.runtime.bus import Bus
from antdt.runtime.config import NatsSettings, RecordingSettings
from antdt.schemas import Subjects

STEP_STREAM = "ANTDT_STEPS"
HEALTH_STREAM = "ANTDT_HEALTH"


@dataclass(frozen=True)
class StreamSpec:
    """One bounded stream: what it captures and its limits."""

    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    max_bytes: int
    max_msgs: int = -1  # no count cap: age and size bound it


def recording_streams(subjects: Subjects, settings: RecordingSettings) -> list[StreamSpec]:
    """The streams recording needs under `subjects`' prefix (pure)."""
    return [
        StreamSpec(
            STEP_STREAM,
            (subjects.any_job("step.*"),),
            settings.steps_max_age_s,
            settings.steps_max_bytes,
        ),
        StreamSpec(
            HEALTH_STREAM,
            (subjects.health("*"),),
            settings.health_max_age_s,
            settings.health_max_bytes,
        ),
    ]


async def ensure_recording(
    bus: Bus, subjects: Subjects, settings: RecordingSettings
) -> list[StreamSpec]:
    """Create or update the recording streams (idempotent); returns what was ensured."""
    if not settings.enabled:
        return []
    specs = recording_streams(subjects, settings)
    for spec in specs:
        await bus.jetstream.ensure_stream(
            spec.name,
            list(spec.subjects),
            max_age_s=spec.max_age_s,
            max_msgs=spec.max_msgs,
            max_bytes=spec.max_bytes,
        )
    return specs


async def ensure_recording_at(
    nats: NatsSettings, settings: RecordingSettings, *, retry_for_s: float = 30.0
) -> list[StreamSpec]:
    """`ensure_recording` over a connection of its own (for `antdt services`/`up`)."""
    if not settings.enabled:
        return []
    bus = await Bus(nats, name="antdt-recorder").connect(retry_for_s=retry_for_s)
    try:
        return await ensure_recording(bus, Subjects(nats.subject_prefix), settings)
    finally:
        await bus.close()
