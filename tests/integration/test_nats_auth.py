"""NATS authentication and per-role permissions against a real nats-server started with
the configuration generated from a permissions file: what each role is refused (read
from the server's own permission errors) and that every channel's sender and receiver
roles still carry it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from nats.aio.msg import Msg

from antdt.runtime.bus import Bus, BusError
from antdt.runtime.config import NatsSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedNats
from antdt.runtime.servers.natsconf import authorization_block, load_permissions
from antdt.runtime.servers.roles import Role
from antdt.schemas import (
    ACTION_STREAM,
    INCIDENT_STREAM,
    JobSpec,
    RegisterReply,
    ShardStatus,
    ShardStatusRequest,
    Subjects,
)
from antdt.schemas.channels import CHANNELS, Transport
from antdt.schemas.events import Incident
from antdt.services.runner import settings_class, start_service
from tests.helpers import step_event, wait_for

pytestmark = pytest.mark.integration

PREFIX = "antdt.v1"
JOB, OTHER = "job-a", "job-b"
S = Subjects(PREFIX)
USERS = {
    "agent-a": (Role.AGENT, JOB),
    "agent-b": (Role.AGENT, OTHER),
    **{r.value: (r, None) for r in Role if r is not Role.AGENT},
}


def _password(user: str) -> str:
    return f"secret-{user}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    root = tmp_path_factory.mktemp("nats-auth")
    users = [
        {"user": u, "password": _password(u), "role": r.value, **({"job": j} if j else {})}
        for u, (r, j) in USERS.items()
    ]
    path = root / "permissions.json"
    path.write_text(json.dumps({"subject_prefix": PREFIX, "users": users}))
    server = EmbeddedNats(root, extra_config=authorization_block(load_permissions(path)))
    yield server.start()
    server.stop()


@pytest.fixture
async def connect(secured: EmbeddedNats) -> AsyncIterator[Callable[..., object]]:
    opened: list[Bus] = []

    async def as_user(user: str, password: str | None = None) -> Bus:
        settings = NatsSettings(
            url=secured.url,
            subject_prefix=PREFIX,
            user=user,
            password=password or _password(user),
        )
        bus = await Bus(settings, name=user).connect(retry_for_s=3)
        opened.append(bus)
        return bus

    yield as_user
    for bus in opened:
        await bus.close()


async def _collect(bus: Bus, subject: str, into: list[str]) -> None:
    async def take(msg: Msg) -> None:
        into.append(msg.subject)

    await bus.nc.subscribe(subject, cb=take)


async def _refused(bus: Bus, subject: str) -> bool:
    """Did nats-server refuse `bus`'s last operation on `subject` (its -ERR)?"""
    await bus.flush()
    return await wait_for(
        lambda: any(f'"{subject.lower()}"' in r.lower() for r in bus.refused), timeout=3
    )


async def test_a_wrong_password_is_refused_at_connect(connect) -> None:
    with pytest.raises(BusError, match="authorization violation: wrong user or password"):
        await connect("controller", "not-the-password")


async def test_an_agent_cannot_publish_commands_plans_or_proposals(connect) -> None:
    agent, controller = await connect("agent-a"), await connect("controller")
    monitor, observer = await connect("monitor"), await connect("observer")
    seen: list[str] = []  # by the roles that receive each subject
    for bus, subjects in (
        (controller, [S.proposal(JOB), S.health(JOB), S.incident(JOB)]),
        (agent, [S.command(JOB, 0), S.command_all(JOB)]),
        (observer, [S.action(JOB)]),
        (monitor, [S.any_job("step.*")]),
    ):
        for subject in subjects:
            await _collect(bus, subject, seen)
        await bus.flush()
    forbidden = [
        S.command(JOB, 0),
        S.command_all(JOB),
        S.proposal(JOB),
        S.action(JOB),
        S.health(JOB),
        S.incident(JOB),
        S.step(OTHER, 0),
    ]
    for subject in forbidden:
        await agent.publish_raw(subject, b"{}")
        assert await _refused(agent, subject), subject
    await agent.publish_raw(S.step(JOB, 0), b"{}")  # its own job's steps pass
    assert await wait_for(lambda: S.step(JOB, 0) in seen, timeout=3)
    assert not set(forbidden) & set(seen)


async def test_an_agent_cannot_subscribe_to_another_jobs_commands(connect) -> None:
    agent, controller = await connect("agent-a"), await connect("controller")
    got: list[str] = []
    await _collect(agent, S.command(OTHER, 0), got)
    assert await _refused(agent, S.command(OTHER, 0))
    await _collect(agent, S.command(JOB, 0), got)
    await agent.flush()
    await controller.publish_raw(S.command(OTHER, 0), b"{}")
    await controller.publish_raw(S.command(JOB, 0), b"{}")
    assert await wait_for(lambda: got == [S.command(JOB, 0)], timeout=3)


async def test_an_observer_publishes_nothing(connect) -> None:
    observer = await connect("observer")
    for subject in (S.step(JOB, 0), S.health(JOB), S.command(JOB, 0), S.register(JOB)):
        await observer.publish_raw(subject, b"{}")
        assert await _refused(observer, subject), subject
    await observer.publish_raw("_INBOX.controller.steal", b"{}")  # nor into another's inbox
    assert await _refused(observer, "_INBOX.controller.steal")


def _roles(names: tuple[str, ...]) -> set[Role]:
    table = {
        "agent": {Role.AGENT},
        "monitor": {Role.MONITOR},
        "controller": {Role.CONTROLLER},
        "shards": {Role.SHARDS},
        "custom policy": {Role.POLICY},
        "anyone": {Role.OBSERVER, Role.OPERATOR},
    }
    out: set[Role] = set()
    for name in names:
        out |= table.get(name, {Role.AGENT} if name.startswith("rendezvous") else {Role.OPERATOR})
    return out


def _user(role: Role) -> str:
    return "agent-a" if role is Role.AGENT else role.value


async def test_every_channel_passes_from_its_senders_to_its_receivers(connect) -> None:
    """Each sender role publishes (or requests) on each of its channels, and each receiver
    role gets it (and answers, for a request): the roles can do their work."""
    buses = {role: await connect(_user(role)) for role in Role}
    core = [c for c in CHANNELS if c.transport is not Transport.JETSTREAM]
    for channel in core:
        args = [JOB if a == "{job}" else "0" if a.startswith("{") else a for a in channel.args]
        subject = getattr(S, channel.builder)(*args)
        senders = _roles(channel.senders) - (
            {Role.OBSERVER} if channel.transport is Transport.PUBLISH else set()
        )
        for receiver in _roles(channel.receivers):
            got: list[bytes] = []

            async def answer(msg, got=got) -> None:  # type: ignore[no-untyped-def]
                got.append(msg.data)
                if msg.reply:
                    await msg.respond(b"ok")

            sub = await buses[receiver].nc.subscribe(subject, cb=answer)
            await buses[receiver].flush()
            for sender in senders:
                where = f"{channel.id}: {sender.value} -> {receiver.value}"
                if channel.transport is Transport.PUBLISH:
                    await buses[sender].publish_raw(subject, sender.value.encode())
                    assert await wait_for(
                        lambda s=sender, g=got: s.value.encode() in g, timeout=3, what=where
                    ), where
                else:
                    assert await buses[sender].request_raw(subject, b"{}", timeout=3) == b"ok", (
                        where
                    )
            await sub.unsubscribe()
    assert not any(bus.refused for bus in buses.values()), {
        r.value: list(b.refused) for r, b in buses.items() if b.refused
    }


async def test_streams_are_fed_by_services_and_read_by_policy_and_observer(connect) -> None:
    monitor, controller = await connect("monitor"), await connect("controller")
    await monitor.jetstream.ensure_stream(INCIDENT_STREAM, [S.any_job("incident")])
    await controller.jetstream.ensure_stream(ACTION_STREAM, [S.any_job("action")])
    incident = Incident(
        id="i1",
        job=JOB,
        rank=0,
        host="h",
        kind="slow",
        state="opened",
        step=1,
        opened_at=1.0,
        updated_at=1.0,
        ratio=2.0,
        windows=1,
    )
    await monitor.jetstream.publish(S.incident(JOB), incident)
    consumer = await controller.jetstream.durable(
        INCIDENT_STREAM, S.any_job("incident"), Incident, durable="ctl"
    )
    received = await consumer.fetch(1, timeout=3)
    assert [r.model for r in received] == [incident]
    await received[0].ack()
    for reader in ("policy", "observer", "operator"):
        bus = await connect(reader)
        replay = await bus.jetstream.read(INCIDENT_STREAM, S.incident(JOB), Incident)
        assert replay.items == [incident], reader
        assert not bus.refused, list(bus.refused)
    policy = await connect("policy")
    with pytest.raises(Exception):  # noqa: B017 (nats-py's JetStream permission error)
        await asyncio.wait_for(policy.jetstream.publish(S.incident(JOB), incident, timeout=1), 3)
    assert await _refused(policy, S.incident(JOB))


async def test_the_services_run_with_their_roles_and_serve_an_agent(
    secured: EmbeddedNats, connect, settings
) -> None:
    """The three services started with their own users: nothing they do is refused, and
    an agent's registration and an operator's status request are answered."""
    runtime = ServiceRuntime("auth")
    services = []
    try:
        for name in ("monitor", "controller", "shards"):
            nats = NatsSettings(
                url=secured.url, subject_prefix=PREFIX, user=name, password=_password(name)
            )
            base = settings.model_dump()
            service_settings = settings_class(name)(**{**base, "nats": nats, "replica_id": name})
            services.append(await start_service(name, service_settings, runtime))
        agent, operator = await connect("agent-a"), await connect("operator")
        spec = JobSpec(job=JOB, world_size=2, dataset_size=60, shard_size=3, global_batch=4)
        reply = await agent.request(S.register(JOB), spec, RegisterReply, timeout=5)
        assert reply.spec.job == JOB
        await agent.publish(S.step(JOB, 0), step_event(JOB, 0, 1))
        status = await operator.request(
            S.shards(JOB, "status"), ShardStatusRequest(job=JOB), ShardStatus, timeout=5
        )
        assert status.job == JOB
        buses = [b for s in services for b in (s.bus, getattr(s, "ranks_bus", None)) if b]
        await asyncio.sleep(0.5)
        assert not [r for b in buses for r in b.refused]
        assert not agent.refused and not operator.refused
    finally:
        await runtime.shutdown()
