"""The kill matrix's time per crash point against one unkilled run of the same task, in one invocation.

    .venv/bin/python bench/bench_kill_matrix.py [--engines temporal,runrecord] [--rounds 2] [--parallel 1]

The agent is the example of docs/your-agent.md (examples/scheduler: 3 turns, 3 tool calls, 2 effects, so
9 crash points per engine), its service a process of its own, Temporal a dev server in memory with the lab's
dynamic config. Per engine and round: ``KillMatrix(...).run()`` on that engine alone, which times its own
unkilled run (the baseline: one run of the task by the same commands, a worker or the engine's CLI started
for it, ended, judged) and every kill (armed process, the kill, the take-over, the judgement). Reported: the
whole matrix, its time per kill, the unkilled run, and the ratio of the two (per kill over unkilled), median
over rounds. A ratio, not a time: the machine's speed falls on both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from durable_agents.testing import KillMatrix
from durable_agents.testing.processes import LAB_SERVER_CONFIG, DevServer, Proc, free_port

REPO = Path(__file__).resolve().parents[1]
SPEC = "examples.scheduler.agent:AGENT"
TASK = "Book a room on 2027-01-12 for the planning meeting and invite the attendee."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="temporal,runrecord", help="comma-separated, of temporal, runrecord, dbos")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1, help="kills at once (KillMatrix's parallel)")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
    results: dict[str, list[tuple[float, int, float]]] = {e: [] for e in engines}
    try:
        for round_ in range(1, args.rounds + 1):
            for engine in engines:
                with tempfile.TemporaryDirectory(prefix="bench-kill-matrix-") as tmp:
                    port = free_port()
                    service = Proc("scheduler", [sys.executable, "-m", "examples.scheduler.service", "--db",
                                                 str(Path(tmp) / "s.db"), "--port", str(port)], cwd=REPO)
                    try:
                        service.wait_for_line("scheduler listening", timeout=30)
                        began = time.monotonic()
                        report = KillMatrix(SPEC, TASK, params={"attendee": "ana@example.com"}, engines=(engine,),
                                            env={"SCHEDULER_URL": f"http://127.0.0.1:{port}"}, cwd=REPO,
                                            temporal_address=server.address, parallel=args.parallel).run()
                        whole = time.monotonic() - began
                    finally:
                        service.kill()
                verdicts = sorted({r.verdict for r in report.rows})
                unkilled = float(report.reference[engine]["seconds"])
                results[engine].append((whole, len(report.rows), unkilled))
                print(f"round {round_} {engine}: {len(report.rows)} kills in {whole:.1f} s "
                      f"({whole / len(report.rows):.2f} s a kill), unkilled run {unkilled:.2f} s, verdicts "
                      f"{verdicts}", flush=True)
    finally:
        server.stop()
    print()
    print(f"{'engine':<10} {'kills':>5} {'matrix s':>9} {'s a kill':>9} {'unkilled s':>10} {'kill / unkilled':>16}")
    for engine, rows in results.items():
        ratio = statistics.median(w / n / u for w, n, u in rows)
        print(f"{engine:<10} {rows[0][1]:>5} {statistics.median(w for w, _, _ in rows):>9.1f} "
              f"{statistics.median(w / n for w, n, _ in rows):>9.2f} {statistics.median(u for _, _, u in rows):>10.2f} "
              f"{ratio:>15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
