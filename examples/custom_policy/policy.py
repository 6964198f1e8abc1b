"""An external AntDT policy: incidents in, ADJUST_BS proposals out.

It reads incidents from the JetStream stream ANTDT_INCIDENTS through a durable consumer
(restart it and it resumes after the last incident it acknowledged), and for every slow
rank it proposes new per-rank batches to the controller, which applies the guardrails
every policy is held to and answers with the ActionRecord or the reason it refused.

Its rule is deliberately simple (and ours): cut the slow rank's even share by the ratio
the monitor measured, spread the freed samples evenly over the other ranks.

    ANTDT_NATS__URL=nats://127.0.0.1:4222 python examples/custom_policy/policy.py --job J

One JSON line per event on stdout: ready, skip, applied, refused, retry.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import signal
from typing import Any

from antdt.runtime.bus import Bus, BusError, RequestRefused, StreamMissing
from antdt.runtime.config import ServiceSettings
from antdt.schemas import (
    INCIDENT_STREAM,
    ActionProposal,
    ActionRecord,
    ClientAction,
    Incident,
    IncidentKind,
    IncidentState,
    Plan,
    PlanRequest,
    Subjects,
)

ACTIONABLE = (IncidentState.OPENED, IncidentState.ESCALATED)
#: Refusals worth another try later (the incident is nak'ed); the rest are final for it.
COME_BACK = (ClientAction.RETRY, ClientAction.REFRESH)


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def propose_batches(plan: Plan, incident: Incident, min_batch: int = 1) -> tuple[int, ...] | None:
    """The slow rank's even share divided by its ratio; the freed samples spread evenly over
    the other ranks (the global batch is kept). None when there is nothing to move. The
    ratio compares per-sample speeds: it scales the even share, not the rank's batch now
    (a rank already cut for the same slowness shows the same ratio)."""
    batches = list(plan.local_batch)
    slow = incident.rank
    if slow >= len(batches) or len(batches) < 2 or incident.ratio <= 1.0:
        return None
    even = plan.global_batch / len(batches)
    freed = batches[slow] - max(min_batch, round(even / incident.ratio))
    if freed <= 0:
        return None
    batches[slow] -= freed
    others = [r for r in range(len(batches)) if r != slow]
    share, extra = divmod(freed, len(others))
    for i, rank in enumerate(others):
        batches[rank] += share + (1 if i < extra else 0)
    return tuple(batches)


def proposal_id(source: str, incident: Incident, plan: Plan) -> str:
    """The same incident transition on the same plan gives the same id: a redelivered
    incident is never applied twice."""
    key = f"{incident.id}/{incident.state.value}/{plan.version}"
    return f"{source[:64]}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


async def handle(bus: Bus, subjects: Subjects, incident: Incident, source: str) -> bool:
    """Propose for one incident. True: done with it (ack); False: try again later (nak)."""
    job = incident.job
    if incident.kind != IncidentKind.SLOW or incident.state not in ACTIONABLE:
        say(
            "skip",
            job=job,
            incident=incident.id,
            why=f"{incident.kind.value} {incident.state.value}",
        )
        return True
    try:
        plan = await bus.request(subjects.plan_get(job), PlanRequest(job=job), Plan)
    except RequestRefused as exc:
        say("skip", job=job, incident=incident.id, why=str(exc))
        return True
    except BusError as exc:
        say("retry", job=job, incident=incident.id, why=str(exc))
        return False
    batches = propose_batches(plan, incident)
    if batches is None:
        say("skip", job=job, incident=incident.id, why="nothing to move")
        return True
    proposal = ActionProposal(
        proposal_id=proposal_id(source, incident, plan),
        job=job,
        source=source,
        local_batch=batches,
        plan_version=plan.version,
        incident_id=incident.id,
        reason=f"{source}: rank {incident.rank} is {incident.ratio:.2f}x slower "
        f"({incident.straggler_class.value}, {incident.cause.value}); its batch / ratio",
    )
    try:
        record = await bus.request(subjects.proposal(job), proposal, ActionRecord, timeout=15.0)
    except RequestRefused as exc:  # the controller said why, and its code what to do
        code = exc.reply.code
        say(
            "refused",
            job=job,
            incident=incident.id,
            proposal=proposal.proposal_id,
            local_batch=batches,
            code=code,
            reason=exc.reply.error,
            action=code.action,
        )
        return code.action not in COME_BACK  # job_ended, guardrail: done with it
    except BusError as exc:  # no owner right now, or it took too long: try again
        say("retry", job=job, incident=incident.id, why=str(exc))
        return False
    say(
        record.result.value,
        job=job,
        incident=incident.id,
        proposal=proposal.proposal_id,
        action=record.action_id,
        plan_version=record.plan_version,
        local_batch=batches,
    )
    return True


async def run(args: argparse.Namespace) -> None:
    settings = ServiceSettings()
    if args.nats_url:
        settings.nats.url = args.nats_url
    subjects = Subjects(settings.nats.subject_prefix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bus = await Bus(settings.nats, name=f"custom-policy-{args.durable}").connect()
    wanted = subjects.incident(args.job) if args.job else subjects.any_job("incident")
    try:
        while True:  # the monitor creates the stream; wait for it
            try:
                consumer = await bus.jetstream.durable(
                    INCIDENT_STREAM, wanted, Incident, durable=args.durable, ack_wait_s=30.0
                )
                break
            except StreamMissing:
                if stop.is_set():
                    return
                await asyncio.sleep(0.5)
        say("ready", durable=args.durable, subject=wanted)
        while not stop.is_set():
            for received in await consumer.fetch(8, timeout=0.5):
                if await handle(bus, subjects, received.model, args.source):
                    await received.ack()
                else:
                    await received.nak(delay_s=1.0)
        await consumer.close()
    finally:
        await bus.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--job", help="only this job's incidents (default: every job)")
    parser.add_argument("--durable", default="example-policy", help="durable consumer name")
    parser.add_argument("--source", default="example-policy", help="name in proposals")
    parser.add_argument("--nats-url", help="NATS URL (else ANTDT_NATS__URL)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
