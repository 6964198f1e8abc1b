"""Session fixtures: one real nats-server (JetStream) and one real etcd on free loopback
ports for the whole session; every test gets its own subject and key prefix."""

from __future__ import annotations

import os

# The test process uses gRPC (the etcd client) and then forks servers and ranks: grpc's
# fork handlers can crash such a child, and the children exec at once anyway.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Every reply must say its type (Antdt-Reply), in this process and the ones it starts: so
# every request/reply the suite makes checks the marker (the bus's reply decoding).
os.environ.setdefault("ANTDT_NATS__REQUIRE_REPLY_TYPE", "true")
# The suite's ranks train on the CPU (their scripts keep models there) even on a machine
# with GPUs, where init_process_group would pick nccl; tests/gpu clear this for theirs.
os.environ.setdefault("ANTDT_BACKEND", "gloo")

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from antdt.runtime.bus import Bus
from antdt.runtime.config import EtcdSettings, NatsSettings, ServiceSettings
from antdt.runtime.servers import EmbeddedCluster
from antdt.runtime.store import Store


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    root: Path = tmp_path_factory.mktemp("cluster")
    with EmbeddedCluster(root=root, keep=True) as running:
        yield running


@pytest.fixture
def unique() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def settings(cluster: EmbeddedCluster, unique: str) -> ServiceSettings:
    """Service settings pointing at the session's servers, with per-test prefixes."""
    return settings_on(cluster, unique)


def settings_on(cluster: EmbeddedCluster, unique: str) -> ServiceSettings:
    """Settings on `cluster` with the prefixes of test `unique`."""
    return ServiceSettings(
        nats=NatsSettings(url=cluster.nats.url, subject_prefix=f"antdt.{unique}"),
        etcd=EtcdSettings(
            endpoint=cluster.etcd.endpoint, key_prefix=f"/antdt-test/{unique}/", lease_ttl_s=2
        ),
        replica_id=f"replica-{unique}",
    )


@pytest.fixture
async def bus(settings: ServiceSettings) -> AsyncIterator[Bus]:
    connected = await Bus(settings.nats, name="test").connect()
    yield connected
    await connected.close()


@pytest.fixture
async def store(settings: ServiceSettings) -> AsyncIterator[Store]:
    connected = await Store(settings.etcd).connect()
    yield connected
    await connected.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip, saying why, where torch sees no CUDA device (CI)."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    reason = _no_cuda_reason() if gpu_tests else None
    for item in gpu_tests if reason else []:
        item.add_marker(pytest.mark.skip(reason=reason))


def _no_cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs a CUDA device: torch is not installed"
    if torch.cuda.is_available():
        return None
    build = torch.version.cuda or "none (a CPU build)"
    return f"needs a CUDA device: torch {torch.__version__} sees none (its CUDA: {build})"
