"""Embedded nats-server (JetStream) and etcd from their PyPI wheels, for
development, demos and tests."""

from antdt.runtime.servers.embedded import (
    MAX_PENDING_BYTES,
    EmbeddedCluster,
    EmbeddedEtcd,
    EmbeddedNats,
    ManagedProcess,
    ServerError,
    ServerTls,
    die_with_parent,
    free_port,
    go_server_env,
)
from antdt.runtime.servers.netns import in_netns, netns_argv

__all__ = [
    "MAX_PENDING_BYTES",
    "EmbeddedCluster",
    "EmbeddedEtcd",
    "EmbeddedNats",
    "ManagedProcess",
    "ServerError",
    "ServerTls",
    "die_with_parent",
    "free_port",
    "go_server_env",
    "in_netns",
    "netns_argv",
]
