"""The agent loop's kill-and-resume demo (``make loop-demo``): a model that chooses its tools, killed right
after a refund and resumed, on Temporal and then on the run record.

It starts everything itself, as ``make demo`` does (``lab.demo``): the
Temporal dev server (history in .state/temporal.db, UI on
http://127.0.0.1:8233), the provider (the stand-in order, refund, email and
ticket APIs; the judge of "once", on a store of this demo's own), the model
stand-in (``durable_agents.testing.standin``: the scripted model behind an
OpenAI-compatible API, counting every turn it is asked) and the engines'
processes, through their drivers (``lab.engines``: ``start_loop``,
``resume``, ``loop_status``). Then, on each engine:

1. a loop run whose task names two orders: six turns (a lookup; the refund
   and its email, two calls in one turn; the second lookup; its refund and
   email; the ticket; the final answer);
2. the process running it (a Temporal worker, a ``python -m durable_agents.runrecord loop``)
   armed with ``CRASH_AT=tool:issue_refund:after_effect``: it dies by SIGKILL
   right after the provider applied the first refund, before the call's
   result is recorded;
3. a fresh process resumes the run (a new worker; ``python -m durable_agents.runrecord
   resume``): the recorded turns come back from the record, the model is not
   asked them again, and the refund call runs again under the same key: its
   tool's lookup asks the provider what it holds under the key and takes the
   applied refund's answer, sending nothing again;
4. checks, with the provider's counts and the stand-in's: the kill landed
   between the effect and its record; each effect applied once (2 refunds,
   2 emails, 1 ticket); no recorded turn asked again; the run completed in
   the resumed process, which ran none of the recorded steps again.

Exit code 0 only if every check passes. About 15 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from durable_agents.flowclient.connect import exit_now
from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.steps.controls import printable
from durable_agents.testing.standin import start_model_standin, turns_asked
from lab.demo import add_demo_arguments, console, hold_server, pick_port, print_checks, print_effects, say, start_server
from lab.engines import EngineDriver, LoopStatus, RunRecordDriver, TemporalDriver, started_steps
from lab.processes import LAB_SERVER_CONFIG, BaseProc, DevServer, Proc, wait_until
from lab.provider_process import ProviderProcess, start_provider

POINT = "tool:issue_refund:after_effect"
EMAIL = "ada@example.com"
TURNS = 6  # two orders with something left to refund: lookup, refund+email, lookup, refund+email, ticket, answer
RECORDED_AT_KILL = ["turn-1", "turn-1/call-0", "turn-2"]  # what the record holds when the refund's process dies
KILLED_IN = "turn-2/call-0"
EXPECTED = {"refund": 2, "email": 2, "ticket": 1}


def print_lines(lines: list[str]) -> None:
    for line in lines:
        # Run data: escaped, and not rich markup; one line each, however long the key.
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def turn_lines(status: LoopStatus, indent: str = "    ") -> list[str]:
    """The loop run turn by turn, from the driver's shape: the same lines for every engine."""
    lines = [f"{indent}run {status['run_id']}: {status['status']}"]
    for turn in status["turns"]:
        tries = f" (attempt {turn['attempts']})" if turn["attempts"] > 1 else ""
        asked = ("the final answer" if turn["final"] else
                 f"asked for {', '.join(c['name'] for c in turn['calls'])}" if turn["calls"] else "")
        lines.append(f"{indent}  turn {turn['turn']}: {turn['status']}{tries}" + (f", {asked}" if asked else ""))
        for call in turn["calls"]:
            tries = f", attempt {call['attempts']}" if call["attempts"] > 1 else ""
            outcome = f" -> {call['outcome']}" if call["outcome"] else ""
            key = f"  key {call['key']}" if call["key"] else ""
            lines.append(f"{indent}    call {call['index']} {call['name']}: {call['status']}{tries}{outcome}{key}")
    if status["answer"] is not None:
        lines.append(f"{indent}  answer: {status['answer']}")
    if status["error"]:
        lines.append(f"{indent}  error: {status['error']}")
    return [printable(line) for line in lines]


def turn_ticker(indent: str = "    ") -> Callable[[LoopStatus], None]:
    """Prints a line each time a turn is recorded (with the tools it asked for) or a call's result is."""
    seen: set[str] = set()

    def tick(status: LoopStatus) -> None:
        for turn in status["turns"]:
            if turn["status"] == "completed" and f"turn-{turn['turn']}" not in seen:
                seen.add(f"turn-{turn['turn']}")
                asked = ", ".join(c["name"] for c in turn["calls"]) or "no tool: the final answer"
                print_lines([printable(f"{indent}{time.strftime('%H:%M:%S')} turn {turn['turn']} recorded: {asked}")])
            for call in turn["calls"]:
                name = f"turn-{turn['turn']}/call-{call['index']}"
                if call["status"] == "completed" and name not in seen:
                    seen.add(name)
                    print_lines([printable(f"{indent}{time.strftime('%H:%M:%S')} turn {turn['turn']} call "
                                           f"{call['index']} {call['name']} recorded: {call['outcome']}")])

    return tick


def effect_table(provider_url: str, run_id: str) -> dict[str, list[Any]]:
    """The provider's effects of the run, printed as a table; returned by kind."""
    effects = fetch_effects(provider_url, run_id=run_id)
    print_effects(effects)
    return _by_kind(effects)


async def follow_until_dead(driver: EngineDriver, run_id: str, proc: Proc) -> LoopStatus | None:
    """Print the turns as they are recorded while ``proc`` runs the loop; once it died at its crash point,
    the run's status as its record holds it."""
    tick = turn_ticker()

    async def died() -> bool:
        status = await driver.loop_status(run_id)
        if status is not None:
            tick(status)
        return not proc.alive()

    await wait_until(died, driver.timeout, f"{proc.name} to die at {POINT}", interval=0.05)
    await driver.killed(proc)
    return await driver.loop_status(run_id)


@dataclass(frozen=True)
class Words:
    """How the story names one engine's parts."""

    engine: str  # in the PASS lines
    first: str  # the process killed
    first_is: str  # ... and what it is
    second: str  # the process that resumes
    second_is: str
    record: str  # what holds the run
    reads: str  # how the second process learns what was done
    wait: str = ""  # what the resume waits for first, if anything


async def story(driver: EngineDriver, words: Words, *, run_id: str, task: str, orders: dict[str, int],
                standin_url: str) -> list[tuple[str, bool]]:
    """One engine's part: the run, the kill right after the refund, the resume, the checks."""
    w = words
    provider_url = driver.env["PROVIDER_URL"]
    seed_orders(provider_url, orders)
    say(f"the provider keeps orders {' and '.join(f'{o} ({c / 100:.2f} EUR)' for o, c in orders.items())}")
    say(f"starting {w.first_is}, armed to die right after the provider applies the first refund "
        f"(CRASH_AT={POINT})")
    proc = await driver.start_loop(run_id, task, EMAIL, crash_at=POINT, max_turns=10)
    console.print(f"    {w.first} is pid {proc.pid}")
    say(f'loop run {run_id}: "{escape(printable(task))}" -> {EMAIL}')
    at_kill = await follow_until_dead(driver, run_id, proc)
    assert at_kill is not None, f"{w.engine} holds no run {run_id}"
    effects_at_kill = {kind: len(found) for kind, found in
                       _by_kind(fetch_effects(provider_url, run_id=run_id)).items()}
    killed_call = next((c for t in at_kill["turns"] for c in t["calls"]
                        if f"turn-{t['turn']}/call-{c['index']}" == KILLED_IN), None)
    say(f"the provider applied the refund and {w.first} died by SIGKILL before the call's result was recorded. "
        f"With nothing running it, {w.record} says:")
    print_lines(turn_lines(at_kill))

    say(f"starting {w.second_is}: {w.reads} (turns 1 and 2 and the lookup come back from it: the model is not "
        "asked them again), then runs the refund call again under the same key: its tool's lookup asks the "
        "provider what it holds under that key, finds the refund applied and takes its stored answer")
    started_at = time.monotonic()
    settled = await driver.resume(run_id)
    elapsed = time.monotonic() - started_at
    final = await driver.loop_status(run_id)
    assert final is not None
    say("the run, turn by turn, at the end")
    print_lines(turn_lines(final))
    by_kind = effect_table(provider_url, run_id)
    counts = turns_asked(standin_url, run_id)
    console.print(f"    the model stand-in was asked, by turn: "
                  f"{', '.join(f'turn {t}: {n}' for t, n in counts.items()) or 'nothing'}")
    refunds = sorted(by_kind.get("refund", []), key=lambda e: e.first_seen)
    if refunds:
        console.print(f"    the refund whose result died with {w.first} was sent {_times(refunds[0].requests)} "
                      f"under its key and applied {_times(refunds[0].effects_applied)}: its retry asked the "
                      "provider by the key first (had nothing been applied, it would have been sent again under "
                      "the same key, and the provider applies one request per key)", soft_wrap=True)
    ran_1, ran_2 = started_steps(proc), started_steps(settled.proc)
    console.print(f"    {w.first} started: {', '.join(ran_1) or 'nothing'} (killed inside the last one, after its "
                  "effect)", soft_wrap=True)
    console.print(f"    {w.second} started: {', '.join(ran_2) or 'nothing'}", soft_wrap=True)
    console.print(f"    {w.second} started -> run completed: {elapsed:.1f} s{w.wait}", soft_wrap=True)
    engine, second = w.engine, w.second
    return [
        (f"{engine}: the kill landed between the refund and its record (1 refund applied, its call not recorded)",
         effects_at_kill == {"refund": 1} and killed_call is not None and killed_call["status"] != "completed"),
        (f"{engine}: each effect applied once at the provider (2 refunds, 2 emails, 1 ticket)",
         {kind: len(found) for kind, found in by_kind.items()} == EXPECTED
         and all(e.effects_applied == 1 for found in by_kind.values() for e in found)),
        (f"{engine}: no recorded turn asked again (the stand-in was asked each of the {TURNS} turns once)",
         counts == {str(n): 1 for n in range(1, TURNS + 1)}),
        (f"{engine}: the run completed in {second}, which ran no recorded step again",
         final["status"] == "completed" and settled.completed and bool(ran_2)
         and not set(RECORDED_AT_KILL) & set(ran_2) and ran_2[0] == KILLED_IN),
    ]


TEMPORAL_WORDS = Words(
    engine="Temporal", first="worker 1", first_is="worker 1 (python worker.py)", second="worker 2",
    second_is="worker 2", record="Temporal's history", reads="it replays the history",
    wait=" (Temporal first waits out the dead worker's heartbeat timeout, 3 s)")
RECORD_WORDS = Words(
    engine="run record", first="process 1", first_is="process 1 (python -m durable_agents.runrecord loop)",
    second="process 2", second_is="process 2 (python -m durable_agents.runrecord resume)", record="the run record",
    reads="it reads the record")


def _times(n: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(n, f"{n} times")


def _by_kind(effects: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for e in effects:
        out.setdefault(e.kind, []).append(e)
    return out


async def both(server: DevServer, provider_url: str, standin_url: str, state: Path, stamp: str) -> int:
    env = {"PROVIDER_URL": provider_url, "LLM_BASE_URL": standin_url, "LLM_MODEL": "scripted",
           "MEMORY_DB": str(state / "memory.db"), "RUNRECORD_DB": str(state / "runrecord.db")}
    checks: list[tuple[str, bool]] = []
    console.print("\n[bold]On Temporal[/]: each turn and each tool call an activity; a turn's completion in the "
                  "history is its record, written before any of its calls is scheduled", soft_wrap=True)
    with TemporalDriver(server, env, queue="agent-loop-demo") as temporal:
        checks += await story(temporal, TEMPORAL_WORDS, run_id=f"loop-demo-{stamp}-temporal",
                              task="Order A-1001 arrived broken and so did A-1002: please refund both.",
                              orders={"A-1001": 2500, "A-1002": 4000}, standin_url=standin_url)
    console.print("\n[bold]On the run record[/]: a turn and the rows of its calls in one commit, before any call "
                  "runs; each effect's intent before its request", soft_wrap=True)
    with RunRecordDriver(env) as record:
        checks += await story(record, RECORD_WORDS, run_id=f"loop-demo-{stamp}-runrecord",
                              task="Order B-2001 arrived broken and so did B-2002: please refund both.",
                              orders={"B-2001": 1800, "B-2002": 3200}, standin_url=standin_url)
    console.print()
    return print_checks(checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The agent loop killed right after a refund and resumed, on Temporal and on the run record.")
    add_demo_arguments(
        parser, state_help="where the dev server's history and the run record go (default .state/)",
        keep_help="leave the dev server up at the end, to browse the run in the UI (Ctrl-C to stop)")
    args = parser.parse_args(argv)

    state: Path = args.state_dir
    state.mkdir(parents=True, exist_ok=True)
    port = pick_port(args.port)
    server = DevServer(db_file=state / "temporal.db", port=port, ui_port=port + 1000, headless=False,
                       dynamic_config=LAB_SERVER_CONFIG)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    provider: ProviderProcess | None = None
    standin: BaseProc | None = None
    # The provider's store is this demo's own: the orders it keeps are refunded by the runs, and a demo run again
    # starts with them whole.
    scratch = tempfile.TemporaryDirectory(prefix="loop-demo-provider-")
    try:
        start_server(server, state, port)
        say("starting the provider (stand-in order, refund, email and ticket APIs; counts effects per "
            "idempotency key)")
        provider = start_provider(Path(scratch.name) / "provider.db")
        console.print(f"    provider at {provider.url}, pid {provider.pid}")
        say("starting the model stand-in (the scripted model behind an OpenAI-compatible API; counts every turn "
            "it is asked, by run)")
        standin, standin_url = start_model_standin()
        console.print(f"    model stand-in at {standin_url}, pid {standin.pid}")
        code = asyncio.run(both(server, provider.url, standin_url, state, stamp))
        if args.keep_server:
            console.print(f"\n    python starter.py status loop-demo-{stamp}-temporal   "
                          f"(with TEMPORAL_ADDRESS={server.address})")
            say(f"leaving the dev server up: UI http://127.0.0.1:{port + 1000}/namespaces/default/workflows/"
                f"loop-demo-{stamp}-temporal (its details say the turn it is at; Ctrl-C to stop)")
            hold_server()
        else:
            console.print("\n    To browse the Temporal run in the UI (its details say the turn it is at), run again "
                          "with --keep-server (.venv/bin/python -m lab.loop_demo --keep-server).", soft_wrap=True)
        return code
    finally:
        say("stopping what the demo started")
        if standin is not None:
            standin.stop()
        if provider is not None:
            provider.stop()
        server.stop()
        scratch.cleanup()


if __name__ == "__main__":
    os.environ.pop("CRASH_AT", None)  # the demo arms its own processes; one inherited would arm the rest
    exit_now(main())
