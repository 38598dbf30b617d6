"""Resume after SIGKILL, from the kill to the run done: the run record against Temporal.

    .venv/bin/python bench/bench_resume_record.py [--trials 5] [--points draft:before,...]

For each crash point and trial, interleaved in one invocation against one
provider process:

- **record**: ``python -m durable_agents.runrecord start`` armed with CRASH_AT kills itself
  (SIGKILL) at that point; as soon as it is seen dead, ``python -m durable_agents.runrecord
  resume RUN_ID`` is started. Default lease (10 s): before durable_agents.runrecord.lease
  the resume was refused until it expired. Done = the completion commit's
  time in the record (``runs.updated_at``).
- **temporal** and **temporal+server**: ``bench_resume.one``, unchanged: a
  worker armed with CRASH_AT dies, a replacement worker is started at once;
  done = the WorkflowExecutionCompleted event's time. ``temporal`` is the
  tuned client settings on a stock dev server (the setting of docs/results.md's
  resume figures); ``temporal+server`` the same on the lab's dev server
  (``LAB_SERVER_CONFIG``).

Both clocks start when the dead process is seen gone (polled every 20 ms),
and both include starting the replacement process (a Python interpreter
either way): that is what a person or a supervisor restarting the thing
pays. The start-up part is reported apart: for the record, up to the
resumer's first commit (the crashed step's new attempt); for Temporal, up to
the replacement's "worker ready".

Not a test: it reports, it does not assert. Goal (issue 10, item 9): the
record no slower than Temporal (ratio <= 1).
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

from bench_resume import POINTS  # noqa: E402  (bench/bench_resume.py)
from bench_resume import one as temporal_one

from durable_agents.flowclient.connect import exit_now  # noqa: E402
from durable_agents.runrecord import RunRecord  # noqa: E402
from durable_agents.steps.plan import STEP_NAMES  # noqa: E402
from lab import registry  # noqa: E402
from lab.engines import RunRecordDriver, TemporalDriver  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
# The two engines' lanes, named by their registrations (lab.registry), and Temporal's variant on the lab's
# tuned, file-backed server, derived from Temporal's.
RECORD = registry.registration_of(RunRecordDriver).name
TEMPORAL = registry.registration_of(TemporalDriver).name
ON_SERVER = registry.registration_of(TemporalDriver).variant("+server")
ENGINES = (RECORD, TEMPORAL, ON_SERVER)


async def _exited(proc: Proc, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while proc.alive():
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} still running after {timeout:.0f} s:\n{proc.output()}")
        await asyncio.sleep(0.02)  # as bench_resume.one polls the dying worker
    return proc.popen.returncode


async def record_one(provider_url: str, point: str, workdir: Path) -> tuple[float, float]:
    """(seconds from the runner's death to the run's completion commit, of which the resumer's start-up)."""
    run_id = f"bench-record-{point.replace(':', '-')}-{uuid.uuid4().hex[:6]}"
    db = workdir / "runrecord.db"
    env = {"RUNRECORD_DB": str(db), "MEMORY_DB": str(workdir / "record-memory.db"), "PROVIDER_URL": provider_url,
           "RUNRECORD_LEASE_SECONDS": "10", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "durable_agents.runrecord"]
    first = Proc("runrecord-start", [*argv, "start", run_id, TASK, "--email", EMAIL], env={**env, "CRASH_AT": point})
    try:
        code = await _exited(first, 60, f"the runner armed with {point}")
    finally:
        died = time.time()
        first.kill()  # reaps it
    if code != -9:
        raise RuntimeError(f"the runner did not die at {point} (exit {code}):\n{first.output()}")
    second = Proc("runrecord-resume", [*argv, "resume", run_id], env=env)
    try:
        code = await _exited(second, 120, "the resume")
    finally:
        second.kill()
    if code != 0:
        raise RuntimeError(f"resume exited {code}:\n{second.output()}")
    with RunRecord(db) as record:
        run = record.load(run_id)
    position = next(i for i, name in enumerate(STEP_NAMES) if point.startswith(f"{name}:"))
    resumed = run.steps[position].attempt_started_at  # the resumer's first commit: attempt 2 of that step
    return run.updated_at - died, resumed - died


async def main_async(trials: int, points: list[str]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        stock = DevServer().start()
        lab = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider = start_provider(work / "provider.db")
        url = provider.url
        try:
            for trial in range(trials):
                for point in points:
                    for engine in ENGINES:
                        if engine == RECORD:
                            total, startup = await record_one(url, point, work)
                        else:
                            server = lab if engine == ON_SERVER else stock
                            from_ready, total = await temporal_one(server, url, point, "tuned", work)
                            startup = total - from_ready
                        results.setdefault((point, engine), []).append((total, startup))
                        print(f"  trial {trial + 1} {point:<32} {engine:<16} {total:6.2f} s from the kill "
                              f"(start-up {startup:4.2f} s)", flush=True)
        finally:
            provider.stop()
            stock.stop()
            lab.stop()
    return results


def report(results: dict, trials: int) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"trials per cell: {trials}; seconds from the SIGKILL to the run done\n")
    points = sorted({p for p, _ in results}, key=POINTS.index)
    print(f"{'crash point':<32} {'record med':>10} {'worst':>6} {'temporal med':>12} {'worst':>6} {'ratio':>6} "
          f"{'+server med':>11} {'worst':>6} {'ratio':>6}")

    def row(label: str, cells: dict[str, list[float]]) -> None:
        med = {e: statistics.median(v) for e, v in cells.items()}
        worst = {e: max(v) for e, v in cells.items()}
        print(f"{label:<32} {med[RECORD]:>9.2f}s {worst[RECORD]:>5.2f}s {med[TEMPORAL]:>11.2f}s "
              f"{worst[TEMPORAL]:>5.2f}s {med[RECORD] / med[TEMPORAL]:>5.2f}x "
              f"{med[ON_SERVER]:>10.2f}s {worst[ON_SERVER]:>5.2f}s "
              f"{med[RECORD] / med[ON_SERVER]:>5.2f}x")

    every: dict[str, list[float]] = {e: [] for e in ENGINES}
    for point in points:
        cells = {e: [t for t, _ in results[(point, e)]] for e in ENGINES}
        for e in ENGINES:
            every[e] += cells[e]
        row(point, cells)
    row("all points", every)
    print("\nratio: record median / Temporal median (below 1: the record is done sooner)")
    print("worst-case ratio, all points: "
          + ", ".join(f"{RECORD} / {e} {max(every[RECORD]) / max(every[e]):.2f}x" for e in ENGINES[1:]))
    print("\nof which the replacement's start-up (record: to its first commit; Temporal: to 'worker ready'), "
          "all points:")
    for e in ENGINES:
        startups = [s for p in points for _, s in results[(p, e)]]
        rest = [t - s for p in points for t, s in results[(p, e)]]
        print(f"  {e:<16} start-up median {statistics.median(startups):4.2f} s, worst {max(startups):4.2f} s; "
              f"then to done median {statistics.median(rest):4.2f} s, worst {max(rest):4.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--points", default=",".join(POINTS))
    args = parser.parse_args()
    points = [p for p in args.points.split(",") if p]
    unknown = set(points) - set(POINTS)
    if unknown:
        print(f"error: unknown crash points {sorted(unknown)}; choose from {POINTS}", file=sys.stderr)
        return 2
    results = asyncio.run(main_async(args.trials, points))
    report(results, args.trials)
    return 0


if __name__ == "__main__":
    exit_now(main())
