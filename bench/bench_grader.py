"""How long grading an exercise takes, against one plain run of the same code.

    .venv/bin/python bench/bench_grader.py [--exercises 1,2,3,4,5,6,7] [--rounds 1]

For each exercise, in one invocation: the time of ``python -m grader.grade N
--impl solution`` (the checks of exercises 1..N; exercise 6 its own), and,
as the baseline measured beside it, one plain run of that solution as a
learner starts it by hand (``python flow.py start ...`` to completion against
a provider of its own, or for exercise 6 one ``python worker.py`` start to
its ready line; for exercise 7 one ``python agent_loop.py start`` of a
one-order refund against the lab's model stand-in). The ratio says how many plain runs a grading costs; the
goal (issue 20) is a grading under 30 s.

Not a test: it reports, it does not assert. Figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from durable_agents.providerclient import seed_orders  # noqa: E402
from durable_agents.testing.standin import ModelStandIn  # noqa: E402
from lab.processes import Proc  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

GOAL_SECONDS = 30.0


def grading(n: int) -> tuple[float, str]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "grader.grade", str(n), "--impl", "solution"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"grade {n} on its solution failed:\n{done.stdout}{done.stderr}")
    processes = sum(int(line.split("(")[1].split(" processes")[0]) for line in done.stdout.splitlines()
                    if line.startswith("  PASS ("))
    return seconds, f"{processes} processes"


def plain_run(n: int, work: Path, provider_url: str) -> float:
    folder = next((REPO / "exercises").glob(f"{n:02d}-*")) / "solution"
    env = {"PROVIDER_URL": provider_url, "RECORD_DB": str(work / "record.db"), "MEMORY_FILE": str(work / "m.json"),
           "MEMORY_DB": "off", "PYTHONDONTWRITEBYTECODE": "1"}
    began = time.monotonic()
    if n == 6:  # the worker's start to its ready line: what each of the check's three workers pays
        proc = Proc("worker", [sys.executable, str(folder / "worker.py")], env={**env, "TEMPORAL_ADDRESS":
                    "127.0.0.1:1"}, cwd=work)
        try:
            proc.wait_for_line("worker ready", timeout=60)
        except (RuntimeError, TimeoutError):
            pass  # no server to connect to: the import and start-up cost is what is timed
        seconds = time.monotonic() - began
        proc.kill()
        return seconds
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    if n == 7:  # the agent loop: one run of four turns, its model the lab's stand-in, its order seeded
        order = f"B-{uuid.uuid4().int % 10**6:06d}"
        seed_orders(provider_url, {order: 4200})
        with ModelStandIn() as model:
            began = time.monotonic()
            subprocess.run([sys.executable, str(folder / "agent_loop.py"), "start", run_id,
                            f"Refund order {order} in full", "--email", "ada@example.com"], cwd=work,
                           env={**os.environ, **env, "LLM_BASE_URL": model.url, "LLM_MODEL": "stand-in",
                                "RECORD_DB": str(work / "loop-record.db")},  # its own schema
                           check=True, capture_output=True, timeout=120)
            return time.monotonic() - began
    subprocess.run([sys.executable, str(folder / "flow.py"), "start", run_id, "Confirm the refund for order 1234",
                    "--email", "ada@example.com"], cwd=work, env={**os.environ, **env}, check=True,
                   capture_output=True, timeout=120)
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercises", default="1,2,3,4,5,6,7")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    numbers = [int(n) for n in args.exercises.split(",")]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    work = Path(tempfile.mkdtemp(prefix="bench-grader-"))
    provider = start_provider(work / "provider.db")
    try:
        rows = []
        for n in numbers:
            graded, plain, shown = [], [], ""
            for _ in range(args.rounds):
                plain.append(plain_run(n, work, provider.url))
                seconds, shown = grading(n)
                graded.append(seconds)
            g, p = statistics.median(graded), statistics.median(plain)
            rows.append((n, g, p, shown))
            print(f"exercise {n}: grade {g:5.1f} s ({shown}); one plain run {p:4.2f} s; ratio {g / p:5.1f}x; "
                  f"goal {GOAL_SECONDS:.0f} s: {'met' if g < GOAL_SECONDS else 'not met'}", flush=True)
    finally:
        provider.kill()
    print("\n| exercise | `grade N --impl solution` | processes | one plain run | ratio |")
    print("|---|---|---|---|---|")
    for n, g, p, shown in rows:
        print(f"| {n} | {g:.1f} s | {shown.split()[0]} | {p:.2f} s | {g / p:.1f}x |")


if __name__ == "__main__":
    main()
