"""The demo's training script: a real data-parallel job that imports only `antdt.agent`:
gloo on CPU, or nccl with one GPU per rank. Run by `antdt launch --nproc 4 -- python -m
antdt.demo.train`.

Settings come from the environment like any AntDT job (ANTDT_JOB, ANTDT_POLICY, ...);
ANTDT_DEMO_OUT names the folder where rank 0 writes per-step progress and the result;
ANTDT_DEMO_DEVICE (auto, cpu, cuda, cuda:N) where the model trains: auto follows the
process group (the rank's GPU under nccl); ANTDT_DEMO_COMPUTE_LOG=1 makes every rank
write its seconds in forward and backward per step there too (`compute-<rank>.jsonl`)."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import antdt.agent as antdt_agent
from antdt.demo.data import augmented_train_set, test_set

WIDTH = int(os.environ.get("ANTDT_DEMO_WIDTH", "1024"))


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(64, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 10),
    )


BASE_LR = 2e-3


def learning_rate(seen: int, total: int, step_samples: int, settings: Any) -> float:
    """Cosine decay over samples seen (not steps), scaled by this step's share of the global
    batch, so that an epoch tail's small steps move the weights less; decaying to zero also
    makes the final model far less sensitive to the sample order."""
    progress = min(1.0, seen / total)
    share = step_samples / settings.global_batch
    return BASE_LR * 0.5 * (1.0 + math.cos(math.pi * progress)) * share


def accuracy(model: torch.nn.Module, device: torch.device) -> float:
    x, y = (t.to(device) for t in test_set())
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores
    antdt_agent.init_process_group()
    agent = antdt_agent.init()
    settings = agent.settings
    device = train_device(settings.local_rank or 0)
    x_train, y_train = (
        t.to(device) for t in augmented_train_set(settings.dataset_size, settings.seed)
    )
    model = build_model(settings.seed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    total_samples = settings.epochs * settings.dataset_size
    out = Path(os.environ.get("ANTDT_DEMO_OUT", "."))
    checkpoints = Checkpoints.from_env(settings.rank, device)
    seen = checkpoints.resume(agent, model, optimizer)
    agent.restartable = checkpoints.path is not None
    fault = Fault.from_env(settings.rank, settings.restart_count, out)
    shrink = Shrink.from_env(settings.rank, settings.world_size)
    mode = "a" if agent.restarted() else "w"  # cached: resume() agreed it
    progress = open(out / "progress.jsonl", mode) if settings.rank == 0 else None  # noqa: SIM115
    compute_log = ComputeLog.from_env(out, settings.rank, mode)
    min_step_s = float(os.environ.get("ANTDT_DEMO_MIN_STEP_S", "0"))
    started = time.perf_counter()
    for epoch in agent.epochs():
        for step in agent.steps():
            compute_log.begin()
            for held, micro in enumerate(step.claims()):  # own, or others' under sharing
                fault.maybe_fail(step.index, holding=held)
                index = torch.tensor(micro.ids, device=device)
                loss = F.cross_entropy(model(x_train[index]), y_train[index])
                (loss * micro.weight).backward()
            compute_log.end(step.index)
            step.sync(model)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(seen, total_samples, step.total_samples, settings)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            seen += step.total_samples
            if progress is not None:
                record = {
                    "step": step.index,
                    "epoch": epoch,
                    "t": time.time(),
                    "samples": step.total_samples,
                    "local_batch": step.local_batch,
                    "plan_version": step.plan_version,
                }
                progress.write(json.dumps(record) + "\n")
                progress.flush()
            if min_step_s:  # stands in for a bigger model (tests, demos)
                time.sleep(max(0.0, min_step_s - (time.perf_counter() - started)))
            started = time.perf_counter()
            checkpoints.maybe_save(agent, step.index, model, optimizer, seen)
            if agent.restart_due(step.index):  # the controller moves a rank off its host
                checkpoints.save(agent, step.index, model, optimizer, seen)
                torch.distributed.barrier()  # nobody leaves before rank 0 has saved
                agent.exit_for_restart()
            fault.maybe_fail(step.index)
            if shrink.at(step.index) and shrink.apply(agent):
                break  # this rank left the job
        if shrink.left:
            break
    agent.close()
    compute_log.close()
    if shrink.left:
        return
    if progress is not None:
        progress.close()
        result = {
            "accuracy": accuracy(model, device),
            "dropped_events": agent.dropped_events,
            "device": str(device),
            "backend": _backend(),
        }
        (out / "result.json").write_text(json.dumps(result))
    antdt_agent.destroy_process_group()


class ComputeLog:
    """A rank's seconds from its step's start to its sync (forward and backward; under
    work sharing with its claims), a line per step: what the work-sharing bench spreads
    over the ranks for its ceiling. The optimizer step and the all-reduce are not in it:
    no sharing of samples moves them off a slowed rank."""

    def __init__(self, file: Any = None) -> None:
        self._file, self._t0 = file, 0.0

    @classmethod
    def from_env(cls, out: Path, rank: int, mode: str) -> ComputeLog:
        if os.environ.get("ANTDT_DEMO_COMPUTE_LOG", "0") != "1":
            return cls()
        return cls(open(out / f"compute-{rank}.jsonl", mode))

    def begin(self) -> None:
        self._t0 = time.perf_counter()

    def end(self, step: int) -> None:
        if self._file is not None:
            seconds = time.perf_counter() - self._t0
            self._file.write(json.dumps({"step": step, "compute_s": seconds}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _backend() -> str | None:
    dist = torch.distributed
    return str(dist.get_backend()) if dist.is_initialized() else None


def train_device(local_rank: int) -> torch.device:
    """ANTDT_DEMO_DEVICE's choice (antdt.agent.model_device), made current if a GPU."""
    requested = os.environ.get("ANTDT_DEMO_DEVICE", "auto")
    device = torch.device(antdt_agent.model_device(requested, _backend(), local_rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


class Checkpoints:
    """Model checkpoints every `every` steps in `folder` (ANTDT_DEMO_CKPT_DIR and
    ANTDT_DEMO_CKPT_EVERY): every rank commits its data positions first (agent.commit
    waits for all), then rank 0 writes the model. A restarted job loads the last one
    and puts the data ledger back to it (agent.restore)."""

    def __init__(
        self, folder: Path | None, every: int, rank: int, device: torch.device | None = None
    ) -> None:
        self.folder, self.every, self.rank = folder, every, rank
        self.device = device or torch.device("cpu")

    @classmethod
    def from_env(cls, rank: int, device: torch.device | None = None) -> Checkpoints:
        folder = os.environ.get("ANTDT_DEMO_CKPT_DIR")
        every = int(os.environ.get("ANTDT_DEMO_CKPT_EVERY", "0"))
        return cls(Path(folder) if folder and every > 0 else None, every, rank, device)

    @property
    def path(self) -> Path | None:
        return self.folder / "model.pt" if self.folder else None

    def resume(self, agent: Any, model: torch.nn.Module, optimizer: Any) -> int:
        """Load the last checkpoint, if any, and restore the ledger to it; returns the
        samples seen so far (for the learning-rate schedule)."""
        state = None
        if self.path is not None and self.path.exists():
            state = torch.load(self.path, map_location=self.device, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        if agent.restarted() or state is not None:
            agent.restore(int(state["step"]) if state is not None else None)
        return int(state["seen"]) if state is not None else 0

    def maybe_save(
        self, agent: Any, step: int, model: torch.nn.Module, optimizer: Any, seen: int
    ) -> None:
        if self.path is not None and (step + 1) % self.every == 0:
            self.save(agent, step, model, optimizer, seen)

    def save(
        self, agent: Any, step: int, model: torch.nn.Module, optimizer: Any, seen: int
    ) -> None:
        if self.path is None:
            return
        agent.commit(step)  # the ledger's snapshot first: a model without one is useless
        if self.rank == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "seen": seen,
            }
            tmp = self.path.with_suffix(".tmp")
            torch.save(state, tmp)
            tmp.replace(self.path)  # atomic: a crash leaves the previous checkpoint


class Fault:
    """A rank failure for tests and demos (ANTDT_DEMO_FAIL="rank=2,step=40,how=kill"):
    the rank dies after that step, in the first run only. how=kill: SIGKILL (no
    clean-up at all); how=exit: the process exits with code 1 mid-epoch. With
    `holding=k` it dies inside the first step from that one on in which it holds its
    (k+1)-th micro-batch's claim (helpers may take all of a step's). The step it dies in
    goes to `fault.json` in the demo's out folder first."""

    def __init__(
        self, step: int | None, how: str, holding: int | None = None, out: Path | None = None
    ) -> None:
        self.step, self.how, self.holding, self.out = step, how, holding, out

    @classmethod
    def from_env(cls, rank: int, restart_count: int, out: Path | None = None) -> Fault:
        spec = dict(
            kv.split("=", 1) for kv in os.environ.get("ANTDT_DEMO_FAIL", "").split(",") if "=" in kv
        )
        if restart_count > 0 or int(spec.get("rank", -1)) != rank:
            return cls(None, "")
        holding = int(spec["holding"]) if "holding" in spec else None
        return cls(int(spec["step"]), spec.get("how", "kill"), holding, out)

    def maybe_fail(self, step: int, holding: int | None = None) -> None:
        if self.step is None or holding != self.holding:
            return
        if step < self.step if holding is not None else step != self.step:
            return
        if self.out is not None:
            (self.out / "fault.json").write_text(json.dumps({"step": step}))
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)


class Shrink:
    """An elastic shrink without rollback (ANTDT_DEMO_LEAVE="step=20"): after that step
    the highest rank leaves (agent.leave hands its shards back from where its model got)
    and the others re-form a smaller process group and train on; its updates so far
    stay in the model. With ",hold=PATH" the leaver hands its shards back only once PATH
    exists (a test holds it until the others have run out of data in the epoch)."""

    #: Seconds a leaver waits for its hold file, at most.
    HOLD_MAX_S = 120.0

    def __init__(self, step: int | None, rank: int, world: int, hold: Path | None = None):
        self.step, self.rank, self.world, self.left = step, rank, world, False
        self.hold = hold

    @classmethod
    def from_env(cls, rank: int, world: int) -> Shrink:
        value = os.environ.get("ANTDT_DEMO_LEAVE", "")
        fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
        step = int(fields["step"]) if "step" in fields else None
        hold = Path(fields["hold"]) if "hold" in fields else None
        return cls(step if world > 1 else None, rank, world, hold)

    def at(self, step: int) -> bool:
        return self.step is not None and step == self.step

    def apply(self, agent: Any) -> bool:
        """True when this process left. Collective: every rank calls it at the step."""
        dist = torch.distributed
        device = antdt_agent.collective_device()
        backend = str(dist.get_backend())
        port = torch.tensor([_free_port() if self.rank == 0 else 0], device=device)
        dist.broadcast(port, 0)  # where the smaller group meets
        antdt_agent.destroy_process_group()
        if self.rank == self.world - 1:
            self._wait_for_hold()
            agent.leave("elastic shrink")
            self.left = True
            return True
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{int(port.item())}",
            rank=self.rank,
            world_size=self.world - 1,
            device_id=device if device.type == "cuda" else None,
        )
        self.step = None
        return False

    def _wait_for_hold(self) -> None:
        deadline = time.monotonic() + self.HOLD_MAX_S
        while self.hold is not None and not self.hold.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.hold} did not appear in {self.HOLD_MAX_S} s")
            time.sleep(0.05)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    main()
