"""The kill-and-resume demo: the whole story on one machine, in one command.

    make demo            (or: .venv/bin/python -m lab.demo)

1. starts the Temporal dev server (persisting to .state/temporal.db; UI on
   http://127.0.0.1:8233), the provider (the stand-in email and ticket APIs,
   counting effects in .state/provider.db) and a worker;
2. starts a run and follows it step by step;
3. SIGKILLs the worker as soon as step 2 (the email) is recorded;
4. shows the run waiting at step 3 with no worker alive;
5. starts a new worker and follows the run to the end;
6. prints which worker executed which step and the provider's effect counts,
   checks them, and stops everything it started.

Steps are slowed to LAB_STEP_SECONDS (default 1.5 s here) so you can watch.
Exit code 0 only if the run resumed at step 3, steps 1 and 2 did not run
again, and every effect was applied exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from durable_agents.flowclient.connect import exit_now
from durable_agents.providerclient import EffectRecord, fetch_effects
from durable_agents.steps.controls import printable
from durable_agents.steps.plan import EFFECT_STEPS, STEP_NAMES
from durable_agents.steps.runview import render_table, step_ticker
from lab.engines import TemporalDriver, started_steps
from lab.processes import (
    LAB_SERVER_CONFIG,
    REPO,
    DevServer,
    Proc,
    free_port,
    port_is_free,
    start_codec_server,
    wait_until,
)
from lab.provider_process import ProviderProcess, start_provider

LAST = STEP_NAMES[-1]  # the step the demo kills worker 1 in: the plan's last, whose effect comes last
_COUNTS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}

console = Console(highlight=False)
if not console.is_terminal:  # piped or logged: don't wrap at 80 columns
    console = Console(highlight=False, width=120)
STATE = REPO / ".state"


def say(text: str) -> None:
    console.print(f"[bold cyan]==>[/] {text}", soft_wrap=True)  # one line each, however long the path


# ---------------------------------------------------------------- what this demo and lab.loop_demo share


def add_demo_arguments(parser: argparse.ArgumentParser, *, state_help: str, keep_help: str) -> None:
    """``--state-dir``, ``--port`` and ``--keep-server``: where the state goes, the dev server's ports, and
    whether it stays up at the end."""
    parser.add_argument("--state-dir", type=Path, default=STATE, help=state_help)
    parser.add_argument("--port", type=int, default=7233,
                        help="dev server port (UI on port+1000); 0 picks free ports (default 7233)")
    parser.add_argument("--keep-server", action="store_true", help=keep_help)


def pick_port(port: int) -> int:
    """``--port``, or a free one when it is 0 or it (or its UI's, port+1000) is taken: said so."""
    if port == 0 or not (port_is_free(port) and port_is_free(port + 1000)):
        if port:
            console.print(f"    port {port} or {port + 1000} is taken (another dev server?); using free ports")
        port = free_port()
    return port


def start_server(server: DevServer, state: Path, port: int) -> None:
    say(f"starting the Temporal dev server on {server.address} (UI http://127.0.0.1:{port + 1000}, "
        f"history in {state / 'temporal.db'})")
    server.start()


def print_effects(effects: Sequence[EffectRecord]) -> None:
    """The provider's bookkeeping of a run, one row per idempotency key."""
    table = Table(title="effects at the provider (counted by the provider process)")
    for col in ("idempotency key", "kind", "requests", "effects applied"):
        table.add_column(col)
    for e in effects:
        table.add_row(escape(printable(e.key)), escape(printable(e.kind)), str(e.requests), str(e.effects_applied))
    console.print(table)


def print_checks(checks: Sequence[tuple[str, bool]]) -> int:
    """A PASS or FAIL line per check; the exit code: 0 only if every one passed."""
    for label, ok in checks:
        console.print(f"    [{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] {escape(label)}")
    return 0 if all(ok for _, ok in checks) else 1


def hold_server() -> None:
    """Sleep until Ctrl-C: what is left running stays up to be browsed."""
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


# ---------------------------------------------------------------- the story


async def story(server: DevServer, provider_url: str, pace: str, run_id: str, state: Path) -> int:
    # Temporal's driver (lab.engines): its workers on the demo's queue, its runs started as starter.py starts them.
    temporal = TemporalDriver(server, {"PROVIDER_URL": provider_url, "LAB_STEP_SECONDS": pace,
                                       "MEMORY_DB": str(state / "memory.db")}, queue="agent-flow-demo")
    try:
        return await _story(temporal, pace, run_id)
    finally:
        temporal.close()


async def _story(temporal: TemporalDriver, pace: str, run_id: str) -> int:
    say(f"starting worker 1 (steps slowed to {pace} s each so you can watch)")
    first = await temporal.start_worker(name="worker1")
    console.print(f"    worker 1 is pid {first.pid}")

    say(f'starting run {run_id}: "Confirm the refund for order 1234" -> ada@example.com')
    await temporal.submit(run_id, "Confirm the refund for order 1234", "ada@example.com")
    tick = step_ticker(indent="    ")  # shared by both workers' halves: a step is printed when it changes
    # Until the status shows step 3 running (step 2 completed before it), so the
    # ticker prints that line every time, however quickly step 3 is scheduled.
    await temporal.wait_for(run_id, lambda s: s["steps"][-1]["status"] == "running", tick, timeout=120)
    # Kill inside step 3, before its effect (the step's pace comes first), so
    # the story is the same every time; at --pace 0 the step may beat the kill.
    await wait_until(lambda: LAST in started_steps(first), 60, f"worker 1 to start step {len(STEP_NAMES)}",
                     interval=0.02)

    say(f"step {len(STEP_NAMES) - 1} is recorded and step {len(STEP_NAMES)} has begun: SIGKILL worker 1 "
        f"(pid {first.pid}), no cleanup, no goodbye")
    first.kill()
    # Temporal notices by the missing heartbeats (about a second): then the step is waiting for a worker.
    waiting = await temporal.wait_for(run_id, lambda s: s["steps"][-1]["status"] in ("waiting", "completed"),
                                      timeout=60)
    tick(waiting)
    say("with no worker alive, Temporal's record of the run says:")
    console.print(render_table(waiting), markup=False)  # run data: escaped, and not rich markup

    say("starting worker 2: it replays the history and continues at the first unfinished step")
    ready = time.monotonic()
    second = await temporal.start_worker(name="worker2")
    console.print(f"    worker 2 is pid {second.pid}")
    final = await temporal.wait_for(run_id, lambda s: s["status"] != "running", tick, timeout=120)
    elapsed = time.monotonic() - ready
    second.stop()

    say("final status")
    console.print(render_table(final), markup=False)

    effects = fetch_effects(temporal.env["PROVIDER_URL"], run_id=run_id)
    print_effects(effects)

    ran_1, ran_2 = started_steps(first), started_steps(second)
    console.print(f"    worker 1 started: {', '.join(ran_1) or 'nothing'}"
                  + (" (killed inside the last one, before its effect)" if LAST in ran_1 else ""))
    console.print(f"    worker 2 started: {', '.join(ran_2) or 'nothing'}")
    console.print(f"    worker 2 ready -> run completed: {elapsed:.1f} s (includes {pace} s of demo pacing)")

    checks = [
        ("run completed", final["status"] == "completed"),
        (f"run was waiting at step {len(STEP_NAMES)} after the kill", waiting["current_step"] == LAST),
        (f"worker 2 did not run {' or '.join(f'step {n}' for n in range(1, len(STEP_NAMES)))} again",
         not set(STEP_NAMES[:-1]) & set(ran_2)),
        (f"{_COUNTS.get(len(EFFECT_STEPS), str(len(EFFECT_STEPS)))} effects, each applied exactly once",
         len(effects) == len(EFFECT_STEPS) and all(e.effects_applied == 1 for e in effects)),
    ]
    return print_checks(checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Kill a worker mid-run and watch the run resume.")
    parser.add_argument("--pace", default=os.environ.get("LAB_STEP_SECONDS", "1.5"),
                        help="seconds each step waits before working (default 1.5)")
    add_demo_arguments(parser, state_help="where the dev server's and provider's databases go (default .state/)",
                       keep_help="leave the dev server and provider running at the end (Ctrl-C to stop)")
    args = parser.parse_args(argv)

    state: Path = args.state_dir
    state.mkdir(parents=True, exist_ok=True)
    port = pick_port(args.port)
    # LAB_SERVER_CONFIG: the resume waits on two server timers (heartbeat timeout,
    # retry backoff) that a stock dev server fires up to ~1 s late, and each step on
    # a transfer-queue read a stock server rate-limits; see lab/processes.py.
    provider: ProviderProcess | None = None
    codec_server: Proc | None = None
    codec_url = None
    if (os.environ.get("LAB_CODEC_KEY") or "").strip():
        # Payloads are encrypted: the UI sees them through a codec server (docs/deploy.md).
        ui = f"http://127.0.0.1:{port + 1000}"
        codec_server, codec_url = start_codec_server(dict(os.environ), origins=[ui, f"http://localhost:{port + 1000}"])
        say(f"payloads are encrypted (LAB_CODEC_KEY): the UI decrypts them through the codec server at {codec_url}")
    server = DevServer(db_file=state / "temporal.db", port=port, ui_port=port + 1000, headless=False,
                       dynamic_config=LAB_SERVER_CONFIG, ui_codec_endpoint=codec_url)
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        start_server(server, state, port)
        say("starting the provider (stand-in email + ticket APIs; counts effects per idempotency key)")
        provider = start_provider(state / "provider.db")
        provider_url = provider.url
        console.print(f"    provider at {provider_url}, pid {provider.pid}")
        code = asyncio.run(story(server, provider_url, args.pace, run_id, state))
        if not args.keep_server:
            console.print("\n    To browse the run in the Temporal UI, run again with --keep-server "
                          "(.venv/bin/python -m lab.demo --keep-server).")
        else:
            console.print(f"\n    python starter.py status {run_id}   (with TEMPORAL_ADDRESS={server.address})")
            say(f"leaving the dev server up: UI http://127.0.0.1:{port + 1000}/namespaces/default/workflows/{run_id}"
                " (Ctrl-C to stop)")
            hold_server()
        return code
    finally:
        say("stopping what the demo started")
        if provider:
            provider.stop()
        if codec_server:
            codec_server.stop()
        server.stop()


if __name__ == "__main__":
    exit_now(main())
