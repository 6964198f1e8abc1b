"""Services for end-to-end tests: the real three services, in this test process, against
the session's real nats-server and etcd, each test under its own prefixes; and one real
2-rank lb-bsp job, each rank pinned to its own core, with a noisy neighbour (a busy loop
pinned to the straggler's core) from step ONSET: run once per session and shared by the
tests that check what came of it (the control loop, the report, the status view, the
traces).

Security is on, as `antdt up` runs: the servers are tests/secured.py's (a NATS user per
role, TLS, etcd users limited to the tests' prefix); every service, agent and CLI here
connects as its own role, the test's probes as the harness user. ANTDT_TEST_PLAIN=1
runs the suite on the plain servers instead; tests that need plain servers ask for
`plain_settings`.

Telemetry of that run goes to a real OTLP receiver in this process (`telemetry`): the
services here through the global tracer and meter providers, the ranks through
ANTDT_TELEMETRY__OTLP_ENDPOINT."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from antdt.observe import ensure_recording
from antdt.runtime.bus import Bus, Delivery
from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.telemetry import MetricsExport, flush_tracing, setup_metrics, setup_tracing
from antdt.schemas import ActionRecord, Incident, JobHealth, StepEvent, Subjects
from antdt.services.runner import settings_class, start_service
from antdt.testing import cores, foreground, neighbour_from_step
from tests.conftest import settings_on
from tests.otlp_receiver import OtlpReceiver
from tests.secured import SecuredServers, agent_env, own_role

WORLD, DATASET, BATCH, EPOCHS, ONSET = 2, 24000, 1024, 4, 15
#: The rank whose core the noisy neighbour shares from step ONSET.
STRAGGLER = WORLD - 1
#: Busy loops on the straggler's core, each a session of its own: the rank keeps about a
#: third of its core, about 3x slower (as the sleep injection this replaced).
NEIGHBOURS = 2


@dataclass
class RunningServices:
    runtime: ServiceRuntime
    by_name: dict[str, Any]


async def start_services(
    settings: ServiceSettings,
    names: tuple[str, ...] = ("monitor", "controller", "shards"),
    settings_of: Callable[[str], ServiceSettings] | None = None,
    **overrides: Any,
) -> RunningServices:
    """The services `names`, each with `settings_of(name)` (default: `settings` as its
    own role's users, where secured), and `overrides` of the fields its settings have."""
    runtime = ServiceRuntime("test-services")
    by_name = {}
    for name in names:
        cls = settings_class(name)
        fields = {k: v for k, v in overrides.items() if k in cls.model_fields}
        own = settings_of(name) if settings_of else own_role(settings, name)
        service_settings = cls(**{**own.model_dump(), **fields})
        by_name[name] = await start_service(name, service_settings, runtime)
    return RunningServices(runtime, by_name)


PLAIN = os.environ.get("ANTDT_TEST_PLAIN", "") not in ("", "0", "false")


@pytest.fixture(scope="session")
async def secured_servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[SecuredServers | None]:
    """The session's secured servers (None under ANTDT_TEST_PLAIN=1)."""
    if PLAIN:
        yield None
        return
    servers = await SecuredServers.start(tmp_path_factory.mktemp("secured"))
    yield servers
    servers.stop()


@pytest.fixture(autouse=True)
def within_their_roles(secured_servers: SecuredServers | None) -> Iterator[None]:
    """Every connection of a test (services, ranks, CLI) stayed within its role: the
    secured nats-server refused no publish and no subscription meanwhile."""
    if secured_servers is None:
        yield
        return
    start = secured_servers.log_offset()
    yield
    refused = secured_servers.violations(start)
    assert not refused, "\n".join(refused)


@pytest.fixture
def plain_settings(cluster: EmbeddedCluster, unique: str) -> ServiceSettings:
    """Settings on the session's plain servers: no users, no TLS."""
    return settings_on(cluster, unique)


@pytest.fixture
def settings(
    secured_servers: SecuredServers | None, request: pytest.FixtureRequest, unique: str
) -> ServiceSettings:
    """A test's settings as the harness user on the secured servers (plain ones under
    ANTDT_TEST_PLAIN=1), with prefixes of its own."""
    if secured_servers is None:
        return settings_on(request.getfixturevalue("cluster"), unique)
    return secured_servers.harness(unique)


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    running = await start_services(settings, window=8)
    yield running
    await running.runtime.shutdown()


@dataclass
class Telemetry:
    receiver: OtlpReceiver
    tracer_provider: Any
    metrics: MetricsExport

    def flush(self) -> None:
        self.tracer_provider.force_flush(5000)
        self.metrics.provider.force_flush(5000)


@pytest.fixture(scope="session")
def telemetry() -> Iterator[Telemetry]:
    """A real OTLP receiver, and this process's tracer and meter providers exporting to it."""
    from opentelemetry import metrics, trace

    receiver = OtlpReceiver().start()
    provider = setup_tracing("antdt-test-services", receiver.endpoint)
    exported = setup_metrics("antdt-test-services", otlp_endpoint=receiver.endpoint)
    assert exported is not None
    assert trace.get_tracer_provider() is provider, "another global tracer provider was set"
    assert metrics.get_meter_provider() is exported.provider
    yield Telemetry(receiver, provider, exported)
    flush_tracing(provider)
    exported.flush()
    receiver.stop()


def straggler_env(
    settings: ServiceSettings, job: str, out: Path, otlp_endpoint: str | None = None
) -> dict[str, str]:
    """The job under policy lb-bsp (the noisy neighbour is the fixture's, not the env's)."""
    env = dict(os.environ)
    if otlp_endpoint:  # the ranks' spans go there; exported within 0.5 s and at close
        env.update(ANTDT_TELEMETRY__OTLP_ENDPOINT=otlp_endpoint, OTEL_BSP_SCHEDULE_DELAY="500")
    env.update(
        **agent_env(settings, job),
        ANTDT_JOB=job,
        ANTDT_POLICY="lb-bsp",
        ANTDT_DATASET_SIZE=str(DATASET),
        ANTDT_SHARD_SIZE="256",
        ANTDT_GLOBAL_BATCH=str(BATCH),
        ANTDT_EPOCHS=str(EPOCHS),
        ANTDT_SEED="3",
        ANTDT_SAMPLE_LOG=str(out / "samples"),
        ANTDT_DEMO_OUT=str(out),
        ANTDT_DEMO_WIDTH="1024",
        ANTDT_TELEMETRY__LOG_FORMAT="json",
    )
    return env


@dataclass
class StragglerRun:
    """What one real job published, collected live (`collect`), plus where its files
    went."""

    job: str
    settings: ServiceSettings
    out: Path
    rc: int = -1
    steps: dict[int, list[StepEvent]] = field(default_factory=lambda: defaultdict(list))
    health: list[JobHealth] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)


def per_sample_s(run: StragglerRun, rank: int, first: int, last: int) -> float:
    """Median compute seconds per sample of `rank` over steps [first, last)."""
    events = [e for e in run.steps[rank] if first <= e.step < last and e.samples > 0]
    costs = [e.compute_s / e.samples for e in events]
    assert costs, f"rank {rank} has no step in [{first}, {last})"
    return statistics.median(costs)


def neighbour_slowdown(run: StragglerRun, last: int) -> float:
    """What the neighbour did: the straggler's per-sample compute time over the other
    ranks' in steps [ONSET + 1, last), over the same before ONSET. Load on every core
    alike moves neither; the kernel moving a busy machine's other work onto the other
    ranks' cores lowers it."""

    def relative(first: int, end: int) -> float:
        others = [per_sample_s(run, r, first, end) for r in range(WORLD) if r != STRAGGLER]
        return per_sample_s(run, STRAGGLER, first, end) / statistics.median(others)

    return relative(ONSET + 1, last) / relative(2, ONSET)


async def collect(
    bus: Bus, run: StragglerRun, *, reader: Bus | None = None, incidents: Bus | None = None
) -> None:
    """Subscribe `run`'s lists to what its job publishes, from now on: its steps on `bus`,
    its health and actions on `reader`, its incidents on `incidents` (both default to
    `bus`; under per-role permissions, an observer's and a policy's connections)."""
    subjects, job = Subjects(run.settings.nats.subject_prefix), run.job
    reader = reader or bus
    incidents = incidents or bus

    async def on_step(event: StepEvent, _: Delivery) -> None:
        run.steps[event.rank].append(event)

    async def sink(items: list[Any], model: Any) -> None:
        items.append(model)

    await bus.subscribe(subjects.step(job, "*"), StepEvent, on_step)
    await reader.subscribe(subjects.health(job), JobHealth, lambda m, _: sink(run.health, m))
    await incidents.subscribe(subjects.incident(job), Incident, lambda m, _: sink(run.incidents, m))
    await reader.subscribe(subjects.action(job), ActionRecord, lambda m, _: sink(run.actions, m))
    for each in {id(b): b for b in (bus, reader, incidents)}.values():
        await each.flush()


async def run_straggler_job(run: StragglerRun, env: dict[str, str]) -> None:
    """Run `run`'s job: WORLD ranks of antdt.demo.train pinned one per core, in the
    foreground where permitted, the noisy neighbour on the straggler's core from step
    ONSET until the job ends (also when it fails); sets `run.rc`."""
    from antdt.agent.launch import launch

    command = [sys.executable, "-m", "antdt.demo.train"]
    pinned = cores()[:WORLD]
    with foreground():
        job = asyncio.ensure_future(
            asyncio.to_thread(launch, WORLD, command, env=env, cores=pinned)
        )
        try:
            progress, core = run.out / "progress.jsonl", pinned[STRAGGLER]
            async with neighbour_from_step(core, progress, ONSET, job, processes=NEIGHBOURS):
                run.rc = await job
        finally:
            await asyncio.wait([job])  # its ranks end with the job: none left behind


@pytest.fixture(scope="session")
async def straggler_run(
    secured_servers: SecuredServers | None,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    telemetry: Telemetry,
) -> AsyncIterator[StragglerRun]:
    """The straggler job, run once per session, its ranks pinned one per core, in the
    foreground of the machine (with the services here) where permitted. The neighbour is
    gone when the job ends, also when it fails; the services stay up (and the recording
    streams hold the run) until the session ends."""
    if len(cores()) < WORLD:
        pytest.skip(f"pins {WORLD} ranks one per core: this process may use {len(cores())}")
    unique = "t" + uuid.uuid4().hex[:10]
    if secured_servers is None:
        settings = settings_on(request.getfixturevalue("cluster"), unique)
    else:
        settings = secured_servers.harness(unique)
    running = await start_services(settings, window=8)
    bus = await Bus(settings.nats, name="e2e-straggler-run").connect()
    run = StragglerRun(job=f"e2e-{unique}", settings=settings, out=tmp_path_factory.mktemp("run"))
    try:
        await ensure_recording(bus, Subjects(settings.nats.subject_prefix), settings.recording)
        await collect(bus, run)
        await run_straggler_job(
            run, straggler_env(settings, run.job, run.out, telemetry.receiver.endpoint)
        )
        yield run
    finally:
        await bus.close()
        await running.runtime.shutdown()
