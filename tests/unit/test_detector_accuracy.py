"""Detector accuracy on seeded, labelled traces (antdt.sim.traces) and on the scenarios of
what real jobs show (antdt.sim.scenarios), pure core only.

Scoring, per rank (one rank = one sample):

- truth: the generator's label class (healthy, transient, persistent, deterministic,
  leader, data, dead);
- prediction: from the incidents the detector opened for that rank over the whole trace:
  "dead" if it opened a STALLED incident; otherwise the latest SLOW or LEADER incident
  in its final state: LEADER -> "leader"; SLOW with cause DATA -> "data"; SLOW with
  class TRANSIENT / PERSISTENT / DETERMINISTIC -> that class; SLOW still unclassified
  (open, not yet escalated) -> "unclassified"; no incident at all -> "healthy".
- precision(c) = |truth c and predicted c| / |predicted c|, recall(c) = |truth c and
  predicted c| / |truth c|, over all ranks of all traces of one job size; every class
  must reach 0.95 (a class never predicted and never true is not scored).

The detector sees the events in arrival order with `now` = arrival time, and
`check_stalls(now)` once per simulated second, as the service shell does.
Detection latency of a persistent straggler: the step of its first incident minus its
onset step, which must be <= 2 windows.
"""

from __future__ import annotations

from collections import Counter

import pytest

from antdt.schemas import Cause, Incident, IncidentKind, StragglerClass
from antdt.services.monitor import DetectorConfig, JobDetector
from antdt.sim.scenarios import Scenario, Truth, fixed_cost, half_job, two_ranks, whole_host
from antdt.sim.traces import RankClass, Trace, generate, healthy, mixed

W = DetectorConfig().window
CLASSES = [c.value for c in RankClass] + ["unclassified"]


def replay(trace: Trace, detector: JobDetector | None = None) -> dict[int, list[Incident]]:
    """Feed the trace; return every incident transition, by rank."""
    detector = detector or JobDetector(trace.spec.job, trace.spec.world)
    by_rank: dict[int, list[Incident]] = {r: [] for r in range(trace.spec.world)}
    next_tick = trace.events[0][0] + 1.0
    for now, event in trace.events:
        while now >= next_tick:
            for incident in detector.check_stalls(next_tick):
                by_rank[incident.rank].append(incident)
            next_tick += 1.0
        for incident in detector.ingest(event, now):
            by_rank[incident.rank].append(incident)
    return by_rank


def predicted(transitions: list[Incident]) -> str:
    if any(i.kind is IncidentKind.STALLED for i in transitions):
        return RankClass.DEAD.value
    deviations = [i for i in transitions if i.kind is not IncidentKind.STALLED]
    if not deviations:
        return RankClass.HEALTHY.value
    last = deviations[-1]
    if last.kind is IncidentKind.LEADER:
        return RankClass.LEADER.value
    if last.cause is Cause.DATA:
        return RankClass.DATA.value
    if last.straggler_class is StragglerClass.UNKNOWN:
        return "unclassified"
    return last.straggler_class.value


def score(
    confusion: Counter[tuple[str, str]], classes: list[str] = CLASSES
) -> dict[str, tuple[float, float, int]]:
    """class -> (precision, recall, support), for the classes true or predicted."""
    out = {}
    for c in classes:
        true_c = sum(n for (t, _), n in confusion.items() if t == c)
        pred_c = sum(n for (_, p), n in confusion.items() if p == c)
        if true_c == 0 and pred_c == 0:
            continue
        hit = confusion[(c, c)]
        out[c] = (hit / pred_c if pred_c else 0.0, hit / true_c if true_c else 0.0, true_c)
    return out


def print_matrix(title: str, confusion: Counter[tuple[str, str]]) -> None:
    used = [c for c in CLASSES if any(c in key for key in confusion)]
    width = max(len(c) for c in used) + 2
    print(f"\n{title}: rows = truth, columns = predicted")
    print(" " * width + "".join(c[:12].rjust(14) for c in used))
    for t in used:
        print(t.ljust(width) + "".join(str(confusion[(t, p)]).rjust(14) for p in used))
    for c, (precision, recall, support) in score(confusion).items():
        print(f"  {c:<14} precision {precision:.3f}  recall {recall:.3f}  (n={support})")


@pytest.mark.parametrize(("world", "seeds"), [(16, range(8)), (256, range(3))])
def test_classification_precision_and_recall(world: int, seeds: range) -> None:
    confusion: Counter[tuple[str, str]] = Counter()
    latencies: list[int] = []
    causes: Counter[tuple[str, str]] = Counter()
    for seed in seeds:
        trace = generate(mixed(world, seed=seed, blip_prob=0.2))
        by_rank = replay(trace)
        for label in trace.labels:
            transitions = by_rank[label.rank]
            confusion[(label.klass.value, predicted(transitions))] += 1
            slow = [i for i in transitions if i.kind is IncidentKind.SLOW]
            if label.klass is RankClass.PERSISTENT and slow:
                assert label.onset_step is not None
                latencies.append(slow[0].step - label.onset_step)
            if label.cause in ("compute", "data") and slow:
                causes[(label.cause, slow[-1].cause.value)] += 1
    print_matrix(f"{world} ranks, seeds {list(seeds)}", confusion)
    print(f"  persistent detection latency (steps after onset, W={W}): max {max(latencies)}")
    print(f"  cause (truth, predicted): {dict(causes)}")
    for c, (precision, recall, _) in score(confusion).items():
        assert precision >= 0.95 and recall >= 0.95, (c, precision, recall)
    assert latencies and max(latencies) <= 2 * W
    assert all(t == p for (t, p) in causes.elements())


def test_healthy_job_stays_quiet_for_ten_thousand_steps() -> None:
    """16 ranks x 10,000 steps, CV 10-20%, 1% single-step spikes, sub-window blips."""
    trace = generate(healthy(16, 10_000, seed=11, blip_prob=1.0))
    by_rank = replay(trace)
    assert [i for incidents in by_rank.values() for i in incidents] == []


def test_trace_generator_is_deterministic_and_labelled() -> None:
    a, b = generate(mixed(32, seed=5)), generate(mixed(32, seed=5))
    assert a.labels == b.labels and a.events == b.events
    assert a.labels != generate(mixed(32, seed=6)).labels
    counts = Counter(label.klass for label in a.labels)
    assert all(counts[c] == 2 for c in RankClass if c is not RankClass.HEALTHY)
    dead = [label for label in a.labels if label.klass is RankClass.DEAD]
    for label in dead:
        steps = [e.step for _, e in a.events if e.rank == label.rank]
        assert max(steps) == (label.onset_step or 0) - 1
    times = [t for t, _ in a.events]
    assert times == sorted(times)


# ---------------------------------------------------------------- the scenarios (#42)


def truth_predicted(scenario: Scenario, by_rank: dict[int, list[Incident]]) -> list[Truth]:
    """Per rank: host when its incidents name its host's ranks, slow when it had a SLOW
    incident, else healthy."""
    return [
        Truth.HOST
        if any(i.host_ranks for i in by_rank[rank])
        else Truth.SLOW
        if any(i.kind is IncidentKind.SLOW for i in by_rank[rank])
        else Truth.HEALTHY
        for rank in range(scenario.spec.world)
    ]


def test_precision_and_recall_per_class_on_the_scenarios() -> None:
    """2-rank jobs, half the job slow, a whole host slow (8 and 16 ranks), a fixed
    per-step cost with a healthy rank's batch halved (and that rank slow, or not)."""
    scenarios = [
        *(two_ranks(seed) for seed in range(6)),
        *(half_job(8, seed) for seed in range(4)),
        *(whole_host(8, 4, seed) for seed in range(4)),
        *(whole_host(16, 4, seed, factor=1.5) for seed in range(2)),
        *(fixed_cost(4, seed, slow=seed % 2 == 1) for seed in range(6)),
    ]
    confusion: Counter[tuple[str, str]] = Counter()
    for scenario in scenarios:
        found = truth_predicted(scenario, replay(scenario.trace()))
        confusion.update((t.value, p.value) for t, p in zip(scenario.truths, found, strict=True))
    print(f"\n(truth, predicted): {dict(confusion)}")
    scores = score(confusion, [c.value for c in Truth])
    assert set(scores) == {c.value for c in Truth}
    for klass, (precision, recall, _) in scores.items():
        assert precision >= 0.95 and recall >= 0.95, (klass, precision, recall)
