"""Nodes (hosts) of a torchrun job: the gate's join request and its admission, the
heartbeat of a node that waits as a spare or hosts ranks, and the registry record the
controller keeps per node in etcd (`jobs/{job}/nodes/{host}`)."""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from antdt.schemas.base import Count, Seconds, Timestamp, Token, WireModel


class NodeState(str, Enum):
    """Where a node's torchrun stands in the rendezvous.

    joining --(round complete, this node in it)--> participant
    joining --(round full: torch elastic's redundancy list)--> waiting
    waiting --(a participant left: next round)--> participant
    participant --(its workers exit: restart)--> joining"""

    JOINING = "joining"  # in next_rendezvous, not yet known which
    WAITING = "waiting"  # a spare: in the rendezvous, hosting no rank
    PARTICIPANT = "participant"  # its workers are ranks of the current round


class NodeReport(WireModel):
    """What a node's torchrun says about itself (the fields of a join and a heartbeat)."""

    job: Token = Field(description="Job id (ANTDT_JOB)")
    host: Token = Field(description="The node's host name (ANTDT_HOST): one node per name")
    process: Token = Field(
        description="Unique id of this torchrun process: a second process with the same "
        "host is a different claimant"
    )
    address: str = Field(max_length=256, description="The node's address, for people")
    state: NodeState = Field(description="Where its torchrun stands in the rendezvous")
    run_id: str = Field(max_length=256, description="torchrun's --rdzv-id")
    restart_round: Count = Field(
        description="next_rendezvous calls of this torchrun before this one (0: first join)"
    )


class NodeJoin(NodeReport):
    """The rendezvous gate asks whether this node may join the next round
    (`{p}.{job}.node.join`). Refused: ErrorReply `blocklisted` or `node_taken`."""


class NodeHeartbeat(NodeReport):
    """A live node, every few seconds while its torchrun runs (`{p}.{job}.node.heartbeat`):
    keeps its registry record from expiring. Refused: `node_taken`."""


class NodeAdmission(WireModel):
    """The controller's yes to a join or a heartbeat: the record is written until
    `expires_at`; another process may take the host's name after that."""

    host: Token = Field(description="The node admitted")
    expires_at: Timestamp = Field(description="When the record lapses without a heartbeat")
    ttl_s: Seconds = Field(description="Seconds a record lives after each join or heartbeat")


class NodeRecord(WireModel):
    """A registered node (`jobs/{job}/nodes/{host}`), written by any controller replica."""

    host: Token = Field(description="The node's host name")
    process: Token = Field(description="The torchrun process that holds the name")
    address: str = Field(max_length=256, description="The node's address, for people")
    state: NodeState = Field(description="Where its torchrun stood at its latest report")
    run_id: str = Field(max_length=256, description="torchrun's --rdzv-id")
    restart_round: Count = Field(description="Its torchrun's next_rendezvous calls before")
    registered_at: Timestamp = Field(description="When this process first registered")
    seen_at: Timestamp = Field(description="Its latest join or heartbeat")
    expires_at: Timestamp = Field(description="seen_at + the registry's ttl")

    def live(self, now: float) -> bool:
        return now < self.expires_at
