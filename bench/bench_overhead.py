"""The flow's overhead against a bare Temporal workflow, side by side in one run.

    .venv/bin/python bench/bench_overhead.py [--latency-runs 30] [--batch 100] [--rounds 2]

Four kinds of workflow, each on its own task queue of an in-process worker
with the same options as worker.py (``max_cached_workflows=0``), on one dev
server (in memory), one provider process, the offline model:

- ``bare3``: three no-op activities in sequence (defined here, unsandboxed);
- ``bare4``: four no-op activities: the flow also runs a 4th activity
  (``remember_exchange``), so this is the like-for-like baseline;
- ``flow``: AgentFlow as shipped (input checks, keys, heartbeating activity
  wrapper, offline model, two provider HTTP calls, memory in a SQLite file);
- ``flow-nomem``: the same with ``MEMORY_DB=off`` (the 4th activity still
  runs, it just does nothing).

Latency: runs one at a time, kinds interleaved run by run; start to result,
median and p90. Throughput: a batch of ``--batch`` runs started at once per
kind, kinds interleaved round by round; runs per second from the first start
to the last result. Ratios are against ``bare3`` and ``bare4``. Goal: flow
latency within 1.15x, throughput at least 0.85x.

Then where a step's time goes, from the history event timestamps (server
clock) of the latency runs: activity schedule-to-start, start-to-close,
the gap from ActivityTaskCompleted to the next WorkflowTaskScheduled, the
workflow task's schedule-to-start, and its start-to-complete. Not a test: it
reports, it does not assert.
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
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio import activity, workflow  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner  # noqa: E402

from activities import FlowActivities  # noqa: E402
from lab.processes import DevServer, start_provider  # noqa: E402
from starter import start_run  # noqa: E402
from steps.deps import deps_from_env  # noqa: E402
from workflows.agent_flow import AgentFlow  # noqa: E402

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
from worker import TUNED_OPTIONS as WORKER_OPTIONS  # noqa: E402  (the same options as worker.py)


@activity.defn(name="noop")
async def noop(i: int) -> int:
    return i


@workflow.defn(name="BareN", sandboxed=False)
class BareN:
    @workflow.run
    async def run(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += await workflow.execute_activity("noop", i, start_to_close_timeout=timedelta(seconds=10))
        return total


class Kind:
    def __init__(self, name: str, client: Client, queue: str, start) -> None:
        self.name, self.client, self.queue, self._start = name, client, queue, start
        self.latency: list[float] = []
        self.throughput: list[float] = []
        self.run_ids: list[str] = []

    async def one(self) -> str:
        run_id = f"{self.name}-{uuid.uuid4().hex[:10]}"
        await self._start(run_id)
        await self.client.get_workflow_handle(run_id).result()
        return run_id


async def main_async(args) -> dict[str, Kind]:
    tmp = tempfile.TemporaryDirectory(prefix="bench-overhead-")
    server = DevServer().start()
    provider, url = start_provider(Path(tmp.name) / "provider.db")
    try:
        client = await Client.connect(server.address)
        kinds: dict[str, Kind] = {}
        workers = []

        def bare(n: int):
            async def start(run_id: str) -> None:
                await client.start_workflow("BareN", n, id=run_id, task_queue=f"q-bare{n}")
            return start

        def flow(queue: str):
            async def start(run_id: str) -> None:
                await start_run(client, run_id, TASK, EMAIL, queue=queue)
            return start

        for n in (3, 4):
            workers.append(Worker(client, task_queue=f"q-bare{n}", workflows=[BareN], activities=[noop],
                                  **WORKER_OPTIONS))
            kinds[f"bare{n}"] = Kind(f"bare{n}", client, f"q-bare{n}", bare(n))
        deps = {}
        variants = (
            ("flow", str(Path(tmp.name) / "memory.db"), {}),
            ("flow-nomem", "off", {}),
            # The same flow outside the workflow sandbox: how much of the cost is the sandbox.
            ("flow-unsandboxed", str(Path(tmp.name) / "memory-u.db"), {"workflow_runner": UnsandboxedWorkflowRunner()}),
            # The SDK's default sandbox, which re-imports modules for every workflow instance.
            ("flow-fullsandbox", str(Path(tmp.name) / "memory-p.db"), {"workflow_runner": SandboxedWorkflowRunner()}),
        )
        for name, memory, extra in variants:
            deps[name] = deps_from_env({"PROVIDER_URL": url, "MEMORY_DB": memory})
            acts = FlowActivities(deps[name])
            workers.append(Worker(client, task_queue=f"q-{name}", workflows=[AgentFlow], activities=acts.all(),
                                  **{**WORKER_OPTIONS, **extra}))
            kinds[name] = Kind(name, client, f"q-{name}", flow(f"q-{name}"))
        for w in workers:
            await w.__aenter__()
        try:
            # Warm-up: imports, connections, the sandbox's first workflow.
            for kind in kinds.values():
                await kind.one()
            for i in range(args.latency_runs):
                for kind in kinds.values():
                    t = time.perf_counter()
                    kind.run_ids.append(await kind.one())
                    kind.latency.append(time.perf_counter() - t)
            for r in range(args.rounds):
                for kind in kinds.values():
                    t = time.perf_counter()
                    await asyncio.gather(*(kind.one() for _ in range(args.batch)))
                    kind.throughput.append(args.batch / (time.perf_counter() - t))
                    print(f"  round {r + 1} {kind.name:<11} {kind.throughput[-1]:6.1f} runs/s", flush=True)
            breakdown = {name: await step_breakdown(client, kind.run_ids) for name, kind in kinds.items()}
        finally:
            for w in workers:
                await w.__aexit__(None, None, None)
            for d in deps.values():
                await d.provider.aclose()
    finally:
        provider.stop()
        server.stop()
        tmp.cleanup()
    return kinds, breakdown


async def step_breakdown(client: Client, run_ids: list[str]) -> dict[str, float]:
    """Median milliseconds of each segment of an activity step, from history timestamps."""
    seg: dict[str, list[float]] = defaultdict(list)
    E = EventType
    for run_id in run_ids:
        history = await client.get_workflow_handle(run_id).fetch_history()
        t = {}
        last_completed = None
        for ev in history.events:
            ts = ev.event_time.ToMicroseconds() / 1000.0
            et = ev.event_type
            if et == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                t[ev.event_id] = ts
            elif et == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                a = ev.activity_task_started_event_attributes
                seg["activity scheduled -> started"].append(ts - t[a.scheduled_event_id])
                t[("started", a.scheduled_event_id)] = ts
            elif et == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                a = ev.activity_task_completed_event_attributes
                seg["activity started -> completed"].append(ts - t[("started", a.scheduled_event_id)])
                last_completed = ts
            elif et == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                t["wft_scheduled"] = ts
                if last_completed is not None:
                    seg["activity completed -> wf task scheduled"].append(ts - last_completed)
                    last_completed = None
            elif et == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                seg["wf task scheduled -> started"].append(ts - t["wft_scheduled"])
                t["wft_started"] = ts
            elif et == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                seg["wf task started -> completed"].append(ts - t["wft_started"])
        first, last = history.events[0], history.events[-1]
        seg["whole run (first to last event)"].append(
            (last.event_time.ToMicroseconds() - first.event_time.ToMicroseconds()) / 1000.0)
    return {k: statistics.median(v) for k, v in seg.items()}


def p90(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.9 * len(values)))]


def report(kinds: dict[str, Kind], breakdown: dict, args) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"dev server in memory; in-process workers, max_cached_workflows=0; offline model; "
          f"{args.latency_runs} latency runs per kind, {args.rounds} x {args.batch} runs for throughput\n")
    print(f"{'kind':<11} {'latency med':>11} {'p90':>8} {'vs bare3':>8} {'vs bare4':>8}   "
          f"{'throughput':>11} {'vs bare3':>8} {'vs bare4':>8}")
    lat = {k: statistics.median(v.latency) for k, v in kinds.items()}
    thr = {k: statistics.median(v.throughput) for k, v in kinds.items()}
    for name, kind in kinds.items():
        print(f"{name:<11} {lat[name] * 1000:>9.1f}ms {p90(kind.latency) * 1000:>6.1f}ms "
              f"{lat[name] / lat['bare3']:>7.2f}x {lat[name] / lat['bare4']:>7.2f}x   "
              f"{thr[name]:>7.1f}/s {thr[name] / thr['bare3']:>7.2f}x {thr[name] / thr['bare4']:>7.2f}x")
    print("\nwhere the time goes (median ms per segment, history event timestamps, latency runs):")
    names = list(breakdown["bare3"])
    print(f"  {'segment':<40}" + "".join(f"{k:>12}" for k in kinds))
    for seg in names:
        print(f"  {seg:<40}" + "".join(f"{breakdown[k].get(seg, float('nan')):>12.1f}" for k in kinds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    kinds, breakdown = asyncio.run(main_async(args))
    report(kinds, breakdown, args)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
