"""Starts, attaches to and inspects runs of the agent flow.

    python starter.py start RUN_ID "TASK" --email ADDR [--conversation ID] [--wait] [--json]
    python starter.py loop RUN_ID "TASK" --email ADDR [--max-turns N] [--window-tokens N] [--window-messages N]
                      [--history-bound N] [--orders ORDER=CENTS ...] [--no-wait] [--json]
    python starter.py loop RUN_ID "TASK" --agent MODULE:ATTR [--param NAME=VALUE ...] [...]
    python starter.py status RUN_ID [--json] [--live]
    python starter.py watch RUN_ID
    python starter.py retry RUN_ID [--wait] [--json]
    python starter.py settle RUN_ID [--json]
    (every command also takes --verbose)

RUN_ID is yours to choose and is the run's identity for ever: it is the
Temporal workflow id and the root of the idempotency keys. Starting an
existing RUN_ID attaches to that run and never creates a second one.

``loop`` starts a run of the agent loop (``durable_agents.workflows.agent_loop``: the model
chooses its tools turn after turn, each turn recorded before any of its calls
runs, each effect applied once under a key from the run, the turn and the
call), or attaches to RUN_ID if it exists, as ``start`` does. ``--orders``
first has the provider (``PROVIDER_URL``) keep the orders the task names, so
the model has something to look up and refund. It then follows the run, a
line each time a turn or a call changes, to its end (``--no-wait``: it
returns once the run is started). ``status`` and ``watch`` recognise a loop
run by its workflow type (``AgentLoop``) and show every turn of its chain:
the calls each asked for with their keys, status and results, the final
answer, and the Temporal runs of the chain (one more at each continue-as-new;
the run id and the keys stay). ``--json`` is ``durable_agents.flowclient.loop.loop_status``'s
dict, the shape docs/commands.md shows.

``status`` reads Temporal's record (history plus pending activities), so it
works while no worker is running. ``--live`` asks the workflow itself instead
(a query; needs a worker). The words it uses are ``durable_agents.steps.runstate``'s. Exit
codes: 0 completed or running, 1 failed, 2 bad input or not found (or a retry
refused), 3 parked.

``retry`` restarts a failed or timed-out run at the step that failed: a
Temporal reset to the workflow task that first scheduled that step, so the
completed steps are not run again and the step gets a fresh retry budget.
The run id, and so every idempotency key, stays the same: what was applied
is replayed or adopted, never applied twice. ``settle`` asks the provider, by
key, whether each effect step's effect was applied: how a step left in doubt
is settled. It reports the answer and what to do next, from the run's state
(``durable_agents.steps.settle.settle_advice``): nothing for a completed run, follow an open
one, for a failed one what ``retry`` meets under each key or why ``retry``
refuses the run. It cannot record the answer, since Temporal's history is
written only by the run, so ``status`` still shows a step in doubt as
``in_doubt`` (the run record's ``settle`` records it).

In a terminal, ``start --wait`` and ``watch`` show the steps ticking through
in a live table (rich); piped or with ``--json`` they print plain lines, the
same in a log as on screen. Every human-readable output ends with a link to
the run in the Temporal UI: ``TEMPORAL_UI_URL`` if set, Temporal Cloud's UI
for a ``*.tmprl.cloud`` address, else the dev server's http://localhost:8233.

Run data never reaches the terminal raw: every table, ticker line and error
shows control and bidirectional characters escaped (``durable_agents.steps.controls``), the
rich table's cells are escaped for its markup too, and ``--json`` is plain
``json.dumps`` (exact, escaped by JSON itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from temporalio.client import Client

from durable_agents.flowclient.connect import connect, connect_config, exit_now, flush_tracing, task_queue
from durable_agents.flowclient.logs import basic_config
from durable_agents.flowclient.loop import (
    DEFAULT_HISTORY_BOUND,
    MAX_HISTORY_BOUND,
    MIN_HISTORY_BOUND,
    is_loop_run,
    loop_lines,
    loop_retry_refusal,
    loop_status,
    loop_ticker,
    restart_failed_loop,
    start_loop,
    wait_for_loop,
)
from durable_agents.flowclient.runs import (
    NoWorker,
    RestartRefused,
    live_status,
    restart_failed_run,
    retry_refusal,
    start_run,
    wait_for_close,
)
from durable_agents.flowclient.status import TemporalRunNotFound, run_status
from durable_agents.providerclient import seed_given
from durable_agents.steps import loop
from durable_agents.steps.controls import printable
from durable_agents.steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
from durable_agents.steps.loopargs import (
    add_decision_commands,
    add_loop_arguments,
    agent_given,
    given_number,
    loop_numbers,
    orders_given,
    run_params,
    settled_agent,
)
from durable_agents.steps.refund_agent import REFUND_AGENT
from durable_agents.steps.runstate import (
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NO_WORKER,
    EXIT_PIPE_CLOSED,
    RunEntry,
    exit_code,
)
from durable_agents.steps.runview import render_table, rich_table, step_ticker

DEV_SERVER_UI = "http://localhost:8233"
CLOUD_UI = "https://cloud.temporal.io"


def ui_url(run_id: str, env=None) -> str:
    """The run's page in the Temporal UI (see the module docstring for the base URL)."""
    env = os.environ if env is None else env
    config = connect_config(env)
    base = (env.get("TEMPORAL_UI_URL") or "").strip().rstrip("/")
    if not base:
        host = config["target_host"].rsplit(":", 1)[0]
        base = CLOUD_UI if host.endswith(".tmprl.cloud") else DEV_SERVER_UI
    namespace = config.get("namespace") or "default"
    return f"{base}/namespaces/{quote(namespace, safe='')}/workflows/{quote(run_id, safe='')}"


def _print_status(status: RunEntry, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, indent=2), flush=True)
    else:
        print(render_table(status), flush=True)
        print(f"  ui: {ui_url(status['run_id'])}", flush=True)


def _interactive(args) -> bool:
    return not getattr(args, "json", False) and sys.stdout.isatty()


async def follow_live(client: Client, run_id: str) -> RunEntry:
    """Follow the run in a live rich table until it closes."""
    from rich.console import Console
    from rich.live import Live

    first = await run_status(client, run_id)
    caption = ui_url(run_id)
    with Live(rich_table(first, caption), console=Console(), refresh_per_second=8, transient=False) as live:
        return await wait_for_close(client, run_id, lambda s: live.update(rich_table(s, caption)))


def _exit_code(status: RunEntry) -> int:
    return exit_code(status)


async def _cmd_start(args) -> int:
    run_id = check_run_id(args.run_id)
    task = check_task(args.task)
    email = check_email(args.email)
    conversation = check_conversation_id(args.conversation) if args.conversation else None
    client = await connect()
    _, existing = await start_run(client, run_id, task, email, conversation)
    if existing is not None and await is_loop_run(client, run_id):
        raise InputError(f"run {run_id} exists and is a run of the agent loop, not of the flow: "
                         f"`python starter.py status {run_id}` shows it; pick a new RUN_ID for a run of the flow")
    if existing is None:  # created now
        if not args.json:
            print(f"started run {run_id} on task queue {task_queue()!r}", flush=True)
    else:
        print(
            f"run {run_id} already exists ({existing['status']}); attached to it. "
            "The task and email given now were not used; pick a new RUN_ID for a new run.",
            file=sys.stderr, flush=True,
        )
    if not args.wait:
        if args.json:
            _print_status(await run_status(client, run_id), True)
        else:
            print(f"  ui: {ui_url(run_id)}", flush=True)
        return 0
    if _interactive(args):
        print(f"  ui: {ui_url(run_id)}", flush=True)
        final = await follow_live(client, run_id)
        return _exit_code(final)
    final = await wait_for_close(client, run_id, None if args.json else step_ticker())
    _print_status(final, args.json)
    return _exit_code(final)


def _loop_exit(status: Mapping[str, Any]) -> int:
    """A loop run's exit code, as a flow run's (``durable_agents.steps.runstate.exit_code``): 1 failed, 3 parked,
    else 0."""
    return exit_code(status)


def _print_loop(status: Mapping[str, Any], as_json: bool) -> None:
    """A loop run's status: its JSON (``durable_agents.flowclient.loop.loop_status``'s dict), or turn by turn and
    its UI link."""
    if as_json:
        print(json.dumps(status, indent=2), flush=True)
        return
    print("\n".join(loop_lines(status)), flush=True)
    print(f"  ui: {ui_url(status['run_id'])}", flush=True)


async def _cmd_loop(args) -> int:
    run_id = check_run_id(args.run_id)
    task = check_task(args.task)
    agent = agent_given(args.agent)
    email, params = run_params(args, agent)
    # Every number checked, and the orders read, before anything is asked of a server: bad input starts nothing.
    max_turns, window_tokens, window_messages = loop_numbers(args, agent=agent)
    bound = given_number(args.history_bound, DEFAULT_HISTORY_BOUND)
    if not isinstance(bound, int) or not MIN_HISTORY_BOUND <= bound <= MAX_HISTORY_BOUND:
        raise InputError(f"history bound must be a whole number of events from {MIN_HISTORY_BOUND} to "
                         f"{MAX_HISTORY_BOUND}, got {bound!r}")
    orders = orders_given(args.orders)
    client = await connect()
    if orders:
        seed_given(orders)
        if not args.json:
            print(printable(f"the provider keeps order(s) {', '.join(f'{o} ({c} cents)' for o, c in orders.items())}"),
                  flush=True)
    created, existing = await start_loop(client, run_id, task, email, max_turns=max_turns,
                                         window_tokens=window_tokens, window_messages=window_messages,
                                         history_bound=bound, agent=agent, params=params,
                                         agent_spec=args.agent or "")
    if created:
        if not args.json:
            of = "" if agent.name == REFUND_AGENT.name else f" of agent {agent.name}"
            print(f"started loop run {run_id}{of} on task queue {task_queue()!r}: at most {max_turns} turns",
                  flush=True)
    else:
        assert existing is not None
        print(f"run {run_id} already exists ({existing['status']}); attached to it. The task, email, parameters and "
              "numbers given now were not used; pick a new RUN_ID for a new run.", file=sys.stderr, flush=True)
    if args.no_wait:
        if args.json:
            _print_loop(existing or await loop_status(client, run_id), True)
        else:
            print(f"  ui: {ui_url(run_id)}", flush=True)
        return 0
    if not args.json:
        print(f"  ui: {ui_url(run_id)}", flush=True)
    final = await wait_for_loop(client, run_id, None if args.json else loop_ticker("    "))
    _print_loop(final, args.json)
    return _loop_exit(final)


async def _cmd_status(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
    if await is_loop_run(client, run_id):
        # --live: the workflow's own answer (the progress query, its newest turns); else every turn, from history.
        found: Mapping[str, Any] = await (live_status(client, run_id) if args.live else loop_status(client, run_id))
        _print_loop(found, args.json)
        return _loop_exit(found)
    if args.live:
        status = await live_status(client, run_id)
    else:
        status = await run_status(client, run_id)
    _print_status(status, args.json)
    return _exit_code(status)


async def _cmd_watch(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
    if await is_loop_run(client, run_id):
        ended = await wait_for_loop(client, run_id, None if args.json else loop_ticker())
        _print_loop(ended, args.json)
        return _loop_exit(ended)
    if _interactive(args):
        final = await follow_live(client, run_id)
        return _exit_code(final)
    if args.json:
        final = await wait_for_close(client, run_id)
        _print_status(final, True)
        return _exit_code(final)
    final = await wait_for_close(client, run_id, lambda s: print(render_table(s), "\n", flush=True))
    print(f"  ui: {ui_url(run_id)}", flush=True)
    return _exit_code(final)


async def _cmd_decide(args) -> int:
    """``approve``/``deny RUN_ID CALL``: a person's decision on a loop run's waiting call
    (``durable_agents.flowclient.approvals``). Refused: exit 2, nothing recorded."""
    from durable_agents.flowclient.approvals import decide_loop

    run_id = check_run_id(args.run_id)
    client = await connect()
    outcome, said = await decide_loop(client, run_id, args.call, args.verdict, by=args.by, reason=args.reason,
                                      digest=args.digest, accept_seconds=float(args.accept_seconds))
    print(printable({"decided": f"decided: {said}", "same": said, "kept": f"kept: {said}"}[outcome]), flush=True)
    return 0


async def _cmd_retry(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
    try:
        loop_run = await is_loop_run(client, run_id)
        step, point, new_run = await (restart_failed_loop if loop_run else restart_failed_run)(client, run_id)
    except RestartRefused as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return EXIT_INPUT
    if not args.json:
        print(f"retrying run {run_id} at step {step}: reset to event {point}, Temporal run {new_run}; "
              "completed steps are not run again, the keys are the same", flush=True)
    if loop_run:
        if not args.wait:
            if args.json:
                _print_loop(await loop_status(client, run_id), True)
            return 0
        ended = await wait_for_loop(client, run_id, None if args.json else loop_ticker())
        _print_loop(ended, args.json)
        return _loop_exit(ended)
    if not args.wait:
        if args.json:
            _print_status(await run_status(client, run_id), True)
        return 0
    final = await wait_for_close(client, run_id, None if args.json else step_ticker())
    _print_status(final, args.json)
    return _exit_code(final)


async def _cmd_settle(args) -> int:
    from durable_agents.providerclient import ProviderClient, provider_url_from_env
    from durable_agents.steps.settle import render_settle, settle, settle_advice
    from durable_agents.wiring.settle import settle_loop_calls

    run_id = check_run_id(args.run_id)
    client = await connect()
    calls = None
    if await is_loop_run(client, run_id):
        found: Mapping[str, Any] = await loop_status(client, run_id)
        agent = settled_agent(args.agent or found["agent_spec"], found["agent"],
                              f"python starter.py settle {run_id} --agent MODULE:ATTR")
        # A loop's calls are keyed by their recorded turns (durable_agents.steps.loop.tool_key), not by step names; each
        # is asked through its tool's own lookup.
        calls = {f"turn-{turn['turn']}/call-{call['index']}": (call["name"], call["key"])
                 for turn in found["turns"] for call in turn["calls"] if call["key"]}
        in_doubt = [f"turn-{turn['turn']}/call-{call['index']}" for turn in found["turns"] for call in turn["calls"]
                    if call["status"] == "in_doubt"]
        refused = loop_retry_refusal(run_id, found["status"], found.get("error"))
    else:
        found = await run_status(client, run_id)
        in_doubt = [step["name"] for step in found["steps"] if step["status"] == "in_doubt"]
        refused = retry_refusal(run_id, found["status"], found.get("error"))
    if calls is not None:
        report = await settle_loop_calls(calls, agent)
    else:
        async with ProviderClient(provider_url_from_env(os.environ)) as provider:
            report = await settle(provider, run_id)
    # What to do next follows from the run's state: no retry for a run that retry refuses (a completed one).
    retry = f"python starter.py retry {run_id}"
    offer, advice = settle_advice(run_id, found["status"], retry=retry, refused=refused, in_doubt=in_doubt,
                                  follow=f"python starter.py watch {run_id}",
                                  status=f"python starter.py status {run_id}")
    if in_doubt:
        advice += (f" Temporal's history cannot record these answers (no one writes to a run's history from "
                   f"outside it): `python starter.py status {run_id}` still shows {', '.join(in_doubt)} in_doubt.")
    print(json.dumps({"run_id": run_id, "steps": report, "run_status": found["status"], "in_doubt": in_doubt,
                      "advice": advice}, indent=2) if args.json else
          render_settle(run_id, report, retry=retry if offer else None, footer=advice), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                        help="log the SDK's and the lab's debug messages to stderr")
    parser = argparse.ArgumentParser(prog="starter.py", description="Start and inspect agent-flow runs.",
                                     parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="start a run, or attach to an existing RUN_ID", parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("task", metavar="TASK")
    p.add_argument("--email", required=True, help="where the confirmation email goes")
    p.add_argument("--conversation", default=None, help="conversation id for memory (default: RUN_ID)")
    p.add_argument("--wait", action="store_true", help="follow the run until it completes or fails")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_start)
    p = sub.add_parser(
        "loop", parents=[common],
        help="start a run of the agent loop (the model chooses its tools turn by turn), or attach to RUN_ID",
        description="Start a run of the agent loop on Temporal, or attach to RUN_ID if it exists, and follow it "
                    "to its end. Each turn the model is asked, on a window of the conversation derived from the "
                    f"record, and chooses tools ({', '.join(loop.TOOL_NAMES)}); the turn is recorded before any of "
                    "its calls runs, and each call's effect is applied once, under a key from the run, the turn "
                    "and the call. The model is the worker's (LLM_BASE_URL; the scripted offline model by default).")
    add_loop_arguments(p)
    p.add_argument("--history-bound", default=None, metavar="N",
                   help=f"events, {MIN_HISTORY_BOUND}-{MAX_HISTORY_BOUND} (default {DEFAULT_HISTORY_BOUND}): past "
                        "this many in a run's history, between turns, the run continues as new")
    p.add_argument("--no-wait", action="store_true", help="return once the run is started (or attached to)")
    p.add_argument("--json", action="store_true", help="print only the run's status as JSON, at the end")
    p.set_defaults(func=_cmd_loop)
    p = sub.add_parser("status", help="show a run's steps, attempts and results", parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true")
    p.add_argument("--live", action="store_true", help="ask the workflow (a query; needs a worker)")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("watch", help="print the run's table each time it changes, until it ends",
                       parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true", help="print the final status as JSON (no live table)")
    p.set_defaults(func=_cmd_watch)
    add_decision_commands(sub, [common], _cmd_decide, accept_seconds=True)
    p = sub.add_parser("retry", help="restart a failed or timed-out run at its failed step (a reset; same keys)",
                       parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--wait", action="store_true", help="follow the run until it completes or fails")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_retry)
    p = sub.add_parser("settle", help="ask, by key, whether each effect of the run was applied (the provider; a loop "
                                      "call's own service, through its tool's lookup)",
                       parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--agent", default=None, metavar="MODULE:ATTR",
                   help="a loop run's agent by import string, whose tools' lookups ask their services (default: "
                        "the one `starter.py loop --agent` recorded, else the lab's refund agent)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_settle)
    args = parser.parse_args(argv)
    basic_config(logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING)
    try:
        return asyncio.run(args.func(args))
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    # Bad input, unknown run, unreachable server, bad configuration (e.g. LAB_CODEC_KEY;
    # InputError is a ValueError too).
    except (TemporalRunNotFound, ConnectionError, ValueError) as err:
        return _error(args, str(err), EXIT_INPUT)
    except NoWorker as err:
        return _error(args, str(err), EXIT_NO_WORKER)
    except KeyboardInterrupt:
        # Ctrl-C stops this command, not the run: Temporal keeps it going.
        run_id = getattr(args, "run_id", None)
        print("\ninterrupted: the run goes on in Temporal"
              + (f"; `python starter.py watch {printable(run_id)}` follows it again" if run_id else ""),
              file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        flush_tracing()


def _error(args, message: str, code: int) -> int:
    """An error, as the output format asks: JSON on stdout with --json, else a line on stderr."""
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "exit_code": code}), flush=True)
    else:
        print(printable(f"error: {message}"), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    exit_now(main())
