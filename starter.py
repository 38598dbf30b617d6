"""Starts, attaches to and inspects runs of the agent flow.

    python starter.py start RUN_ID "TASK" --email ADDR [--conversation ID] [--wait] [--json]
    python starter.py status RUN_ID [--json] [--live]
    python starter.py watch RUN_ID
    python starter.py retry RUN_ID [--wait] [--json]
    python starter.py settle RUN_ID [--json]
    (every command also takes --verbose)

RUN_ID is yours to choose and is the run's identity for ever: it is the
Temporal workflow id and the root of the idempotency keys. Starting an
existing RUN_ID attaches to that run and never creates a second one.

``status`` reads Temporal's record (history plus pending activities), so it
works while no worker is running. ``--live`` asks the workflow itself instead
(a query; needs a worker). The words it uses are ``steps.runstate``'s. Exit
codes: 0 completed or running, 1 failed, 2 bad input or not found (or a retry
refused), 3 parked.

``retry`` restarts a failed or timed-out run at the step that failed: a
Temporal reset to the workflow task that first scheduled that step, so the
completed steps are not run again and the step gets a fresh retry budget.
The run id, and so every idempotency key, stays the same: what was applied
is replayed or adopted, never applied twice. ``settle`` asks the provider, by
key, whether each effect step's effect was applied: how a step left in doubt
is settled. It reports the answer and what a retry meets; it cannot record
it, since Temporal's history is written only by the run, so ``status`` still
shows the step in doubt (the run record's ``settle`` records it).

In a terminal, ``start --wait`` and ``watch`` show the steps ticking through
in a live table (rich); piped or with ``--json`` they print plain lines, the
same in a log as on screen. Every human-readable output ends with a link to
the run in the Temporal UI: ``TEMPORAL_UI_URL`` if set, Temporal Cloud's UI
for a ``*.tmprl.cloud`` address, else the dev server's http://localhost:8233.

Run data never reaches the terminal raw: every table, ticker line and error
shows control and bidirectional characters escaped (``steps.controls``), the
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
from urllib.parse import quote

from temporalio.client import Client

from flowclient.connect import connect, connect_config, exit_now, flush_tracing, task_queue
from flowclient.logs import basic_config
from flowclient.runs import NoWorker, RestartRefused, live_status, restart_failed_run, start_run, wait_for_close
from flowclient.status import TemporalRunNotFound, run_status
from steps.controls import printable
from steps.limits import check_conversation_id, check_email, check_run_id, check_task
from steps.runstate import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_NO_WORKER, EXIT_PIPE_CLOSED, RunEntry, exit_code
from steps.runview import render_table, rich_table, step_ticker

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


async def _cmd_status(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
    if args.live:
        status = await live_status(client, run_id)
    else:
        status = await run_status(client, run_id)
    _print_status(status, args.json)
    return _exit_code(status)


async def _cmd_watch(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
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


async def _cmd_retry(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
    try:
        step, point, new_run = await restart_failed_run(client, run_id)
    except RestartRefused as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return EXIT_INPUT
    if not args.json:
        print(f"retrying run {run_id} at step {step}: reset to event {point}, Temporal run {new_run}; "
              "completed steps are not run again, the keys are the same", flush=True)
    if not args.wait:
        if args.json:
            _print_status(await run_status(client, run_id), True)
        return 0
    final = await wait_for_close(client, run_id, None if args.json else step_ticker())
    _print_status(final, args.json)
    return _exit_code(final)


async def _cmd_settle(args) -> int:
    from providerclient import ProviderClient, provider_url_from_env
    from steps.settle import render_settle, settle

    run_id = check_run_id(args.run_id)
    async with ProviderClient(provider_url_from_env(os.environ)) as provider:
        report = await settle(provider, run_id)
    footer = (f"Temporal's history cannot record these answers (no one writes to a run's history from outside "
              f"it): `python starter.py status {run_id}` still shows a step left in doubt as in_doubt.")
    print(json.dumps({"run_id": run_id, "steps": report}, indent=2) if args.json else
          render_settle(run_id, report, retry=f"python starter.py retry {run_id}", footer=footer), flush=True)
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
    p = sub.add_parser("retry", help="restart a failed or timed-out run at its failed step (a reset; same keys)",
                       parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--wait", action="store_true", help="follow the run until it completes or fails")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_retry)
    p = sub.add_parser("settle", help="ask the provider, by key, whether each effect of the run was applied",
                       parents=[common])
    p.add_argument("run_id", metavar="RUN_ID")
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
