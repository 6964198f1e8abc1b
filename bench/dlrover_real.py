"""DLRover's own shard master and clients, the shards bench's same-run baseline (see
dlrover.py). Runs on a Python with DLRover and imports nothing of antdt. One JSON line
each way: started, it says {"ready": true, "master": ADDRESS}; to {"clients": N,
"seconds": S} it answers {"latencies": [s, ...], "master_cpu_s", "client_cpu_s"}; at
the end of stdin it exits."""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and its dlrover.py (the bench's
# side of this baseline) would shadow the dlrover package: drop it before importing more.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

DATASET_SIZE = 10**9
SHARD_SIZE = 10**4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _quiet() -> None:
    """DLRover logs every RPC's set-up at INFO: keep its warnings only."""
    import logging

    logging.disable(logging.INFO)


def _start_master() -> tuple[Any, str]:
    from dlrover.python.master.local_master import LocalJobMaster
    from dlrover.python.scheduler.job import LocalJobArgs

    args = LocalJobArgs("local", "default", "antdt-bench")
    args.initilize()  # sic: DLRover's spelling
    port = _free_port()
    master = LocalJobMaster(port, args)
    master.prepare()
    return master, f"127.0.0.1:{port}"


def _worker(rank: int, master: str, conn: Any) -> None:
    """A rank: on each (dataset, seconds, start_at) it loops report-done + fetch until its
    time is up and sends back its cycle latencies and CPU seconds."""
    os.environ["NODE_ID"] = str(rank)
    _quiet()
    from dlrover.python.elastic_agent.master_client import MasterClient, build_master_client
    from dlrover.python.elastic_agent.sharding.client import ShardingClient

    MasterClient._instance = build_master_client(master, 30)
    conn.send("ready")
    while (command := conn.recv()) != "exit":
        dataset, seconds, start_at = command
        client = ShardingClient(
            dataset_name=dataset,
            batch_size=SHARD_SIZE,
            num_epochs=1,
            dataset_size=DATASET_SIZE,
            num_minibatches_per_shard=1,
        )
        if client.fetch_shard() is None:
            raise RuntimeError(f"rank {rank}: no first shard of {dataset}")
        time.sleep(max(0.0, start_at - time.time()))  # every rank starts together
        latencies: list[float] = []
        cpu = time.process_time()
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            sent = time.perf_counter()
            client.report_batch_done()  # the shard's one batch: report_task_result
            if client.fetch_shard() is None:  # get_task
                raise RuntimeError(f"rank {rank}: {dataset} ran out of shards")
            latencies.append(time.perf_counter() - sent)
        conn.send((latencies, time.process_time() - cpu))


class Workers:
    def __init__(self, master: str, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.conns: list[Any] = []
        self.processes: list[Any] = []
        for rank in range(count):
            here, there = context.Pipe()
            process = context.Process(target=_worker, args=(rank, master, there), daemon=True)
            process.start()
            self.conns.append(here)
            self.processes.append(process)
        for conn in self.conns:
            if not conn.poll(120) or conn.recv() != "ready":
                raise RuntimeError("a DLRover client process did not start")
        self.runs = 0

    def run(self, clients: int, seconds: float) -> dict[str, Any]:
        if not 1 <= clients <= len(self.conns):
            raise ValueError(f"clients must be 1..{len(self.conns)}, not {clients}")
        self.runs += 1
        dataset = f"bench-{self.runs}"
        start_at = time.time() + 1.0  # after every client registered the dataset
        cpu = time.process_time()
        for conn in self.conns[:clients]:
            conn.send((dataset, seconds, start_at))
        answers = [conn.recv() for conn in self.conns[:clients]]
        return {
            "latencies": [x for latencies, _ in answers for x in latencies],
            "master_cpu_s": time.process_time() - cpu,  # this process: the master's threads
            "client_cpu_s": sum(c for _, c in answers),
        }

    def stop(self) -> None:
        for conn in self.conns:
            conn.send("exit")
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def main() -> None:
    workers_count = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 8
    _quiet()
    master, address = _start_master()
    workers = Workers(address, workers_count)
    print(json.dumps({"ready": True, "master": address}), flush=True)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            figures = workers.run(int(command["clients"]), float(command["seconds"]))
            print(json.dumps(figures), flush=True)
    finally:
        workers.stop()
        master.stop()


if __name__ == "__main__":
    main()
