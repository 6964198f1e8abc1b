"""Builders for NATS subjects and etcd keys. No I/O. Every subject builder is a channel of
the AsyncAPI document (channels.py), which a test holds to this class."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_SUBJECT_PREFIX = "antdt.v1"
DEFAULT_KEY_PREFIX = "/antdt/v1/"

INCIDENT_STREAM = "ANTDT_INCIDENTS"
ACTION_STREAM = "ANTDT_ACTIONS"


def route_token(replica_id: str) -> str:
    """A replica id as one subject token (host names may hold dots): every character
    outside [A-Za-z0-9_-] becomes '_', at most 128 characters."""
    return re.sub(r"[^A-Za-z0-9_\-]", "_", replica_id)[:128] or "_"


@dataclass(frozen=True)
class Subjects:
    """All subjects of one deployment, under a configurable prefix."""

    prefix: str = DEFAULT_SUBJECT_PREFIX

    def step(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.{job}.step.{rank}"

    def hello(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.{job}.hello.{rank}"

    def exit(self, job: str, rank: int | str) -> str:
        """An agent says its rank stops on purpose (RankExit)."""
        return f"{self.prefix}.{job}.exit.{rank}"

    def health(self, job: str) -> str:
        return f"{self.prefix}.{job}.health"

    def incident(self, job: str) -> str:
        return f"{self.prefix}.{job}.incident"

    def proposal(self, job: str) -> str:
        return f"{self.prefix}.{job}.proposal"

    def command(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.{job}.cmd.{rank}"

    def command_all(self, job: str) -> str:
        return f"{self.prefix}.{job}.cmd"

    def action(self, job: str) -> str:
        return f"{self.prefix}.{job}.action"

    def shards(self, job: str, verb: str) -> str:
        """verb: fetch (done-and-fetch in one request), commit, restore, release, status."""
        return f"{self.prefix}.{job}.shards.{verb}"

    def checkpointed(self, job: str) -> str:
        """Where the shards service announces a job's completed checkpoints (published,
        not a request: every rank of the job listens)."""
        return f"{self.prefix}.{job}.shards.checkpointed"

    def epoch_finished(self, job: str) -> str:
        """Where the shards service announces that an epoch of the job is finished
        (EpochFinished; published: every rank of the job listens)."""
        return f"{self.prefix}.{job}.shards.epoch"

    def shards_returned(self, job: str) -> str:
        """Where the shards service announces that a release handed shards of the job back
        (ShardsReturned; published: every rank of the job listens)."""
        return f"{self.prefix}.{job}.shards.returned"

    def shards_direct(self, job: str, verb: str, route: str) -> str:
        """`shards(job, verb)` addressed to one replica (its route token, see
        `route_token`): how ranks reach the replica that owns their job's ledger."""
        return f"{self.prefix}.{job}.shards.{verb}.{route}"

    def plan_get(self, job: str) -> str:
        return f"{self.prefix}.{job}.plan.get"

    def spec_get(self, job: str) -> str:
        """Anyone asks for the job's spec and the guardrails in force (SpecReply)."""
        return f"{self.prefix}.{job}.spec.get"

    def register(self, job: str) -> str:
        """An agent (or `antdt job create`) registers the job spec with the controller."""
        return f"{self.prefix}.{job}.register"

    def node_join(self, job: str) -> str:
        """The rendezvous gate asks whether its node may join (NodeJoin)."""
        return f"{self.prefix}.{job}.node.join"

    def node_heartbeat(self, job: str) -> str:
        """A node's torchrun says it is alive, waiting or hosting ranks (NodeHeartbeat)."""
        return f"{self.prefix}.{job}.node.heartbeat"

    def any_job(self, tail: str) -> str:
        """Wildcard over all jobs: `{prefix}.*.{tail}`."""
        return f"{self.prefix}.*.{tail}"

    def job_of(self, subject: str) -> str:
        """The job token of a subject built here."""
        rest = subject[len(self.prefix) + 1 :]
        return rest.split(".", 1)[0]

    def rank_of(self, subject: str) -> str:
        """The last token (the rank) of a per-rank subject."""
        return subject.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Keys:
    """All etcd keys of one deployment, under a configurable prefix."""

    prefix: str = DEFAULT_KEY_PREFIX

    def owner(self, service: str, job: str) -> str:
        return f"{self.prefix}owners/{service}/{job}"

    def owners(self, service: str) -> str:
        return f"{self.prefix}owners/{service}/"

    def member(self, service: str, replica: str) -> str:
        """A live replica of `service`, bound to its lease (placement's member list)."""
        return f"{self.prefix}members/{service}/{replica}"

    def members(self, service: str) -> str:
        return f"{self.prefix}members/{service}/"

    def jobs(self) -> str:
        return f"{self.prefix}jobs/"

    def job(self, job: str) -> str:
        """Prefix of every key of one job."""
        return f"{self.prefix}jobs/{job}/"

    def spec(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/spec"

    def plan(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/plan"

    def ledger(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/ledger/state"

    def ledger_checkpoint(self, job: str, step: int) -> str:
        return f"{self.prefix}jobs/{job}/ledger/ckpt/{step:012d}"

    def restarts(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/restarts"

    def rank_hello(self, job: str, rank: int) -> str:
        """The latest RankHello of the job's rank (stored by the controller)."""
        return f"{self.prefix}jobs/{job}/ranks/{rank}"

    def rank_hellos(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/ranks/"

    def ended(self, job: str) -> str:
        """The job's last JobHealth (every rank exited), written by the monitor when the
        job ended; deleted when it registers again. Services stop claiming such a job."""
        return f"{self.prefix}jobs/{job}/ended"

    def abandoned(self, job: str) -> str:
        """Beside `ended` when the monitor ended the job as abandoned (no rank heard from):
        such a job may only have been silent, so every monitor replica still receives its
        steps (dormant). Deleted with `ended` when the job steps on or registers again."""
        return f"{self.prefix}jobs/{job}/abandoned"

    def node(self, job: str, host: str) -> str:
        """A registered node of the job (NodeRecord), with its expiry time."""
        return f"{self.prefix}jobs/{job}/nodes/{host}"

    def nodes(self, job: str) -> str:
        return f"{self.prefix}jobs/{job}/nodes/"

    def blocklist(self, host: str) -> str:
        return f"{self.prefix}blocklist/{host}"

    def blocklists(self) -> str:
        """Prefix of every blocklist key (all hosts, all jobs)."""
        return f"{self.prefix}blocklist/"

    def host_of_blocklist_key(self, key: str) -> str | None:
        """The host of a `blocklist/{host}` key, None for other keys."""
        if not key.startswith(self.blocklists()):
            return None
        return key[len(self.blocklists()) :] or None

    def job_of_spec_key(self, key: str) -> str | None:
        """The job id of a `jobs/{job}/spec` key, None for other keys."""
        return self._job_of(key, "/spec")

    def job_of_ended_key(self, key: str) -> str | None:
        """The job id of a `jobs/{job}/ended` key, None for other keys."""
        return self._job_of(key, "/ended")

    def job_of_abandoned_key(self, key: str) -> str | None:
        """The job id of a `jobs/{job}/abandoned` key, None for other keys."""
        return self._job_of(key, "/abandoned")

    def _job_of(self, key: str, leaf: str) -> str | None:
        if not key.startswith(self.jobs()) or not key.endswith(leaf):
            return None
        job = key[len(self.jobs()) : -len(leaf)]
        return job if job and "/" not in job else None
