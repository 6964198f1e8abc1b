"""Every NATS channel of the contract, one entry per subject: the `Subjects` builder that
makes it, who sends what to whom, how (core publish, request/reply, JetStream), the reply
types and the stream. The AsyncAPI document and the schema export are made from it; a
test holds it to `Subjects` and to the subjects the code subscribes and publishes to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import TypeAdapter

from antdt.schemas import commands, errors, events, health, nodes, plan, restarts, shards
from antdt.schemas.subjects import ACTION_STREAM, INCIDENT_STREAM, Subjects

#: JetStream streams beside the two of the control loop: what `antdt observe` records.
STEP_STREAM = "ANTDT_STEPS"
HEALTH_STREAM = "ANTDT_HEALTH"
CONTROLLER_QUEUE = "antdt-controller"
SHARDS_QUEUE = "antdt-shards"


class Transport(str, Enum):
    """How a channel's messages travel."""

    PUBLISH = "publish"  # core NATS: at most once, to whoever subscribes now
    REQUEST = "request"  # request/reply: one reply, the reply type or an ErrorReply
    GATHER = "gather"  # one request, a reply from every responder (every rank)
    JETSTREAM = "jetstream"  # published into a stream: durable, replayable


#: Message name → its model (or the adapter of a union): every message on a channel.
MESSAGES: dict[str, Any] = {
    "StepEvent": events.StepEvent,
    "RankHello": events.RankHello,
    "RankExit": events.RankExit,
    "JobHealth": health.JobHealth,
    "Incident": events.Incident,
    "ActionProposal": commands.ActionProposal,
    "ActionRecord": commands.ActionRecord,
    "Command": commands.COMMAND_ADAPTER,
    "Ack": commands.Ack,
    "JobSpec": plan.JobSpec,
    "RegisterReply": plan.RegisterReply,
    "PlanRequest": plan.PlanRequest,
    "Plan": plan.Plan,
    "SpecRequest": plan.SpecRequest,
    "SpecReply": plan.SpecReply,
    "ShardFetch": shards.ShardFetch,
    "ShardReply": shards.ShardReply,
    "ShardCommit": shards.ShardCommit,
    "CommitReply": shards.CommitReply,
    "ShardRestore": shards.ShardRestore,
    "RestoreReply": shards.RestoreReply,
    "ShardRelease": shards.ShardRelease,
    "ReleaseReply": shards.ReleaseReply,
    "ShardStatusRequest": shards.ShardStatusRequest,
    "ShardStatus": shards.ShardStatus,
    "CheckpointCompleted": shards.CheckpointCompleted,
    "EpochFinished": shards.EpochFinished,
    "ShardsReturned": shards.ShardsReturned,
    "NodeJoin": nodes.NodeJoin,
    "NodeHeartbeat": nodes.NodeHeartbeat,
    "NodeAdmission": nodes.NodeAdmission,
    "ErrorReply": errors.ErrorReply,
}

#: Values kept in etcd (not messages), exported with the messages for tools that read them.
STORED: dict[str, Any] = {
    "RestartLedger": restarts.RestartLedger,
    "BlocklistEntry": restarts.BlocklistEntry,
    "NodeRecord": nodes.NodeRecord,
    "ErrorCode": TypeAdapter(errors.ErrorCode),
}

#: What each subject parameter is.
PARAMETERS = {
    "job": "Job id (JobSpec.job): letters, digits, '_' and '-'",
    "rank": "Rank index within the job (0 .. world_size - 1)",
    "route": "Route token of one shards replica (ShardReply.route)",
}


@dataclass(frozen=True)
class Channel:
    """One subject: `builder(*args)` of `Subjects` makes it (`{name}` args are parameters)."""

    id: str
    builder: str
    args: tuple[str, ...]
    transport: Transport
    message: str
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    summary: str
    replies: tuple[str, ...] = ()
    stream: str | None = None
    queue: str | None = None

    def address(self, subjects: Subjects) -> str:
        """The subject with its parameters as `{job}`, `{rank}`, `{route}`."""
        return str(getattr(subjects, self.builder)(*self.args))

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(a[1:-1] for a in self.args if re.fullmatch(r"\{\w+\}", a))

    def reply_messages(self) -> tuple[str, ...]:
        """What a requester may get back: the reply types, then ErrorReply."""
        return (*self.replies, "ErrorReply") if self.replies else ()


JOB, RANK, ROUTE = "{job}", "{rank}", "{route}"
_P, _R, _G, _J = Transport.PUBLISH, Transport.REQUEST, Transport.GATHER, Transport.JETSTREAM
AGENT, MONITOR, CONTROLLER, SHARDS = "agent", "monitor", "controller", "shards"
GATE = "rendezvous gate (torchrun --rdzv-backend=antdt)"
POLICY, ANYONE = "custom policy", "anyone"


def _shards_verbs() -> list[Channel]:
    verbs = [
        ("fetch", "ShardFetch", "ShardReply", "Report finished shards, get more"),
        ("commit", "ShardCommit", "CommitReply", "A rank's part of a checkpoint"),
        ("restore", "ShardRestore", "RestoreReply", "Put the ledger back to a checkpoint"),
        ("release", "ShardRelease", "ReleaseReply", "Remove a rank from the job's data"),
    ]
    out = []
    for verb, message, reply, summary in verbs:
        senders = (AGENT, "antdt shards release") if verb == "release" else (AGENT,)
        for direct in (False, True):
            builder, args = (
                ("shards_direct", (JOB, verb, ROUTE)) if direct else ("shards", (JOB, verb))
            )
            out.append(
                Channel(
                    f"shards_{verb}_direct" if direct else f"shards_{verb}",
                    builder,
                    args,
                    _R,
                    message,
                    senders,
                    (SHARDS,),
                    f"{summary}, to the replica that owns the job's ledger" if direct else summary,
                    replies=(reply,),
                    queue=SHARDS_QUEUE,
                )
            )
    return out


CHANNELS: tuple[Channel, ...] = (
    Channel(
        "step",
        "step",
        (JOB, RANK),
        _P,
        "StepEvent",
        (AGENT,),
        (MONITOR,),
        "One training step of one rank",
        stream=STEP_STREAM,
    ),
    Channel(
        "hello",
        "hello",
        (JOB, RANK),
        _P,
        "RankHello",
        (AGENT,),
        (MONITOR, CONTROLLER),
        "A rank starts: its host and memory cap",
    ),
    Channel(
        "exit", "exit", (JOB, RANK), _P, "RankExit", (AGENT,), (MONITOR,), "A rank stops on purpose"
    ),
    Channel(
        "health",
        "health",
        (JOB,),
        _P,
        "JobHealth",
        (MONITOR,),
        (CONTROLLER, ANYONE),
        "The job's health, every second",
        stream=HEALTH_STREAM,
    ),
    Channel(
        "incident",
        "incident",
        (JOB,),
        _J,
        "Incident",
        (MONITOR,),
        (CONTROLLER, POLICY),
        "A straggler, leader or stall, at each state change",
        stream=INCIDENT_STREAM,
    ),
    Channel(
        "proposal",
        "proposal",
        (JOB,),
        _R,
        "ActionProposal",
        (POLICY,),
        (CONTROLLER,),
        "A custom policy proposes new batches; the job's owner (or, for a job with no "
        "owner, any replica) answers",
        replies=("ActionRecord",),
    ),
    Channel(
        "command",
        "command",
        (JOB, RANK),
        _R,
        "Command",
        (CONTROLLER,),
        (AGENT,),
        "A command to one rank",
        replies=("Ack",),
    ),
    Channel(
        "command_all",
        "command_all",
        (JOB,),
        _G,
        "Command",
        (CONTROLLER,),
        (AGENT,),
        "A command to every rank: one Ack per rank",
        replies=("Ack",),
    ),
    Channel(
        "action",
        "action",
        (JOB,),
        _J,
        "ActionRecord",
        (CONTROLLER,),
        (ANYONE,),
        "What the controller decided, why, and what came of it",
        stream=ACTION_STREAM,
    ),
    Channel(
        "register",
        "register",
        (JOB,),
        _R,
        "JobSpec",
        (AGENT, "antdt job create"),
        (CONTROLLER,),
        "Register a job (the first spec wins)",
        replies=("RegisterReply",),
        queue=CONTROLLER_QUEUE,
    ),
    Channel(
        "plan_get",
        "plan_get",
        (JOB,),
        _R,
        "PlanRequest",
        (AGENT, POLICY, ANYONE),
        (CONTROLLER,),
        "The job's current plan",
        replies=("Plan",),
        queue=CONTROLLER_QUEUE,
    ),
    Channel(
        "spec_get",
        "spec_get",
        (JOB,),
        _R,
        "SpecRequest",
        (POLICY, ANYONE),
        (CONTROLLER,),
        "The job's spec and the guardrails in force",
        replies=("SpecReply",),
        queue=CONTROLLER_QUEUE,
    ),
    Channel(
        "node_join",
        "node_join",
        (JOB,),
        _R,
        "NodeJoin",
        (GATE,),
        (CONTROLLER,),
        "May this node join the job's next rendezvous round? Refused for a blocklisted "
        "host or a name another live process holds",
        replies=("NodeAdmission",),
        queue=CONTROLLER_QUEUE,
    ),
    Channel(
        "node_heartbeat",
        "node_heartbeat",
        (JOB,),
        _R,
        "NodeHeartbeat",
        (GATE,),
        (CONTROLLER,),
        "A node's torchrun is alive (a spare waiting, or hosting ranks): its registry "
        "record lives on",
        replies=("NodeAdmission",),
        queue=CONTROLLER_QUEUE,
    ),
    *_shards_verbs(),
    Channel(
        "shards_status",
        "shards",
        (JOB, "status"),
        _R,
        "ShardStatusRequest",
        ("antdt shards status", ANYONE),
        (SHARDS,),
        "Progress of the job's ledger",
        replies=("ShardStatus",),
        queue=SHARDS_QUEUE,
    ),
    Channel(
        "shards_checkpointed",
        "checkpointed",
        (JOB,),
        _P,
        "CheckpointCompleted",
        (SHARDS,),
        (AGENT,),
        "A checkpoint's ledger snapshot is durable",
    ),
    Channel(
        "shards_epoch",
        "epoch_finished",
        (JOB,),
        _P,
        "EpochFinished",
        (SHARDS,),
        (AGENT,),
        "Every shard of an epoch is done",
    ),
    Channel(
        "shards_returned",
        "shards_returned",
        (JOB,),
        _P,
        "ShardsReturned",
        (SHARDS,),
        (AGENT,),
        "Released ranks handed shards back",
    ),
)

#: `Subjects` methods that make no channel of their own.
NOT_BUILDERS = frozenset({"any_job", "job_of", "rank_of"})


def builders() -> set[str]:
    """The public subject builders of `Subjects` (each must make a channel)."""
    return {n for n in vars(Subjects) if not n.startswith("_") and n not in NOT_BUILDERS} - {
        "prefix"
    }
