"""Where a bare workflow step's time goes on the dev server, and what the transfer-queue poll limit does to it.

    .venv/bin/python bench/bench_step_time.py [--runs 30] [--steps 3] [--json]

Two dev servers (in memory), one after the other: ``stock`` (no dynamic
config) and ``lab`` (``LAB_SERVER_CONFIG``, which raises
``history.transferProcessorMaxPollRPS`` from 20 to 1,000). On each, an
in-process worker with worker.py's options (``max_cached_workflows=0``) runs
a bare workflow of ``--steps`` sequential no-op activities (``BareN`` of
bench/bare_flows.py; 3 by default, the flow's shape): one warm-up run,
then ``--runs`` runs back to back.

Per run: wall time from start to result divided by the steps; the deltas of
three server histograms for the run's workflow tasks, scraped from the
server's Prometheus endpoint before and after it (``task_latency_load``: from
the task's creation until the history service read it from its transfer
queue, the read the poll limiter holds back; ``task_latency_queue``: from its
creation until history had handed it to matching; ``task_schedule_to_start_latency``
for RecordWorkflowTaskStarted: until a worker's poll took it); and, from the
run's history event timestamps, the median workflow task scheduled ->
started, workflow task started -> completed, and activity started -> completed.

The activities are dispatched eagerly (in the reply to the workflow task), so
a step costs one transfer-queue read: the default 20 reads/s caps a bare step
at ~50 ms, and the load wait is what a step would otherwise fall short of
that. The limiter starts with a burst of ~20 reads, so on an idle server the
first steps are fast; the slower the worker, the longer the burst lasts:
hence the first-run and last-run columns. Not a test: it reports, it does not
assert.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bare_flows import BareN, noop  # noqa: E402
from history_segments import step_breakdown  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from durable_agents.flowclient.worker_options import NO_CACHE_OPTIONS as TUNED_OPTIONS  # noqa: E402  (worker.py --cache 0, as its figures were taken)
from lab.processes import LAB_SERVER_CONFIG, DevServer  # noqa: E402

# Histogram name and the labels that pick out the runs' workflow tasks. The
# namespace keeps out the server's own system workflows in temporal_system.
METRICS: dict[str, tuple[str, dict[str, str]]] = {
    "load": ("task_latency_load", {"task_type": "TransferActiveTaskWorkflowTask", "namespace": "default"}),
    "queue": ("task_latency_queue", {"task_type": "TransferActiveTaskWorkflowTask", "namespace": "default"}),
    "schedule_to_start": ("task_schedule_to_start_latency",
                          {"operation": "RecordWorkflowTaskStarted", "task_type": "Workflow", "namespace": "default"}),
}
SERIES = re.compile(r"^(\w+?)_(sum|count)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Run:
    step_ms: float
    metrics_ms: dict[str, float]  # mean per workflow task over the run, by METRICS key
    wf_tasks: int  # workflow tasks the load histogram counted: a check that the filter caught the run
    history_ms: dict[str, float]  # median per segment, from event timestamps


@dataclass
class ServerResult:
    name: str
    runs: list[Run] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        def med(get) -> float:
            return statistics.median(get(r) for r in self.runs)
        out = {"step_ms_median": med(lambda r: r.step_ms),
               "step_ms_first": self.runs[0].step_ms, "step_ms_last": self.runs[-1].step_ms}
        for key in METRICS:
            out[f"{key}_ms"] = med(lambda r, key=key: r.metrics_ms[key])
        for key in self.runs[0].history_ms:
            out[f"history_{key}_ms"] = med(lambda r, key=key: r.history_ms[key])
        return out


def scrape(url: str) -> dict[str, tuple[float, float]]:
    """(sum in seconds, count) of each METRICS histogram, over the series its labels select."""
    wanted = {name: (key, labels) for key, (name, labels) in METRICS.items()}
    totals = {key: [0.0, 0.0] for key in METRICS}
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        m = SERIES.match(line)
        if not m or m.group(1) not in wanted:
            continue
        key, labels = wanted[m.group(1)]
        have = dict(LABEL.findall(m.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            totals[key][m.group(2) == "count"] += float(m.group(4))
    return {key: (s, c) for key, (s, c) in totals.items()}


# The segments of history_segments.step_breakdown this bench reports, by their short key.
HISTORY_SEGMENTS = {
    "wft_scheduled_to_started": "wf task scheduled -> started",
    "wft_started_to_completed": "wf task started -> completed",
    "activity_started_to_completed": "activity started -> completed",
}


async def history_medians(client: Client, run_id: str) -> dict[str, float]:
    segments = await step_breakdown(client, [run_id])
    return {short: segments[name] for short, name in HISTORY_SEGMENTS.items()}


async def bench_server(name: str, dynamic_config: dict[str, str], args: argparse.Namespace) -> ServerResult:
    result = ServerResult(name)
    server = DevServer(dynamic_config=dynamic_config).start()
    try:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        client = await Client.connect(server.address)
        queue = f"step-time-{name}"

        async def one(steps: int) -> str:
            run_id = f"{name}-{uuid.uuid4().hex[:10]}"
            await client.execute_workflow(BareN.run, steps, id=run_id, task_queue=queue)
            return run_id

        async with Worker(client, task_queue=queue, workflows=[BareN], activities=[noop],
                          **TUNED_OPTIONS):
            await one(args.steps)  # warm-up: connections, pollers, first-run code paths
            measured: list[tuple[str, float, dict, dict]] = []
            for _ in range(args.runs):
                before = scrape(url)
                t = time.perf_counter()
                run_id = await one(args.steps)
                wall = time.perf_counter() - t
                measured.append((run_id, wall, before, scrape(url)))
        # Histories only after the runs: fetching them between runs would be idle
        # time in which the limiter refills, and would hide the steady state.
        for run_id, wall, before, after in measured:
            ms: dict[str, float] = {}
            for key in METRICS:
                d_sum, d_count = after[key][0] - before[key][0], after[key][1] - before[key][1]
                ms[key] = d_sum / d_count * 1000 if d_count else float("nan")
            result.runs.append(Run(step_ms=wall / args.steps * 1000, metrics_ms=ms,
                                   wf_tasks=int(after["load"][1] - before["load"][1]),
                                   history_ms=await history_medians(client, run_id)))
    finally:
        server.stop()
    return result


COLUMNS = [  # (summary key, header)
    ("step_ms_median", "step med"), ("step_ms_first", "1st run"), ("step_ms_last", "last run"),
    ("load_ms", "load/WFT"), ("queue_ms", "queue/WFT"), ("schedule_to_start_ms", "sched->start"),
    ("history_wft_scheduled_to_started_ms", "hist WFT s->s"),
    ("history_wft_started_to_completed_ms", "hist WFT s->c"),
    ("history_activity_started_to_completed_ms", "hist act"),
]


def report(results: list[ServerResult], args: argparse.Namespace) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"dev server in memory; in-process worker, max_cached_workflows=0; "
          f"{args.runs} runs x {args.steps} no-op activity steps per server after 1 warm-up run; "
          f"all values ms (server metrics: mean per workflow task; history: median)\n")
    print(f"{'server':<7}" + "".join(f"{h:>14}" for _, h in COLUMNS))
    summaries = {r.name: r.summary() for r in results}
    for name, s in summaries.items():
        print(f"{name:<7}" + "".join(f"{s[k]:>14.1f}" for k, _ in COLUMNS))
    stock, lab = summaries["stock"], summaries["lab"]
    print(f"\nstock/lab: per-step wall {stock['step_ms_median'] / lab['step_ms_median']:.2f}x, "
          f"load latency {stock['load_ms'] / lab['load_ms']:.1f}x")
    print("\nper run: step ms (load ms per WFT, WFTs counted)")
    for r in results:
        print(f"  {r.name:<6} " + "  ".join(f"{run.step_ms:.1f} ({run.metrics_ms['load']:.1f}, {run.wf_tasks})"
                                           for run in r.runs))


async def main_async(args: argparse.Namespace) -> list[ServerResult]:
    # One server at a time, so neither competes with the other for the CPU.
    return [await bench_server("stock", {}, args), await bench_server("lab", LAB_SERVER_CONFIG, args)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a report")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.json:
        summaries = {r.name: r.summary() for r in results}
        print(json.dumps({
            "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "runs": args.runs, "steps": args.steps,
            "servers": {r.name: {"summary": summaries[r.name], "runs": [asdict(run) for run in r.runs]}
                        for r in results},
            "stock_over_lab": {
                "step_ms": summaries["stock"]["step_ms_median"] / summaries["lab"]["step_ms_median"],
                "load_ms": summaries["stock"]["load_ms"] / summaries["lab"]["load_ms"],
            },
        }, indent=2))
    else:
        report(results, args)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
