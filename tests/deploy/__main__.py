"""`make deploy-test`: deploy/compose.yaml started with podman from the images built here,
a real 4-rank gloo job trained from the host against it (rank 3 slowed by real work in
its CPU budget, policy lb-bsp), then a second one during which a controller replica and
a NATS node are killed. Checked: the plan changed, every sample was trained exactly
once, the incident's trace reached the OTLP receiver, every replica serves /metrics and
Prometheus scrapes them all. Everything is torn down, also on failure or SIGTERM; exit
status 0 only when every check held."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from antdt.agent.samplelog import exactly_once_problems, read_sample_logs
from antdt.demo.stats import RunStats, summarize
from antdt.demo.watch import JobWatcher
from antdt.runtime.cpubudget import BudgetsUnavailable, RankBudgets
from antdt.schemas import ActionResult
from tests.deploy.compose import SERVICES, Project, podman, prepare, tear_down, wait_healthy

WORLD, DATASET, SHARD, BATCH, EPOCHS, ONSET, FACTOR = 4, 16384, 128, 512, 3, 20, 3
STRAGGLER, KILL_AT = WORLD - 1, 10
#: A job runs 30-150 s here; past this it is taken for hung.
JOB_DEADLINE_S = 600.0


def main() -> int:
    compose = [os.environ.get("PODMAN_COMPOSE", "podman-compose")]
    work = Path(tempfile.mkdtemp(prefix="antdt-deploy-"))
    stamp = time.strftime("%H%M%S")
    jobs = (f"straggler-{stamp}", f"faults-{stamp}")
    project = prepare(work / "deploy", "antdt-deploytest", compose, jobs)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the teardown still runs
    tear_down(project)  # what a run killed with -9 left
    try:
        project.run("up", "-d", *SERVICES)
        wait_healthy(project)
        print(f"deployment healthy after {time.monotonic() - started:.0f}s")
        stats = straggler_job(project, jobs[0], work / jobs[0])
        check_trace(project, stats)
        check_metrics(project)
        faults_job(project, jobs[1], work / jobs[1])
    except Exception as exc:
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        left = tear_down(project)
        print(f"torn down ({'nothing left' if not left else f'LEFT: {left}'})")
        shutil.rmtree(work, ignore_errors=True)
    if left:
        return 1
    print(f"deploy-test passed in {time.monotonic() - started:.0f}s")
    return 0


def job_env(project: Project, job: str, out: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **project.agent_env(job),
        "ANTDT_JOB": job,
        "ANTDT_POLICY": "lb-bsp",
        "ANTDT_DATASET_SIZE": str(DATASET),
        "ANTDT_SHARD_SIZE": str(SHARD),
        "ANTDT_GLOBAL_BATCH": str(BATCH),
        "ANTDT_EPOCHS": str(EPOCHS),
        "ANTDT_SEED": "7",
        "ANTDT_SAMPLE_LOG": str(out / "samples"),
        "ANTDT_DEMO_OUT": str(out),
        "ANTDT_TELEMETRY__LOG_FORMAT": "json",
        "ANTDT_TELEMETRY__LOG_LEVEL": "warning",
        **extra,
    }


def train(
    env: dict[str, str],
    out: Path,
    at_step: dict[int, Callable[[], object]],
    budgets: RankBudgets | None = None,
) -> tuple[int, float]:
    """Launch the job, in `budgets` where given; call at_step[n]() once `n` steps are
    done. Its exit code and wall time."""
    from antdt.agent.launch import launch

    out.mkdir(parents=True)
    rc: list[int] = []
    command = [sys.executable, "-m", "antdt.demo.train"]
    if budgets is not None:
        command = budgets.command(command)
    runner = threading.Thread(target=lambda: rc.append(launch(WORLD, command, env=env)))
    began = time.monotonic()
    runner.start()
    progress = out / "progress.jsonl"
    while runner.is_alive():
        runner.join(0.1)
        steps = len(progress.read_text().splitlines()) if progress.exists() else 0
        for n in [n for n in at_step if steps >= n]:
            at_step.pop(n)()
        if time.monotonic() - began > JOB_DEADLINE_S:
            stop_hung(env["ANTDT_JOB"], steps)
            runner.join(60)
            raise AssertionError(f"job {env['ANTDT_JOB']} hung at step {steps}: stacks above")
    return (rc[0] if rc else -1), time.monotonic() - began


def stop_hung(job: str, steps: int) -> None:
    """Make every rank of `job` write its threads' stacks (the agent's stack_dump_signal),
    then kill them: a hang fails in minutes with where each rank waited, not after
    gloo's 30-minute timeout."""
    ranks = [pid for pid, environ in processes() if f"ANTDT_JOB={job}" in environ]
    print(f"job {job}: no end after {JOB_DEADLINE_S:.0f}s at step {steps}; stacks of {ranks}:")
    for sig in (signal.SIGUSR1, signal.SIGKILL):
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(3)


def processes() -> list[tuple[int, list[str]]]:
    """(pid, environment) of every process of this user that can be read."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                environ = (entry / "environ").read_bytes().decode(errors="replace")
                found.append((int(entry.name), environ.split("\0")))
    return found


def audit(out: Path) -> int:
    lines = read_sample_logs(out / "samples", WORLD)
    problems = exactly_once_problems(lines, DATASET, EPOCHS)
    if problems:
        raise AssertionError(f"not exactly once: {problems[:5]}")
    return sum(len(ln.get("ids", ())) for ln in lines)


def straggler_job(project: Project, job: str, out: Path) -> RunStats:
    watcher = JobWatcher(project.nats_as("observer"), job, incidents=False).start()
    try:
        budgets: RankBudgets | None = RankBudgets(job, WORLD, 0.4, FACTOR - 1)
        injection = f"busy loops in rank {STRAGGLER}'s CPU budget"
        extra: dict[str, str] = {}
    except BudgetsUnavailable as exc:
        budgets, injection = None, "a sleep"
        print(f"no CPU budgets ({exc}): rank {STRAGGLER} sleeps instead")
        extra = {"ANTDT_INJECT": f"rank={STRAGGLER},factor={FACTOR},from={ONSET}"}
    hooks: dict[int, Callable[[], object]] = {}
    if budgets is not None:
        hooks = {ONSET: lambda: budgets.slow({STRAGGLER})}
    try:
        rc, wall = train(job_env(project, job, out, **extra), out, hooks, budgets)
    finally:
        if budgets is not None:
            budgets.close()
        time.sleep(2)  # the last health report and actions
        watcher.stop()
    if rc != 0:
        raise AssertionError(f"job {job} exited {rc}")
    trained = audit(out)
    applied = [a for a in watcher.actions if a.result == ActionResult.APPLIED]
    plans = {tuple(a.local_batch or ()) for a in applied}
    if not any(p and p[STRAGGLER] < min(p[:STRAGGLER]) for p in plans):
        raise AssertionError(f"the plan never relieved rank {STRAGGLER}: {watcher.actions}")
    stats = summarize(
        policy="lb-bsp",
        job=job,
        progress=[json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()],
        result=json.loads((out / "result.json").read_text()),
        health=watcher.health,
        actions=watcher.actions,
        onset=ONSET,
        wall_s=wall,
        injection=injection,
    )
    print(f"job {job}: {stats.steps} steps in {wall:.0f}s, {trained} samples trained, each once")
    print(f"  rank {STRAGGLER} slowed by {injection} from step {ONSET}")
    print(
        f"  samples/s before onset {stats.pre_onset_samples_per_s:,.0f}, after "
        f"{stats.after_onset_samples_per_s:,.0f} (share kept {stats.kept_share:.2f})"
    )
    print(f"  efficiency before {stats.efficiency_pre:.2f}, after {stats.efficiency_after:.2f}")
    print(f"  plans applied: {[list(a.local_batch or ()) for a in applied]}")
    print(f"  test accuracy {stats.accuracy:.3f}")
    stats.actions = [a.model_dump(mode="json") for a in applied]
    return stats


def check_trace(project: Project, stats: RunStats, timeout: float = 30) -> None:
    """The first applied action's incident: its root span ("incident opened", from the
    monitor) and the controller's decision in the same trace, at the receiver."""
    incident = next(a["incident_id"] for a in stats.actions if a.get("incident_id"))
    deadline = time.monotonic() + timeout
    while True:
        text = project.spans_file.read_text() if project.spans_file.exists() else ""
        spans = [json.loads(line) for line in text.splitlines()]
        roots = [
            s
            for s in spans
            if s["name"] == "incident opened"
            and s["attributes"].get("antdt.incident.id") == incident
        ]
        trace = [s for s in spans if roots and s["trace_id"] == roots[0]["trace_id"]]
        services = {s["service"] for s in trace}
        if {"antdt-monitor", "antdt-controller"} <= services:
            print(f"incident {incident}: trace of {len(trace)} spans from {sorted(services)}")
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"incident {incident}'s trace incomplete: {services}")
        time.sleep(1)


def check_metrics(project: Project, timeout: float = 90) -> None:
    """Every replica of each service serves Prometheus metrics on its host port, AntDT's
    own from a replica that worked for the job (one may have owned none of it), and
    Prometheus (deploy/prometheus.yml) scrapes every replica."""
    for service in ("monitor", "controller", "shards"):
        bodies = {}
        for name in project.of(service):
            host = podman("port", name, "9464/tcp").split()[0].replace("0.0.0.0", "127.0.0.1")
            with urllib.request.urlopen(f"http://{host}/metrics", timeout=5) as answer:
                bodies[name] = answer.read().decode()
            if "# TYPE " not in bodies[name]:
                raise AssertionError(f"{name}: /metrics serves no metric")
        if not any(re.search(r"^antdt_\w+", body, re.M) for body in bodies.values()):
            raise AssertionError(f"no {service} replica exports an antdt_* metric")
    replicas = sum(len(project.of(s)) for s in ("monitor", "controller", "shards"))
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen("http://127.0.0.1:9090/api/v1/targets", timeout=5) as r:
            targets = json.load(r)["data"]["activeTargets"]
        up = [t for t in targets if t["labels"]["job"] == "antdt" and t["health"] == "up"]
        if len(up) == replicas:
            break
        if time.monotonic() > deadline:
            seen = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
            raise AssertionError(f"Prometheus scrapes {len(up)} of {replicas}: {seen}")
        time.sleep(2)
    print(f"metrics: every replica serves /metrics; Prometheus scrapes all {replicas}")


def faults_job(project: Project, job: str, out: Path) -> None:
    controller, nats = project.of("controller")[0], project.of("nats-2")[0]
    hooks: dict[int, Callable[[], object]] = {
        KILL_AT: lambda: [podman("kill", c) for c in (controller, nats)]
    }
    rc, wall = train(job_env(project, job, out), out, hooks)
    if hooks:
        raise AssertionError(f"job {job} ended before step {KILL_AT}: nothing was killed")
    if rc != 0:
        raise AssertionError(f"job {job} exited {rc} after {controller} and {nats} were killed")
    trained = audit(out)
    print(
        f"job {job}: {controller} and {nats} killed at step {KILL_AT} "
        f"({len(project.of('controller')) - 1} other controller replica, nats-1, nats-3 on); "
        f"finished in {wall:.0f}s, {trained} samples trained, each once"
    )


if __name__ == "__main__":
    sys.exit(main())
