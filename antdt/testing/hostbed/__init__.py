"""Several hosts on one machine, for tests and benches: Linux network namespaces on one
bridge, each with its own address and CPU budget (a cgroup quota), nats-server and etcd
on any of them, and real faults (a competing process, a slow or cut link). Needs root and
iproute2 (`ip`, `tc`); `unavailable_reason()` says why not where it cannot run."""

from antdt.runtime.cpubudget import CpuLimit
from antdt.testing.hostbed._bed import BedState, Host, HostBed, Servers
from antdt.testing.hostbed._names import BedError
from antdt.testing.hostbed._net import Shaping
from antdt.testing.hostbed._probe import unavailable_reason
from antdt.testing.hostbed._sweep import sweep_stale

__all__ = [
    "BedError",
    "BedState",
    "CpuLimit",
    "Host",
    "HostBed",
    "Servers",
    "Shaping",
    "sweep_stale",
    "unavailable_reason",
]
