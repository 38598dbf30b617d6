"""The Temporal worker's default, chosen by data: no workflow cache (as
shipped) against a cache with a short sticky schedule-to-start timeout.

    .venv/bin/python bench/bench_worker_cache.py [--sticky-ms 100,200,300,1000] [--batch 50]
                                                 [--rounds 3] [--trials 2] [--no-stock]

Settings: ``nocache`` (``worker.py --cache 0``: ``max_cached_workflows=0``, so no
sticky queue; the default before this bench chose one) and ``stickyN``: a cache of 1,000 and a sticky schedule-to-start
timeout of N ms (``worker.py --cache`` with ``CACHED_STICKY_TIMEOUT`` replaced:
bench/cached_worker.py); every other option is worker.py's.

- **throughput** on the lab's dev server (``LAB_SERVER_CONFIG``: timers fire
  within 100 ms): per setting an in-process worker on its own task queue,
  ``--batch`` runs of the flow started at once, settings interleaved round by
  round; runs per second from the first start to the last result.
- **resume after SIGKILL, from the kill to the run done**: per setting and
  crash point, a worker process armed with CRASH_AT dies, a replacement of
  the same setting is started at once; done = WorkflowExecutionCompleted. On
  the lab's server and (unless ``--no-stock``) on a stock dev server, whose
  timers (the sticky timeout is one) fire up to ~1 s late.

The rule (issue 13): a setting becomes the default if its throughput is at
least 1.5x no-cache's and its resume from the kill within 1.25x of
no-cache's, both from this one invocation. Not a test: it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_resume import POINTS, completed_at  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from durable_agents.activities import FlowActivities  # noqa: E402
from durable_agents.flowclient.connect import connect, exit_now  # noqa: E402
from durable_agents.flowclient.runs import start_run  # noqa: E402
from durable_agents.flowclient.worker_options import NO_CACHE_OPTIONS, worker_options  # noqa: E402
from durable_agents.wiring import deps_from_env  # noqa: E402
from durable_agents.workflows.agent_flow import AgentFlow  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"


def options(setting: str) -> dict:
    if setting == "nocache":
        return dict(NO_CACHE_OPTIONS)
    ms = float(setting.removeprefix("sticky"))
    return {**worker_options(cache=1000), "sticky_queue_schedule_to_start_timeout": timedelta(milliseconds=ms)}


def worker_argv(setting: str) -> list[str]:
    if setting == "nocache":
        return [sys.executable, "worker.py", "--cache", "0"]
    return [sys.executable, "bench/cached_worker.py", "--sticky-ms", setting.removeprefix("sticky")]


def start_worker_proc(server: DevServer, url: str, queue: str, setting: str, env: dict) -> Proc:
    proc = Proc(f"worker-{setting}", worker_argv(setting),
                env={"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default", "TASK_QUEUE": queue,
                     "PROVIDER_URL": url, "PYTHONUNBUFFERED": "1", **env})
    proc.wait_for_line("worker ready", timeout=60)
    return proc


async def resume_one(server: DevServer, url: str, point: str, setting: str, work: Path) -> float:
    queue = f"wc-{uuid.uuid4().hex[:8]}"
    run_id = f"wc-{setting}-{point.replace(':', '-')}-{uuid.uuid4().hex[:6]}"
    client = await connect({**os.environ, "TEMPORAL_ADDRESS": server.address})
    memory = {"MEMORY_DB": str(work / f"{queue}-memory.db")}
    first = start_worker_proc(server, url, queue, setting, {"CRASH_AT": point, **memory})
    try:
        await start_run(client, run_id, TASK, EMAIL, queue=queue)
        deadline = time.monotonic() + 60
        while first.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if first.alive():
            raise RuntimeError(f"worker did not reach {point}")
    finally:
        died = time.time()
        first.kill()
    second = start_worker_proc(server, url, queue, setting, memory)
    try:
        done = await completed_at(client, run_id, time.monotonic() + 120)
    finally:
        second.kill()
    return done - died


async def throughput(server: DevServer, url: str, settings: list[str], batch: int, rounds: int, work: Path) -> dict:
    client = await Client.connect(server.address)
    deps = []
    workers = {}
    for s in settings:
        d = deps_from_env({"PROVIDER_URL": url, "MEMORY_DB": str(work / f"thr-{s}.db")})
        deps.append(d)
        workers[s] = Worker(client, task_queue=f"thr-{s}", workflows=[AgentFlow],
                            activities=FlowActivities(d).all(), **options(s))
    out: dict[str, list[float]] = {s: [] for s in settings}

    async def one(s: str) -> None:
        run_id = f"thr-{s}-{uuid.uuid4().hex[:10]}"
        await start_run(client, run_id, TASK, EMAIL, queue=f"thr-{s}")
        await client.get_workflow_handle(run_id).result()

    for w in workers.values():
        await w.__aenter__()
    try:
        for s in settings:
            await one(s)  # warm-up
        for r in range(rounds):
            for s in settings:
                t = time.perf_counter()
                await asyncio.gather(*(one(s) for _ in range(batch)))
                out[s].append(batch / (time.perf_counter() - t))
                print(f"  throughput round {r + 1} {s:<10} {out[s][-1]:6.1f} runs/s", flush=True)
    finally:
        for w in workers.values():
            await w.__aexit__(None, None, None)
        for d in deps:
            await d.provider.aclose()
    return out


async def main_async(args) -> dict:
    settings = ["nocache"] + [f"sticky{int(ms)}" for ms in args.sticky_ms]
    out: dict = {"settings": settings, "throughput": {}, "resume": {}}
    with tempfile.TemporaryDirectory(prefix="bench-worker-cache-") as tmp:
        work = Path(tmp)
        lab = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        stock = None if args.no_stock else DevServer().start()
        provider = start_provider(work / "provider.db")
        url = provider.url
        try:
            out["throughput"] = await throughput(lab, url, settings, args.batch, args.rounds, work)
            servers = [("lab", lab)] + ([("stock", stock)] if stock else [])
            for trial in range(args.trials):
                for point in args.points:
                    for name, server in servers:
                        for s in settings:
                            seconds = await resume_one(server, url, point, s, work)
                            out["resume"].setdefault((name, s), []).append(seconds)
                            print(f"  resume trial {trial + 1} {name:<5} {point:<32} {s:<10} {seconds:5.2f} s",
                                  flush=True)
        finally:
            provider.stop()
            lab.stop()
            if stock:
                stock.stop()
    return out


def report(out: dict, args) -> None:
    print(f"\nmachine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"throughput: lab dev server, {args.rounds} rounds x {args.batch} runs at once; resume: "
          f"{args.trials} trials x {len(args.points)} crash points, seconds from the SIGKILL to the run done\n")
    thr = {s: statistics.median(v) for s, v in out["throughput"].items()}
    servers = sorted({n for n, _ in out["resume"]}, key=["lab", "stock"].index)
    head = f"  {'setting':<11} {'runs/s':>7} {'x nocache':>10}"
    for n in servers:
        head += f"   {n + ' resume med':>17} {'worst':>6} {'x nocache':>10}"
    print(head)
    verdict = []
    for s in out["settings"]:
        line = f"  {s:<11} {thr[s]:>7.1f} {thr[s] / thr['nocache']:>9.2f}x"
        for n in servers:
            cell = out["resume"][(n, s)]
            base = statistics.median(out["resume"][(n, "nocache")])
            line += f"   {statistics.median(cell):>16.2f}s {max(cell):>5.2f}s {statistics.median(cell) / base:>9.2f}x"
        print(line)
        if s != "nocache":
            ratio_t = thr[s] / thr["nocache"]
            ratio_r = (statistics.median(out["resume"][("lab", s)])
                       / statistics.median(out["resume"][("lab", "nocache")]))
            verdict.append((s, ratio_t >= 1.5 and ratio_r <= 1.25, ratio_t, ratio_r))
    print("\nrule: throughput >= 1.5x no-cache and resume (lab server, median from the kill) <= 1.25x no-cache's")
    for s, ok, rt, rr in verdict:
        print(f"  {s:<11} throughput {rt:.2f}x, resume {rr:.2f}x: {'MEETS the rule' if ok else 'does not meet it'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sticky-ms", default="100,200,300,1000")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--no-stock", action="store_true", help="skip the resumes on a stock dev server")
    args = parser.parse_args()
    args.sticky_ms = [float(v) for v in args.sticky_ms.split(",") if v]
    args.points = [p for p in args.points.split(",") if p]
    out = asyncio.run(main_async(args))
    report(out, args)
    return 0


if __name__ == "__main__":
    exit_now(main())
