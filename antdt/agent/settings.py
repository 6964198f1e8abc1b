"""The agent's settings: one root per training process, read from the environment.

Every field comes from `ANTDT_<FIELD>` (nested with `__`, e.g. `ANTDT_NATS__URL`); the
rank's place in the run also from torchrun's worker contract (antdt.agent.elastic:
RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, ...), which `antdt launch`
sets too. The job id defaults to a named rendezvous id (TORCHELASTIC_RUN_ID)."""

from __future__ import annotations

import re
import socket
from typing import Any

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from antdt.agent.elastic import run_id_as_job
from antdt.runtime.config import NatsSettings, TelemetrySettings
from antdt.runtime.loops import LOOP_KIND_HELP, LoopKind
from antdt.schemas import JobSpec, MonitorParams
from antdt.schemas.plan import PolicyParam

TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")
#: The keys the rendezvous id may arrive under (the env's, or a keyword's).
RUN_ID_KEYS = ("TORCHELASTIC_RUN_ID", "torchelastic_run_id", "run_id")
#: Signals a rank may dump its stacks on: none that a launcher sends to stop a worker
#: (torchrun forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT).
DUMPABLE_SIGNALS = ("SIGUSR1", "SIGUSR2")


def default_host() -> str:
    """The hostname made safe for subjects and keys: dots and odd characters become '-'."""
    name = re.sub(r"[^A-Za-z0-9_\-]", "-", socket.gethostname()).strip("-")
    return (name or "host")[:128]


class AgentSettings(BaseSettings):
    """Settings of one rank's agent."""

    model_config = SettingsConfigDict(
        env_prefix="ANTDT_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    nats: NatsSettings = Field(default_factory=NatsSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    job: str = Field(
        min_length=1,
        max_length=128,
        pattern=TOKEN.pattern,
        description="Job id (default: torchrun's --rdzv-id, or the uuid --standalone makes)",
    )
    run_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TORCHELASTIC_RUN_ID", "run_id"),
        description="The launcher's rendezvous id (TORCHELASTIC_RUN_ID)",
    )
    rank: int = Field(
        ge=0,
        validation_alias=AliasChoices("ANTDT_RANK", "RANK", "rank"),
        description="This process's rank, 0-based",
    )
    world_size: int = Field(
        ge=1,
        validation_alias=AliasChoices("ANTDT_WORLD_SIZE", "WORLD_SIZE", "world_size"),
        description="Ranks in the job",
    )
    local_rank: int | None = Field(
        default=None,
        ge=0,
        validation_alias=AliasChoices("ANTDT_LOCAL_RANK", "LOCAL_RANK", "local_rank"),
        description="This process's rank on its node (LOCAL_RANK), e.g. its GPU",
    )
    host: str = Field(
        default_factory=default_host,
        min_length=1,
        max_length=128,
        pattern=TOKEN.pattern,
        description="Host (node) name reported in events; [A-Za-z0-9_-]+",
    )
    dataset_size: int = Field(ge=1, description="Samples per epoch, samples")
    shard_size: int = Field(ge=1, description="Samples per shard, samples")
    global_batch: int = Field(ge=1, description="Samples per step over all ranks, samples")
    epochs: int = Field(default=1, ge=1, description="Epochs to run, epochs")
    seed: int = Field(default=0, ge=0, description="Seed of shard and in-shard sample order")
    policy: str = Field(default="none", max_length=64, description="Controller policy name")
    policy_params: dict[str, PolicyParam] = Field(
        default_factory=dict, description="The policy's parameters (JSON in the env)"
    )
    inject: str = Field(
        default="",
        description="Straggler schedule, e.g. 'rank=3,factor=3,from=30' (steps; factor x)",
    )
    sample_log: str | None = Field(
        default=None,
        description="Path prefix; if set, ids reaching each update go to <prefix>.rank<r>.jsonl",
    )
    event_queue_max: int = Field(
        default=10_000, ge=1, description="Step events buffered for the bus, events"
    )
    event_flush_s: float = Field(
        default=0.05,
        ge=0,
        le=5,
        description="Step events wait up to this long to go out together (one wake of the "
        "agent's loop per batch, not per step); 0 sends each at once, seconds",
    )
    register_timeout_s: float = Field(
        default=60.0, gt=0, description="How long start() retries connect+register, seconds"
    )
    prefetch: int = Field(
        default=2, ge=1, le=8, description="Shard grants kept ahead of consumption, grants"
    )
    close_timeout_s: float = Field(
        default=5.0, gt=0, description="How long close() waits to flush events/done, seconds"
    )
    max_local_batch: int | None = Field(
        default=None, ge=1, description="Largest local batch memory holds (hello), samples"
    )
    stack_dump_signal: str = Field(
        default="SIGUSR1",
        description="On this signal the rank writes every thread's Python stack to stderr "
        "(faulthandler) and runs on: what a hung rank waits in; '' leaves signals alone",
    )
    device: str = Field(default="cpu", max_length=64, description="Device reported in the hello")
    event_loop: LoopKind = Field(
        default="asyncio",
        description=f"{LOOP_KIND_HELP}, for the agent's I/O thread. asyncio by default: it "
        "carries a few messages a second, and uvloop would be one more compiled package "
        "in the training process for nothing measurable",
    )
    ledger_timeout_s: float = Field(
        default=300.0, gt=0, description="How long commit/restore/leave retry and wait, seconds"
    )
    restart_count: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices(
            "ANTDT_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "restart_count"
        ),
        description="Restarts of this node's group so far (set by the launcher), restarts",
    )
    max_restarts: int | None = Field(
        default=None,
        ge=0,
        validation_alias=AliasChoices("TORCHELASTIC_MAX_RESTARTS", "max_restarts"),
        description="The launcher's restart budget (torchrun --max-restarts), restarts",
    )
    restore_token: str | None = Field(
        default=None,
        max_length=128,
        pattern=TOKEN.pattern,
        description="Names this restart for restore() (default: agreed by the ranks)",
    )
    monitor: MonitorParams | None = Field(
        default=None,
        description="The job's detection tunables, e.g. ANTDT_MONITOR__WINDOW=16 (registered)",
    )

    @field_validator("stack_dump_signal")
    @classmethod
    def _a_signal(cls, name: str) -> str:
        if name and name not in DUMPABLE_SIGNALS:
            raise ValueError(f"not a signal to dump stacks on: {name!r} (SIGUSR1, SIGUSR2 or '')")
        return name

    @model_validator(mode="before")
    @classmethod
    def _job_from_run_id(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("job"):
            return data
        run_id = next((data[k] for k in RUN_ID_KEYS if data.get(k)), None)
        job = run_id_as_job(run_id)
        if job is None:
            raise ValueError(
                "no job id: set ANTDT_JOB (or run under torchrun with --standalone or a "
                f"named --rdzv-id; its default {run_id!r} would join every unnamed run)"
                if run_id
                else "no job id: set ANTDT_JOB (or run under torchrun, whose run id serves)"
            )
        return {**data, "job": job}

    @property
    def restarts_left(self) -> int | None:
        """Group restarts the launcher has left (None: it did not say)."""
        if self.max_restarts is None:
            return None
        return max(0, self.max_restarts - self.restart_count)

    @model_validator(mode="after")
    def _rank_in_job(self) -> AgentSettings:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside a job of {self.world_size} ranks")
        return self

    def job_spec(self) -> JobSpec:
        """The spec this rank registers (the controller's stored spec wins if it differs)."""
        return JobSpec(
            job=self.job,
            world_size=self.world_size,
            dataset_size=self.dataset_size,
            shard_size=self.shard_size,
            global_batch=self.global_batch,
            epochs=self.epochs,
            seed=self.seed,
            policy=self.policy,
            policy_params=self.policy_params,
            monitor=self.monitor,
        )
