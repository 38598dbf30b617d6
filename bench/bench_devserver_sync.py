"""What synchronous=EXTRA costs a file-backed Temporal dev server, against SQLite's default (FULL).

    .venv/bin/python bench/bench_devserver_sync.py [--step-runs 40] [--flow-runs 20] [--rounds 3]

The lab's dev server runs at ``EXTRA`` whenever it has a database file
(``lab.processes.FILE_PRAGMAS``): at ``FULL`` a commit is the deletion of a
rollback journal that is never synced to its directory, so a power cut can
undo the last acknowledged transaction; ``EXTRA`` adds an ``fsync`` of the
directory after each deletion (docs/powercut.md). bench_engines.py runs its
server in memory, where no level shows. Here, in one invocation, three dev
servers with ``LAB_SERVER_CONFIG`` run side by side, their files in one temp
directory under .state/ (the same disk):

- **FULL**: ``--db-filename`` with ``--sqlite-pragma synchronous=FULL`` (the
  server's default, before);
- **EXTRA**: the same with ``synchronous=EXTRA`` (the lab's, after);
- **in memory**: no file (a reference: what the file costs at all).

Each server has its own in-process worker with worker.py's options
(``TUNED_OPTIONS``); one provider process and one memory file serve all three.
Measured one run at a time, interleaved server by server so all see the same
disk and load:

- **per step**: a bare workflow of three no-op activities (``BareN``), start to
  result / 3: the server's own record of a step (history events, the workflow
  and activity tasks, each a transaction);
- **end to end**: the real flow (offline model, provider, memory), start to
  result.

Medians of each round's median, and the p90 over every run; the ratio EXTRA /
FULL is what the level costs. Not a test: it reports, it does not assert.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bare_flows import BareN, noop  # noqa: E402

from durable_agents.wiring import close_memory, deps_from_env  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
SERVERS = ("FULL", "EXTRA", "in memory")


def make_server(name: str, work: Path) -> DevServer:
    if name == "in memory":
        return DevServer(dynamic_config=LAB_SERVER_CONFIG)
    return DevServer(db_file=work / f"temporal-{name.lower()}.db", dynamic_config=LAB_SERVER_CONFIG,
                     sqlite_pragmas={"synchronous": name})


class Lane:
    """One dev server and its in-process worker."""

    def __init__(self, server: DevServer, env: dict[str, str]) -> None:
        self.server, self.env = server, env
        self.deps = deps_from_env(env)

    async def __aenter__(self) -> Lane:
        from temporalio.client import Client
        from temporalio.worker import Worker

        from durable_agents.activities import FlowActivities
        from durable_agents.flowclient.worker_options import TUNED_OPTIONS  # worker.py's options as shipped
        from durable_agents.workflows.agent_flow import AgentFlow

        self.client = await Client.connect(self.server.address)
        self.queue = f"bench-devsync-{uuid.uuid4().hex[:6]}"
        self.worker = Worker(self.client, task_queue=self.queue, workflows=[AgentFlow, BareN],
                             activities=[*FlowActivities(self.deps).all(), noop], **TUNED_OPTIONS)
        await self.worker.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.__aexit__(None, None, None)
        await self.deps.provider.aclose()
        close_memory(self.deps.remember)

    async def step(self) -> float:
        start = time.perf_counter()
        await self.client.execute_workflow(BareN.run, 3, id=f"bare-{uuid.uuid4().hex}", task_queue=self.queue)
        return (time.perf_counter() - start) / 3

    async def flow(self) -> float:
        from durable_agents.flowclient.runs import start_run

        run_id = f"devsync-{uuid.uuid4().hex[:10]}"
        start = time.perf_counter()
        await start_run(self.client, run_id, TASK, EMAIL, queue=self.queue)
        await self.client.get_workflow_handle(run_id).result()
        return time.perf_counter() - start


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


async def measure(args: argparse.Namespace, work: Path) -> dict[str, dict[str, list[float]]]:
    provider = start_provider(work / "provider.db")
    servers: dict[str, DevServer] = {}
    lanes: dict[str, Lane] = {}
    out: dict[str, dict[str, list[float]]] = {"step": {}, "flow": {}, "step_all": {}, "flow_all": {}}
    try:
        for name in SERVERS:
            servers[name] = make_server(name, work).start()
        env = {"PROVIDER_URL": provider.url, "MEMORY_DB": str(work / "memory.db")}
        for name in SERVERS:
            lanes[name] = await Lane(servers[name], env).__aenter__()
        for lane in lanes.values():  # warm-up: connections, the first workflow of each kind
            await lane.step()
            await lane.flow()
        for kind, runs in (("step", args.step_runs), ("flow", args.flow_runs)):
            for name in SERVERS:
                out[kind][name], out[f"{kind}_all"][name] = [], []
            for r in range(args.rounds):
                per: dict[str, list[float]] = {name: [] for name in SERVERS}
                for _ in range(runs):
                    for name, lane in lanes.items():
                        per[name].append(await (lane.step() if kind == "step" else lane.flow()))
                for name in SERVERS:
                    out[kind][name].append(statistics.median(per[name]))
                    out[f"{kind}_all"][name] += per[name]
                print(f"  {kind} round {r + 1}: " + ", ".join(
                    f"{name} {statistics.median(per[name]) * 1e3:.2f} ms" for name in SERVERS), flush=True)
    finally:
        for lane in lanes.values():
            await lane.__aexit__(None, None, None)
        for server in servers.values():
            server.stop()
        provider.stop()
    return out


def report(out: dict[str, dict[str, list[float]]], args: argparse.Namespace, seconds: float) -> None:
    print(f"machine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{args.rounds} rounds x ({args.step_runs} bare 3-step workflows + {args.flow_runs} real flows) per "
          f"server, interleaved; {seconds:.0f} s")
    for kind, title in (("step", "per step (BareN(3) / 3)"), ("flow", "end to end (the real flow)")):
        med = {n: statistics.median(v) * 1e3 for n, v in out[kind].items()}
        tail = {n: p90(v) * 1e3 for n, v in out[f"{kind}_all"].items()}
        print(f"  {title}:")
        for name in SERVERS:
            print(f"    {name:<10} median {med[name]:8.2f} ms   p90 {tail[name]:8.2f} ms   "
                  f"{med[name] / med['FULL']:.2f}x FULL")
        print(f"    EXTRA / FULL: {med['EXTRA'] / med['FULL']:.2f}x (median), "
              f"{tail['EXTRA'] / tail['FULL']:.2f}x (p90); EXTRA - FULL: {med['EXTRA'] - med['FULL']:+.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-runs", type=int, default=40, help="bare workflows per server per round")
    parser.add_argument("--flow-runs", type=int, default=20, help="real flows per server per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(__file__).resolve().parent.parent / ".state"
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-devsync-") as tmp:
        out = asyncio.run(measure(args, Path(tmp)))
    report(out, args, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
