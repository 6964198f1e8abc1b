"""The NATS subjects each AntDT role may publish to and subscribe to, derived from the
channel table of the contract (who sends and who receives each subject), so that a new
channel gets its permissions with it. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from antdt.schemas.channels import (
    AGENT,
    ANYONE,
    CHANNELS,
    CONTROLLER,
    GATE,
    HEALTH_STREAM,
    MONITOR,
    POLICY,
    SHARDS,
    STEP_STREAM,
    Channel,
    Transport,
)
from antdt.schemas.subjects import ACTION_STREAM, INCIDENT_STREAM, Subjects


class Role(str, Enum):
    """Who connects: the three services, a rank's agent (one job), a custom policy, an
    observer (`antdt status`, `antdt report`: reads only) and an operator (the CLI)."""

    AGENT = "agent"
    MONITOR = "monitor"
    CONTROLLER = "controller"
    SHARDS = "shards"
    POLICY = "policy"
    OBSERVER = "observer"
    OPERATOR = "operator"


class UnknownRole(ValueError):
    """A permissions file names a role that AntDT does not have."""


def parse_role(name: str) -> Role:
    try:
        return Role(name)
    except ValueError:
        known = ", ".join(r.value for r in Role)
        raise UnknownRole(f"unknown role {name!r}: the roles are {known}") from None


@dataclass(frozen=True)
class Permissions:
    """A nats-server user's permissions. `allow_responses`: it may answer the requests
    it receives (publish once to their reply subjects) without a grant on `_INBOX.>`."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool


#: The channels' sender and receiver names each role stands for.
_SENDS: dict[Role, frozenset[str]] = {
    Role.AGENT: frozenset({AGENT, GATE}),
    Role.MONITOR: frozenset({MONITOR}),
    Role.CONTROLLER: frozenset({CONTROLLER}),
    Role.SHARDS: frozenset({SHARDS}),
    Role.POLICY: frozenset({POLICY}),
    Role.OBSERVER: frozenset({ANYONE}),
    Role.OPERATOR: frozenset({ANYONE, "antdt job create", "antdt shards release"}),
}
_RECEIVES: dict[Role, frozenset[str]] = {
    Role.AGENT: frozenset({AGENT}),
    Role.MONITOR: frozenset({MONITOR}),
    Role.CONTROLLER: frozenset({CONTROLLER}),
    Role.SHARDS: frozenset({SHARDS}),
    Role.POLICY: frozenset({POLICY}),
    Role.OBSERVER: frozenset({ANYONE}),
    Role.OPERATOR: frozenset({ANYONE}),
}
#: Senders named by the command that sends (the operator's CLI): `antdt shards status`.
_CLI_PREFIX = "antdt "
_SERVICES = frozenset({Role.MONITOR, Role.CONTROLLER})
_READ_STREAMS = (INCIDENT_STREAM, ACTION_STREAM, STEP_STREAM, HEALTH_STREAM)


def _sends(role: Role, channel: Channel) -> bool:
    senders = set(channel.senders)
    if role is Role.OBSERVER:  # reads only: requests that change nothing, no publishes
        return ANYONE in senders and channel.transport is Transport.REQUEST
    if role is Role.OPERATOR and any(s.startswith(_CLI_PREFIX) for s in senders):
        return True
    return bool(senders & _SENDS[role])


def _address(channel: Channel, subjects: Subjects, job: str) -> str:
    args = [job if a == "{job}" else "*" if a.startswith("{") else a for a in channel.args]
    return str(getattr(subjects, channel.builder)(*args))


def _jetstream_reads(streams: tuple[str, ...]) -> tuple[str, ...]:
    """The JetStream API subjects that read `streams` through consumers of one's own."""
    out = ["$JS.API.INFO"]
    for s in streams:
        out += [
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.STREAM.MSG.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}.>",
            f"$JS.API.CONSUMER.CREATE.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.*",
            f"$JS.API.CONSUMER.INFO.{s}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.API.CONSUMER.DELETE.{s}.*",
            f"$JS.ACK.{s}.>",
        ]
    return tuple(out)


def permissions(role: Role, *, prefix: str, inbox: str, job: str | None = None) -> Permissions:
    """What `role` may do under subject prefix `prefix`; `inbox`: the prefix of the
    connection's reply subjects (`NatsSettings.inbox_prefix`). An agent is bound to one
    `job`; every other role sees every job."""
    if (role is Role.AGENT) != (job is not None):
        raise ValueError("an agent is bound to one job; other roles to none")
    subjects, scope = Subjects(prefix), job or "*"
    publish = [_address(c, subjects, scope) for c in CHANNELS if _sends(role, c)]
    receives = _RECEIVES[role]
    subscribe = [_address(c, subjects, scope) for c in CHANNELS if set(c.receivers) & receives]
    if role in _SERVICES:  # they create and feed the streams
        publish += ["$JS.API.>", "$JS.ACK.>"]
    elif role is not Role.AGENT and role is not Role.SHARDS:
        publish += _jetstream_reads((INCIDENT_STREAM,) if role is Role.POLICY else _READ_STREAMS)
    subscribe.append(f"{inbox}.>")
    answers = any(
        c.transport in (Transport.REQUEST, Transport.GATHER) and set(c.receivers) & receives
        for c in CHANNELS
    )
    return Permissions(tuple(dict.fromkeys(publish)), tuple(dict.fromkeys(subscribe)), answers)
