"""A load generator in its own process: pre-serialised step events, as fast as one
nats-py client publishes them (the receiving side then shares no thread with its load).

    BENCH_PUBLISHER_NATS='{"url": ..., "subject_prefix": ...}' \
        python -m bench.publisher JOB RANKS EVENTS [--raw SUBJECT]

The NatsSettings fields come in the environment: they may hold a user's password."""

from __future__ import annotations

import argparse
import json
import os

from antdt.runtime import loops
from antdt.runtime.bus import Bus
from antdt.runtime.config import NatsSettings
from antdt.schemas import StepEvent, Subjects

#: The environment variable holding the NatsSettings fields (JSON) to connect with.
PUBLISHER_NATS = "BENCH_PUBLISHER_NATS"


def step_event(rank: int, n: int, job: str) -> StepEvent:
    return StepEvent(
        job=job,
        rank=rank,
        host=f"h{rank}",
        step=n,
        epoch=0,
        plan_version=0,
        local_batch=32,
        samples=32,
        compute_s=0.1,
        data_wait_s=0.001,
        comm_s=0.01,
        step_s=0.111,
        started_at=1e9 + n,
        ended_at=1e9 + n + 0.111,
    )


def payloads(
    prefix: str, job: str, ranks: int, events: int, first_step: int
) -> list[tuple[str, bytes]]:
    """Every rank's step events, step by step: step_event's JSON, filled into a template
    per rank (a million events made as models took 10 s before the first was sent)."""
    subjects = Subjects(prefix)
    templates = [_template(r, job) for r in range(ranks)]
    return [
        (subjects.step(job, r), (templates[r] % (n, 1e9 + n, 1e9 + n + 0.111)).encode())
        for n in range(first_step, first_step + events // ranks)
        for r in range(ranks)
    ]


def _template(rank: int, job: str) -> str:
    """step_event(rank, n, job) as JSON, with its step and times left to fill in."""
    text = step_event(rank, 0, job).model_dump_json()
    for field, value in (
        ("step", "0"),
        ("started_at", "1000000000.0"),
        ("ended_at", "1000000000.111"),
    ):
        made = text.replace(f'"{field}":{value}', f'"{field}":%r', 1)
        if made == text:
            raise RuntimeError(f"step event JSON without {field}={value}: {text}")
        text = made
    if StepEvent.model_validate_json(text % (7, 1e9 + 7, 1e9 + 7.111)) != step_event(rank, 7, job):
        raise RuntimeError(f"step event template does not make step_event: {text}")
    return text


async def publish(nats: NatsSettings, messages: list[tuple[str, bytes]]) -> None:
    bus = await Bus(nats, name="bench-load").connect()
    for subject, data in messages:
        await bus.nc.publish(subject, data)
    await bus.flush()
    await bus.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("job")
    parser.add_argument("ranks", type=int)
    parser.add_argument("events", type=int)
    parser.add_argument("--first-step", type=int, default=1)
    parser.add_argument("--raw", help="publish every payload to this one subject instead")
    args = parser.parse_args()
    nats = NatsSettings(**json.loads(os.environ[PUBLISHER_NATS]))
    messages = payloads(nats.subject_prefix, args.job, args.ranks, args.events, args.first_step)
    if args.raw:
        messages = [(args.raw, data) for _, data in messages]
    loops.run(publish(nats, messages), "auto")


if __name__ == "__main__":
    main()
