"""Services for end-to-end tests: the real three services, in this test process, against
the session's real nats-server and etcd, each test under its own prefixes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from antdt.runtime.config import ServiceSettings
from antdt.runtime.lifecycle import ServiceRuntime
from antdt.services.runner import settings_class, start_service


@dataclass
class RunningServices:
    runtime: ServiceRuntime
    by_name: dict[str, Any]


async def start_services(
    settings: ServiceSettings,
    names: tuple[str, ...] = ("monitor", "controller", "shards"),
    **overrides: Any,
) -> RunningServices:
    runtime = ServiceRuntime("test-services")
    by_name = {}
    for name in names:
        cls = settings_class(name)
        fields = {k: v for k, v in overrides.items() if k in cls.model_fields}
        service_settings = cls(**settings.model_dump(), **fields)
        by_name[name] = await start_service(name, service_settings, runtime)
    return RunningServices(runtime, by_name)


@pytest.fixture
async def services(settings: ServiceSettings) -> AsyncIterator[RunningServices]:
    running = await start_services(settings, window=8)
    yield running
    await running.runtime.shutdown()
