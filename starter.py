"""Starts, attaches to and inspects runs of the agent flow.

    python starter.py start RUN_ID "TASK" --email ADDR [--conversation ID] [--wait] [--json]
    python starter.py status RUN_ID [--json] [--live]
    python starter.py watch RUN_ID
    (every command also takes --verbose)

RUN_ID is yours to choose and is the run's identity for ever: it is the
Temporal workflow id and the root of the idempotency keys. Starting an
existing RUN_ID attaches to that run and never creates a second one.

``status`` reads Temporal's record (history plus pending activities), so it
works while no worker is running. ``--live`` asks the workflow itself instead
(a query; needs a worker). Exit codes: 0 completed or running, 1 failed,
2 bad input or not found.

In a terminal, ``start --wait`` and ``watch`` show the steps ticking through
in a live table (rich); piped or with ``--json`` they print plain lines, the
same in a log as on screen. Every human-readable output ends with a link to
the run in the Temporal UI: ``TEMPORAL_UI_URL`` if set, Temporal Cloud's UI
for a ``*.tmprl.cloud`` address, else the dev server's http://localhost:8233.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from datetime import timedelta
from urllib.parse import quote

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from flowclient.connect import connect, connect_config, exit_now, flush_tracing, task_queue
from flowclient.status import RunNotFound, run_status
from steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
from workflows.agent_flow import WORKFLOW_NAME, FlowInput

# A worker that dies mid workflow task is noticed after this, not the 10 s default.
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)
# Backstop: a run that is still open after this is closed as timed out.
DEFAULT_EXECUTION_TIMEOUT = timedelta(hours=1)


def execution_timeout() -> timedelta:
    raw = os.environ.get("RUN_TIMEOUT_SECONDS")
    if not raw:
        return DEFAULT_EXECUTION_TIMEOUT
    try:
        seconds = float(raw)
        if seconds <= 0:
            raise ValueError
    except ValueError:
        raise InputError(f"RUN_TIMEOUT_SECONDS={raw!r} must be a positive number of seconds")
    return timedelta(seconds=seconds)


async def start_run(
    client: Client, run_id: str, task: str, email: str, conversation_id: str | None = None,
    queue: str | None = None, timeouts: str = "tuned",
) -> tuple[bool, dict | None]:
    """Start the run, or attach to the existing one. Returns (created, existing status).

    The server decides, atomically: REJECT_DUPLICATE refuses an id whose run has
    closed, FAIL refuses one whose run is open. Either refusal means "attach".
    """
    try:
        await client.start_workflow(
            WORKFLOW_NAME,
            FlowInput(run_id=run_id, task=task, email=email,
                      conversation_id=conversation_id or run_id, timeouts=timeouts),
            id=run_id,
            task_queue=queue or task_queue(),
            # "defaults" exists for bench/bench_resume.py: Temporal's 10 s task timeout.
            task_timeout=WORKFLOW_TASK_TIMEOUT if timeouts == "tuned" else timedelta(seconds=10),
            execution_timeout=execution_timeout(),
            # One run per RUN_ID, ever: the idempotency keys derive from it.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        return False, await run_status(client, run_id)
    return True, None


async def wait_for_status(client: Client, run_id: str, until, on_change=None, poll: float = 0.25,
                          timeout: float | None = None) -> dict:
    """Poll the run's status until ``until(status)``; ``on_change`` sees each new status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        status = await run_status(client, run_id)
        if on_change and status != last:
            on_change(status)
        last = status
        if until(status):
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} did not get there in {timeout:.0f} s; last status: {status}")
        await asyncio.sleep(poll)


async def wait_for_close(client: Client, run_id: str, on_change=None, poll: float = 0.25) -> dict:
    return await wait_for_status(client, run_id, lambda s: s["status"] != "running", on_change, poll)


def step_ticker(indent: str = "  "):
    """An ``on_change`` callback that prints one line each time a step changes status."""
    seen: dict[str, str] = {}

    def tick(status: dict) -> None:
        for step in status["steps"]:
            if seen.get(step["name"]) != step["status"]:
                seen[step["name"]] = step["status"]
                if step["status"] != "pending":
                    print(f"{indent}{time.strftime('%H:%M:%S')} {step['name']}: {step['status']}"
                          f" (attempt {step['attempts']})", flush=True)

    return tick


async def live_status(client: Client, run_id: str) -> dict:
    return await client.get_workflow_handle(run_id).query("progress", rpc_timeout=timedelta(seconds=5))


def render_table(status: dict) -> str:
    """A readable table, plain text so it is the same in a terminal and a log."""
    lines = [f"run {status['run_id']}: {status['status']}"
             + (f", current step {status['current_step']}" if status["current_step"] else "")]
    lines.append(f"  {'#':<2} {'step':<18} {'status':<10} {'attempts':>8}  result")
    for i, step in enumerate(status["steps"], 1):
        result = step["result"]
        shown = "" if result is None else _short(result)
        lines.append(f"  {i:<2} {step['name']:<18} {step['status']:<10} {step['attempts']:>8}  {shown}")
    if status.get("error"):
        lines.append(f"  error: {status['error']}")
    return "\n".join(lines)


def _short(result: dict) -> str:
    keys = ("message_id", "ticket_id", "subject")
    parts = [f"{k}={result[k]}" for k in keys if k in result]
    if result.get("replayed"):
        parts.append("replayed")
    text = ", ".join(parts) or json.dumps(result)
    return text if len(text) <= 70 else text[:67] + "..."


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


def _print_status(status: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, indent=2), flush=True)
    else:
        print(render_table(status), flush=True)
        print(f"  ui: {ui_url(status['run_id'])}", flush=True)


def _interactive(args) -> bool:
    return not getattr(args, "json", False) and sys.stdout.isatty()


_STEP_STYLE = {"pending": "dim", "running": "bold yellow", "completed": "green", "failed": "bold red"}


def rich_table(status: dict):
    """The same table as ``render_table``, for a terminal: rich, updated in place."""
    from rich.table import Table

    title = f"run {status['run_id']}: {status['status']}"
    table = Table(title=title, title_justify="left", caption=ui_url(status["run_id"]), caption_justify="left")
    for column, justify in (("#", "right"), ("step", "left"), ("status", "left"),
                            ("attempts", "right"), ("result", "left")):
        table.add_column(column, justify=justify)
    for i, step in enumerate(status["steps"], 1):
        style = _STEP_STYLE.get(step["status"], "")
        mark = {"running": "> ", "completed": "ok ", "failed": "x "}.get(step["status"], "  ")
        result = "" if step["result"] is None else _short(step["result"])
        table.add_row(str(i), step["name"], f"[{style}]{mark}{step['status']}[/]",
                      str(step["attempts"]), result)
    if status.get("error"):
        table.add_row("", "", "[bold red]error[/]", "", status["error"])
    return table


async def follow_live(client: Client, run_id: str) -> dict:
    """Follow the run in a live rich table until it closes."""
    from rich.console import Console
    from rich.live import Live

    first = await run_status(client, run_id)
    with Live(rich_table(first), console=Console(), refresh_per_second=8, transient=False) as live:
        return await wait_for_close(client, run_id, lambda s: live.update(rich_table(s)))


def _exit_code(status: dict) -> int:
    return 1 if status["status"] == "failed" else 0


async def _cmd_start(args) -> int:
    run_id = check_run_id(args.run_id)
    task = check_task(args.task)
    email = check_email(args.email)
    conversation = check_conversation_id(args.conversation) if args.conversation else None
    client = await connect()
    created, existing = await start_run(client, run_id, task, email, conversation)
    if created:
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


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help="log the SDK's and the lab's debug messages to stderr")
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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(args.func(args))
    # Bad input, unknown run, unreachable server, bad configuration (e.g. LAB_CODEC_KEY;
    # InputError is a ValueError too).
    except (RunNotFound, ConnectionError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        flush_tracing()


if __name__ == "__main__":
    exit_now(main())
