"""The flow's overhead against bare Temporal workflows, side by side in one run.

    .venv/bin/python bench/bench_overhead.py [--latency-runs 30] [--batch 100] [--rounds 2] [--server lab|stock]

Kinds of workflow, each on its own task queue of an in-process worker with
the options of worker.py (``TUNED_OPTIONS``: since issue 13 a workflow cache of
1,000 with a 100 ms sticky timeout, before that no workflow cache; 8
workflow-task slots, the sandbox as shipped: Temporal's default restrictions
plus sqlite3, the workflow module executed per workflow task), one dev server
(in memory; ``--server lab``, the default, is the lab's own configuration,
``LAB_SERVER_CONFIG``; ``stock`` is Temporal's defaults), one provider
process, the offline model:

- ``bare3``: three no-op activities (bench/bare_flows.py): Temporal's floor;
- ``bare-steps``: the same three step functions with the same dependencies,
  each in a plain activity (bench/bare_flows.py): the work without the
  adapter. **The baseline of the goal**: flow against it is the adapter's
  overhead (heartbeats, error mapping, input checks, status, memory write);
- ``flow``: AgentFlow as shipped;
- ``flow-nomem``: the same with ``MEMORY_DB=off``;
- ``flow-passthrough``: every module passed through the sandbox
  (``with_passthrough_all_modules``, what worker.py shipped before): faster,
  and nothing non-deterministic is refused any more: what the refusals cost;
- ``flow-unsandboxed``: ``UnsandboxedWorkflowRunner``: what the sandbox costs;
- ``flow-nocache``: ``worker.py --cache 0`` (no workflow cache, so no sticky
  queue to wait on after a kill; the default before issue 13): what the
  cache buys.

Latency: runs one at a time, kinds interleaved run by run; start to result,
median and p90. Throughput: a batch of ``--batch`` runs started at once per
kind, kinds interleaved round by round; runs per second from the first start
to the last result. Goal: flow latency within 1.15x, throughput at least
0.85x of the bare workflow.

Then where a step's time goes, from the history event timestamps (server
clock) of the latency runs. Not a test: it reports, it does not assert.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bare_flows import BareInput, BareN, BareStepActivities, BareSteps, noop  # noqa: E402
from history_segments import step_breakdown  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import UnsandboxedWorkflowRunner, Worker  # noqa: E402
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions  # noqa: E402

from durable_agents.activities import FlowActivities  # noqa: E402
from durable_agents.flowclient.runs import start_run  # noqa: E402
from durable_agents.flowclient.worker_options import TUNED_OPTIONS as WORKER_OPTIONS  # noqa: E402  (the same options as worker.py)
from durable_agents.flowclient.worker_options import worker_options  # noqa: E402
from durable_agents.wiring import deps_from_env  # noqa: E402
from durable_agents.workflows.agent_flow import AgentFlow  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
BASELINES = ("bare-steps", "bare3")


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


async def main_async(args) -> tuple[dict[str, Kind], dict]:
    tmp = tempfile.TemporaryDirectory(prefix="bench-overhead-")
    server = DevServer(dynamic_config=LAB_SERVER_CONFIG if args.server == "lab" else None).start()
    provider = start_provider(Path(tmp.name) / "provider.db")
    url = provider.url
    deps = {}
    try:
        client = await Client.connect(server.address)
        kinds: dict[str, Kind] = {}
        workers = []

        def add(name: str, start, workflows: list, activities: list, **extra) -> None:
            workers.append(Worker(client, task_queue=f"q-{name}", workflows=workflows, activities=activities,
                                  **{**WORKER_OPTIONS, **extra}))
            kinds[name] = Kind(name, client, f"q-{name}", start)

        def flow_start(queue: str):
            async def start(run_id: str) -> None:
                await start_run(client, run_id, TASK, EMAIL, queue=queue)
            return start

        async def bare3_start(run_id: str) -> None:
            await client.start_workflow(BareN.run, 3, id=run_id, task_queue="q-bare3")

        async def bare_steps_start(run_id: str) -> None:
            await client.start_workflow(BareSteps.run, BareInput(run_id, TASK, EMAIL), id=run_id,
                                        task_queue="q-bare-steps")

        def deps_for(name: str, memory: str | None = None):
            deps[name] = deps_from_env({"PROVIDER_URL": url, "MEMORY_DB": memory or str(Path(tmp.name) / f"{name}.db")})
            return deps[name]

        add("bare3", bare3_start, [BareN], [noop])
        add("bare-steps", bare_steps_start, [BareSteps], BareStepActivities(deps_for("bare-steps")).all())
        variants = (
            ("flow", None, {}),
            ("flow-nomem", "off", {}),
            ("flow-passthrough", None, {"workflow_runner": SandboxedWorkflowRunner(
                restrictions=SandboxRestrictions.default.with_passthrough_all_modules())}),
            ("flow-unsandboxed", None, {"workflow_runner": UnsandboxedWorkflowRunner()}),
            ("flow-nocache", None, worker_options(cache=0)),
        )
        for name, memory, extra in variants:
            add(name, flow_start(f"q-{name}"), [AgentFlow], FlowActivities(deps_for(name, memory)).all(), **extra)
        for w in workers:
            await w.__aenter__()
        try:
            # Warm-up: imports, connections, the sandbox's first workflow.
            for kind in kinds.values():
                await kind.one()
            for _ in range(args.latency_runs):
                for kind in kinds.values():
                    t = time.perf_counter()
                    kind.run_ids.append(await kind.one())
                    kind.latency.append(time.perf_counter() - t)
            for r in range(args.rounds):
                for kind in kinds.values():
                    t = time.perf_counter()
                    await asyncio.gather(*(kind.one() for _ in range(args.batch)))
                    kind.throughput.append(args.batch / (time.perf_counter() - t))
                    print(f"  round {r + 1} {kind.name:<16} {kind.throughput[-1]:6.1f} runs/s", flush=True)
            breakdown = {name: await step_breakdown(client, kind.run_ids) for name, kind in kinds.items()}
        finally:
            for w in workers:
                await w.__aexit__(None, None, None)
    finally:
        for d in deps.values():
            await d.provider.aclose()
        provider.stop()
        server.stop()
        tmp.cleanup()
    return kinds, breakdown


def p90(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.9 * len(values)))]


def report(kinds: dict[str, Kind], breakdown: dict, args) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    server = "lab configuration (LAB_SERVER_CONFIG)" if args.server == "lab" else "stock configuration"
    print(f"dev server in memory, {server}; in-process workers with worker.py's options; offline model; "
          f"{args.latency_runs} latency runs per kind, {args.rounds} x {args.batch} runs for throughput\n")
    lat = {k: statistics.median(v.latency) for k, v in kinds.items()}
    thr = {k: statistics.median(v.throughput) for k, v in kinds.items()}
    print(f"{'kind':<17} {'latency med':>11} {'p90':>9}" + "".join(f" {'vs ' + b:>13}" for b in BASELINES)
          + f"   {'throughput':>10}" + "".join(f" {'vs ' + b:>13}" for b in BASELINES))
    for name, kind in kinds.items():
        print(f"{name:<17} {lat[name] * 1000:>9.1f}ms {p90(kind.latency) * 1000:>7.1f}ms"
              + "".join(f" {lat[name] / lat[b]:>12.2f}x" for b in BASELINES)
              + f"   {thr[name]:>8.1f}/s" + "".join(f" {thr[name] / thr[b]:>12.2f}x" for b in BASELINES))
    print("\nwhere the time goes (median ms per segment, history event timestamps, latency runs):")
    names = list(breakdown["bare3"])
    print(f"  {'segment':<40}" + "".join(f"{k:>17}" for k in kinds))
    for seg in names:
        print(f"  {seg:<40}" + "".join(f"{breakdown[k].get(seg, float('nan')):>17.1f}" for k in kinds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server", choices=("lab", "stock"), default="lab",
                        help="the dev server's dynamic config: the lab's (default) or Temporal's defaults")
    args = parser.parse_args()
    kinds, breakdown = asyncio.run(main_async(args))
    report(kinds, breakdown, args)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
