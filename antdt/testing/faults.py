"""The chaos soak's pure core: a seeded fault schedule and the table of what each fault
did. No I/O, no clock: the driver passes times in, injects what `due` returns, and feeds
what it saw back through `advance`. The same seed gives the same schedule."""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace


class FaultKind(enum.Enum):
    """What a fault does; `group` is what two faults at once must not share."""

    KILL_RANK = "kill_rank"  # kill -9 of a training rank
    KILL_REPLICA = "kill_replica"  # kill -9 of one replica of a service
    KILL_NATS = "kill_nats"  # kill -9 of one node of the NATS cluster
    KILL_ETCD = "kill_etcd"  # kill -9 of one node of the etcd cluster
    CUT_LINK = "cut_link"  # a host's link down, then up again
    CONTEND_CPU = "contend_cpu"  # busy loops on a host's cores
    PAUSE = "pause"  # SIGSTOP, then SIGCONT, of a process


#: Faults of a group never overlap: one NATS or etcd node down at a time keeps a 3-node
#: cluster's quorum; one rank, replica or host at a time keeps every failure recoverable.
GROUP = {
    FaultKind.KILL_RANK: "ranks",
    FaultKind.KILL_REPLICA: "replicas",
    FaultKind.KILL_NATS: "nats",
    FaultKind.KILL_ETCD: "etcd",
    FaultKind.CUT_LINK: "hosts",
    FaultKind.CONTEND_CPU: "hosts",
    FaultKind.PAUSE: "processes",
}


@dataclass(frozen=True)
class Fault:
    """One planned fault: injected at `at_s` (from the soak's start) on `target`, undone
    (restarted, link restored, neighbour stopped, SIGCONT) `hold_s` later."""

    number: int
    at_s: float
    kind: FaultKind
    target: str
    hold_s: float

    @property
    def until_s(self) -> float:
        return self.at_s + self.hold_s


@dataclass(frozen=True)
class Targets:
    """What the soak may break, by kind (an empty list: that kind is left out)."""

    ranks: Sequence[str] = ()
    replicas: Sequence[str] = ()
    nats: Sequence[str] = ()
    etcd: Sequence[str] = ()
    hosts: Sequence[str] = ()
    processes: Sequence[str] = ()

    def of(self, kind: FaultKind) -> Sequence[str]:
        """The targets of `kind`: the field named as its group."""
        found: Sequence[str] = getattr(self, GROUP[kind])
        return found


def schedule(
    seed: int,
    targets: Targets,
    *,
    count: int,
    every_s: float = 15.0,
    jitter_s: float = 5.0,
    hold_s: tuple[float, float] = (2.0, 8.0),
    leave_out: frozenset[FaultKind] = frozenset(),
) -> tuple[Fault, ...]:
    """`count` faults about `every_s` apart (+- `jitter_s`), each kind with targets in
    turn (every round of kinds shuffled by the seed), so that the counts of any two kinds
    differ by one at most; a fault whose group is still held waits for it to end. Kinds
    in `leave_out` (a driver cannot inject them) never come."""
    rng = random.Random(seed)
    kinds = [k for k in FaultKind if targets.of(k) and k not in leave_out]
    if not kinds:
        return ()
    free_at: dict[str, float] = {}
    faults: list[Fault] = []
    at = 0.0
    order: list[FaultKind] = []
    for number in range(count):
        if not order:
            order = rng.sample(kinds, len(kinds))
        kind = order.pop()
        at = max(at + every_s + rng.uniform(-jitter_s, jitter_s), free_at.get(GROUP[kind], 0.0))
        target = rng.choice(list(targets.of(kind)))
        fault = Fault(number, round(at, 3), kind, target, round(rng.uniform(*hold_s), 3))
        free_at[GROUP[kind]] = fault.until_s
        faults.append(fault)
    return tuple(faults)


def due(faults: Iterable[Fault], since_s: float, now_s: float) -> list[Fault]:
    """The faults to inject in (since_s, now_s]: the driver's one question per tick."""
    return [f for f in faults if since_s < f.at_s <= now_s]


class FaultState(enum.Enum):
    """Where a fault is; each line a transition of `advance`.

    PLANNED ──injected──────────────────────────────▶ INJECTED
    INJECTED ──undone (restarted, restored, SIGCONT)─▶ UNDONE
    INJECTED, UNDONE ──recovered (the system's own)──▶ RECOVERED
    PLANNED, INJECTED, UNDONE ──failed (+ reason)────▶ FAILED
    """

    PLANNED = "planned"
    INJECTED = "injected"
    UNDONE = "undone"
    RECOVERED = "recovered"
    FAILED = "failed"


_NEXT = {
    "injected": ({FaultState.PLANNED}, FaultState.INJECTED),
    "undone": ({FaultState.INJECTED}, FaultState.UNDONE),
    "recovered": ({FaultState.INJECTED, FaultState.UNDONE}, FaultState.RECOVERED),
    "failed": ({FaultState.PLANNED, FaultState.INJECTED, FaultState.UNDONE}, FaultState.FAILED),
}


@dataclass(frozen=True)
class FaultRecord:
    """One fault and what became of it: the table's row."""

    fault: Fault
    state: FaultState = FaultState.PLANNED
    injected_s: float | None = None
    recovered_s: float | None = None
    note: str = ""  # what the system did, or why it failed


def advance(record: FaultRecord, event: str, at_s: float, note: str = "") -> FaultRecord:
    """The record after `event` (injected, undone, recovered, failed) at `at_s`;
    ValueError for an event its state does not take."""
    if event not in _NEXT:
        raise ValueError(f"unknown fault event {event!r}")
    sources, target = _NEXT[event]
    if record.state not in sources:
        raise ValueError(f"fault {record.fault.number}: {event} from {record.state.value}")
    changed = replace(record, state=target, note=note or record.note)
    if target is FaultState.INJECTED:
        return replace(changed, injected_s=at_s)
    if target is FaultState.RECOVERED:
        return replace(changed, recovered_s=at_s)
    return changed


def table(records: Sequence[FaultRecord]) -> str:
    """The faults injected and what the system did, one line each, then the count of
    each kind and state."""
    lines = [
        f"{'#':>3}  {'at s':>7}  {'kind':<12}  {'target':<16}  {'state':<9}  "
        f"{'back in s':>9}  what the system did"
    ]
    for r in records:
        back = (
            ""
            if r.recovered_s is None or r.injected_s is None
            else (f"{r.recovered_s - r.injected_s:.1f}")
        )
        lines.append(
            f"{r.fault.number:>3}  {r.fault.at_s:>7.1f}  {r.fault.kind.value:<12}  "
            f"{r.fault.target[:16]:<16}  {r.state.value:<9}  {back:>9}  {r.note}"
        )
    kinds = Counter(r.fault.kind.value for r in records)
    states = Counter(r.state.value for r in records)
    lines.append("kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    lines.append("states: " + ", ".join(f"{k} {n}" for k, n in sorted(states.items())))
    return "\n".join(lines)
