"""1,000 runs of the flow through one worker process, then through two.

    .venv/bin/python bench/bench_scale.py [--runs 1000] [--workers 1,2] [--server lab|stock]

Real processes as in production: the dev server (in memory), the provider,
and ``worker.py`` processes (offline model, memory in a temp SQLite file). All
runs are offered at once but at most ``--in-flight`` (default 50) are open at
a time: a burst of 1,000 open runs on 2 cores makes workflow tasks wait in the
queue for 20 s and more, and then exceed the starter's 2 s workflow task
timeout while being processed, so they time out and are retried: the runs
crawl (measured: 0 of 1,000 completed after 2 minutes). The figure is the
time from the first start to the last result, and runs per second.

Memory: every worker's resident set (VmRSS from /proc/<pid>/status) is
sampled every 0.2 s for the peak, and read as the completed count crosses each
quarter of the runs, to show whether it grows with the number of runs (a leak
or an unbounded cache would) or stays flat. Not a test: it reports, it does
not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from durable_agents.flowclient.connect import connect  # noqa: E402
from durable_agents.flowclient.runs import start_run  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc, start_worker  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Sampler(threading.Thread):
    def __init__(self, procs: list[Proc]) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.peak = {p.pid: 0.0 for p in procs}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            for p in self.procs:
                self.peak[p.pid] = max(self.peak[p.pid], rss_mb(p.pid))


async def scenario(server: DevServer, provider_url: str, tmp: Path, n_workers: int, runs: int,
                   in_flight: int) -> dict:
    queue = f"scale-{n_workers}-{uuid.uuid4().hex[:6]}"
    env = {"MEMORY_DB": str(tmp / f"memory-{queue}.db")}
    workers = [start_worker(server.address, provider_url, queue, env, name=f"worker{i + 1}")
               for i in range(n_workers)]
    sampler = Sampler(workers)
    sampler.start()
    at_start = {w.pid: rss_mb(w.pid) for w in workers}
    milestones = {runs * q // 4: None for q in (1, 2, 3, 4)}
    client = await connect({**os.environ, "TEMPORAL_ADDRESS": server.address})
    done = 0
    gate = asyncio.Semaphore(in_flight)
    failed = []

    async def one(i: int) -> None:
        nonlocal done
        run_id = f"{queue}-{i:05d}"
        async with gate:
            await start_run(client, run_id, f"Confirm the refund for order {i}", "ada@example.com", queue=queue)
            result = await client.get_workflow_handle(run_id).result()
        if result["status"] != "completed":
            failed.append(run_id)
        done += 1
        if done in milestones:
            milestones[done] = ({w.pid: rss_mb(w.pid) for w in workers}, time.perf_counter() - t0)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(runs)))
        elapsed = time.perf_counter() - t0
    finally:
        sampler.halt.set()
        sampler.join()
        for w in workers:
            w.stop()
    return {"workers": workers, "elapsed": elapsed, "milestones": milestones, "peak": sampler.peak,
            "at_start": at_start, "failed": failed, "runs": runs, "in_flight": in_flight}


async def main_async(runs: int, counts: list[int], in_flight: int, server_config: str) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG if server_config == "lab" else None).start()
        provider = start_provider(Path(tmp) / "provider.db")
        url = provider.url
        try:
            for n in counts:
                print(f"  {runs} runs through {n} worker(s) ...", flush=True)
                results.append(await scenario(server, url, Path(tmp), n, runs, in_flight))
        finally:
            provider.stop()
            server.stop()
    return results


def report(results: list[dict], server_config: str) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"dev server in memory ({server_config} configuration), provider and workers as separate processes, "
          f"offline model, memory on, at most {results[0]['in_flight']} runs open at a time\n")
    for r in results:
        n = len(r["workers"])
        print(f"{r['runs']} runs, {n} worker(s): {r['elapsed']:.1f} s, {r['runs'] / r['elapsed']:.1f} runs/s"
              + (f", {len(r['failed'])} not completed" if r["failed"] else ", all completed"))
        marks = sorted(r["milestones"])
        print(f"  {'worker':<8} {'ready':>8}" + "".join(f"{f'@{m}':>9}" for m in marks) + f"{'peak':>9}   (VmRSS, MB)")
        for i, w in enumerate(r["workers"]):
            row = [r["milestones"][m][0][w.pid] if r["milestones"][m] else float("nan") for m in marks]
            print(f"  {f'#{i + 1}':<8} {r['at_start'][w.pid]:>8.1f}" + "".join(f"{v:>9.1f}" for v in row)
                  + f"{r['peak'][w.pid]:>9.1f}")
        reached = [(m, r["milestones"][m][1]) for m in marks if r["milestones"][m]]
        print("  completed at: " + ", ".join(f"{m} after {t:.1f} s" for m, t in reached))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", default="1,2", help="worker counts to try, in order")
    parser.add_argument("--in-flight", type=int, default=50, help="most runs open at once (default 50)")
    parser.add_argument("--server", choices=("lab", "stock"), default="lab",
                        help="the dev server's dynamic config: the lab's (default) or Temporal's defaults")
    args = parser.parse_args()
    counts = [int(c) for c in args.workers.split(",") if c]
    results = asyncio.run(main_async(args.runs, counts, args.in_flight, args.server))
    report(results, args.server)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
