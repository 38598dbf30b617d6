"""Resume latency after SIGKILL: the tuned settings against Temporal's defaults.

    .venv/bin/python bench/bench_resume.py [--trials 5] [--points draft:before,...] [--heartbeats 1,3]

For each crash point and each setting, a worker armed with CRASH_AT kills
itself (SIGKILL) at that point; a replacement worker is started; the figure is
the time from the replacement printing "worker ready" to the run's
WorkflowExecutionCompleted event (server clock, same machine). Both settings
run in the same invocation against the same dev server, interleaved, so the
ratio compares like with like.

tuned:        the rule's heartbeat timeout (``--heartbeats``: each value given is
              recorded in the runs' rule and measured, interleaved; default
              the rule's default), no workflow cache (so no sticky queue),
              workflow task timeout 2 s: client-side settings, portable to any server
defaults:     no heartbeat timeout (start-to-close 10 s), sticky 10 s,
              workflow task timeout 10 s: bench/defaults_worker.py, whose
              workflow (bench/defaults_flow.py) overrides the flow's one
              timeout hook, ``AgentFlow.attempt_timeouts``; the shipped
              worker and workflow know nothing of this mode
tuned+server: tuned, on a dev server started with LAB_SERVER_CONFIG: the
              server's timer queue fires with ~1 s granularity by default
              (history.timerProcessorMaxTimeShift); the heartbeat timeout and
              the retry backoff are both timers, so each can fire up to ~1 s
              late; and its transfer queue is read at most 20 times a second
              (history.transferProcessorMaxPollRPS). Server settings: the
              compose stack has them; Temporal Cloud runs its own.
tuned+cache:  tuned, but with a workflow cache (``worker.py`` as shipped since
              issue 13: a cache of 1,000 and a 100 ms sticky schedule-to-start
              timeout; it was 1 s before), on the stock server: what the cache
              costs in resume time where timers fire late. ``tuned`` is
              ``worker.py --cache 0``.

Not a test: it reports, it does not assert. Goal (issue 2): tuned median < 1 s,
worst < 2 s, and at least 5x better than the defaults; given up on purpose by
issue 35, whose 3 s heartbeat timeout adds ~2 s to every resume so that a live
worker whose event loop stalls is not taken for dead (docs/operations.md;
``--heartbeats 1,3`` measures both).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.api.enums.v1 import EventType  # noqa: E402

from durable_agents.flowclient.connect import connect, exit_now  # noqa: E402
from durable_agents.flowclient.runs import WORKFLOW_TASK_TIMEOUT, start_run  # noqa: E402
from durable_agents.flowclient.status import run_status  # noqa: E402
from durable_agents.steps.retry import DEFAULT_HEARTBEAT_TIMEOUT, rule_from_env  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc, start_worker  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TEMPORAL_DEFAULT_TASK_TIMEOUT = timedelta(seconds=10)

POINTS = ["draft:before", "send_confirmation:before", "send_confirmation:after_effect",
          "record_outcome:before", "record_outcome:after_effect"]


async def completed_at(client, run_id: str, deadline: float) -> float:
    while time.monotonic() < deadline:
        status = await run_status(client, run_id)
        if status["status"] == "completed":
            history = await client.get_workflow_handle(run_id).fetch_history()
            for ev in history.events:
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                    return ev.event_time.ToDatetime().replace(tzinfo=UTC).timestamp()
        if status["status"] == "failed":
            raise RuntimeError(f"run {run_id} failed: {status['error']}")
        await asyncio.sleep(0.05)
    raise TimeoutError(f"run {run_id} did not complete")


def start_mode_worker(mode: str, address: str, provider_url: str, queue: str, env: dict[str, str]) -> Proc:
    """worker.py for the tuned modes; bench/defaults_worker.py for "defaults"."""
    if mode != "defaults":
        args = ["--cache", "1000"] if mode == "tuned+cache" else ["--cache", "0"]
        return start_worker(address, provider_url, queue, env, args)
    proc = Proc("worker", [sys.executable, "bench/defaults_worker.py"],
                env={"TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": "default", "TASK_QUEUE": queue,
                     "PROVIDER_URL": provider_url, "PYTHONUNBUFFERED": "1", **env})
    proc.wait_for_line("worker ready", timeout=60)
    return proc


async def one(server, provider_url, point: str, mode: str, workdir: Path,
              heartbeat: float | None = None) -> tuple[float, float]:
    """(seconds from the replacement being ready, seconds from the first worker's death) to completion.
    ``heartbeat``: the heartbeat timeout the run's rule records, else the rule's own (the "defaults"
    mode's flow has none)."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    run_id = f"bench-{mode.replace('+', '-')}-{point.replace(':', '-')}-{uuid.uuid4().hex[:6]}"
    client = await connect({**os.environ, "TEMPORAL_ADDRESS": server.address})
    memory = {"MEMORY_DB": str(workdir / f"{queue}-memory.db")}  # removed with the bench's temp dir
    first = start_mode_worker(mode, server.address, provider_url, queue, {"CRASH_AT": point, **memory})
    try:
        task_timeout = TEMPORAL_DEFAULT_TASK_TIMEOUT if mode == "defaults" else WORKFLOW_TASK_TIMEOUT
        rule = rule_from_env()
        if heartbeat is not None:
            rule = dataclasses.replace(rule, heartbeat_timeout=heartbeat)
        await start_run(client, run_id, "Confirm the refund for order 1234", "ada@example.com",
                        queue=queue, rule=rule, task_timeout=task_timeout)
        deadline = time.monotonic() + 60
        while first.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if first.alive():
            raise RuntimeError(f"worker did not reach {point}")
    finally:
        died = time.time()
        first.kill()  # reaps it too: a dead child left unreaped stayed a zombie and hung a run
    second = start_mode_worker(mode, server.address, provider_url, queue, memory)
    ready = time.time()
    try:
        done = await completed_at(client, run_id, time.monotonic() + 120)
    finally:
        second.kill()
    return done - ready, done - died


MODES = ("tuned", "defaults", "tuned+server", "tuned+cache")


async def main_async(trials: int, points: list[str], heartbeats: list[float]) -> tuple[dict, dict]:
    """Per (point, mode, heartbeat timeout): seconds from ready, and from the kill, to done.
    The "defaults" mode is measured once per trial (its flow has no heartbeat timeout) under
    the first heartbeat value's key."""
    results: dict[tuple[str, str, float], list[float]] = {}
    from_kill: dict[tuple[str, str, float], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stock = DevServer().start()
        fast = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider = start_provider(Path(tmp) / "provider.db")
        url = provider.url
        try:
            for trial in range(trials):
                for point in points:
                    for heartbeat in heartbeats:
                        for mode in MODES:
                            if mode == "defaults" and heartbeat != heartbeats[0]:
                                continue
                            server = fast if mode == "tuned+server" else stock
                            seconds, since_death = await one(server, url, point, mode, Path(tmp), heartbeat)
                            results.setdefault((point, mode, heartbeat), []).append(seconds)
                            from_kill.setdefault((point, mode, heartbeat), []).append(since_death)
                            print(f"  trial {trial + 1} {point:<32} {mode:<12} heartbeat {heartbeat:g} s "
                                  f"{seconds:6.2f} s", flush=True)
        finally:
            provider.stop()
            stock.stop()
            fast.stop()
    return results, from_kill


def report(results: dict, from_kill: dict, trials: int, heartbeats: list[float]) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"trials per cell: {trials}")
    points = sorted({p for p, _, _ in results}, key=POINTS.index)
    first = heartbeats[0]

    def row(label: str, t: list[float], d: list[float], f: list[float], c: list[float]) -> None:
        ratio = statistics.median(d) / max(statistics.median(t), 1e-3)
        print(f"{label:<32} {statistics.median(t):>11.2f}s {max(t):>11.2f}s {statistics.median(d):>15.2f}s "
              f"{ratio:>5.1f}x {statistics.median(f):>14.2f}s {max(f):>13.2f}s "
              f"{statistics.median(c):>13.2f}s {max(c):>12.2f}s")

    for heartbeat in heartbeats:
        print(f"\nheartbeat timeout {heartbeat:g} s (tuned modes; the defaults mode has none):")
        print(f"{'crash point':<32} {'tuned median':>12} {'tuned worst':>12} {'defaults median':>16} {'ratio':>6}"
              f" {'+server median':>15} {'+server worst':>14} {'+cache median':>14} {'+cache worst':>13}")
        every: dict[str, list[float]] = {m: [] for m in MODES}
        for point in points:
            cells = [results[(point, m, first if m == "defaults" else heartbeat)] for m in MODES]
            for m, cell in zip(MODES, cells, strict=True):
                every[m] += cell
            row(point, *cells)
        row("all points", *(every[m] for m in MODES))
        # The goal's clock starts when the replacement is ready; the server's timeouts
        # started at the kill, while the replacement was still starting up.
        print("from the first worker's death instead (includes the replacement's start-up), all points:")
        for m in MODES:
            key = first if m == "defaults" else heartbeat
            killed = [v for p in points for v in from_kill[(p, m, key)]]
            ready = [v for p in points for v in results[(p, m, key)]]
            startup = [k - r for k, r in zip(killed, ready, strict=True)]
            print(f"  {m:<13} median {statistics.median(killed):5.2f} s, worst {max(killed):5.2f} s"
                  f"  (replacement start-up median {statistics.median(startup):4.2f} s)")
    if len(heartbeats) > 1:
        print(f"\nwhat the heartbeat timeout costs, from the kill, all points (against {first:g} s):")
        for m in ("tuned", "tuned+server", "tuned+cache"):
            base = statistics.median([v for p in points for v in from_kill[(p, m, first)]])
            for heartbeat in heartbeats[1:]:
                other = statistics.median([v for p in points for v in from_kill[(p, m, heartbeat)]])
                print(f"  {m:<13} {heartbeat:g} s: median {other:5.2f} s against {base:5.2f} s "
                      f"({other - base:+.2f} s, {other / base:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--heartbeats", default=f"{DEFAULT_HEARTBEAT_TIMEOUT:g}",
                        help="heartbeat timeouts (seconds) recorded in the runs' rule, each measured "
                             f"(default: the rule's, {DEFAULT_HEARTBEAT_TIMEOUT:g})")
    args = parser.parse_args()
    heartbeats = [float(h) for h in args.heartbeats.split(",") if h]
    points = [p for p in args.points.split(",") if p]
    unknown = set(points) - set(POINTS)
    if unknown:
        print(f"error: unknown crash points {sorted(unknown)}; choose from {POINTS}", file=sys.stderr)
        return 2
    results, from_kill = asyncio.run(main_async(args.trials, points, heartbeats))
    report(results, from_kill, args.trials, heartbeats)
    return 0


if __name__ == "__main__":
    exit_now(main())
