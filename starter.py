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
is settled.

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
import time
import uuid
from datetime import timedelta
from urllib.parse import quote

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from flowclient.connect import connect, connect_config, exit_now, flush_tracing, task_queue
from flowclient.logs import basic_config
from flowclient.status import RunNotFound, activity_traces, read_history, run_status
from steps.controls import printable
from steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
from steps.models import STEP_NAMES
from steps.retry import RetryRule, rule_from_env, run_timeout_floor
from steps.runstate import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_NO_WORKER, EXIT_PIPE_CLOSED, exit_code
from steps.runview import render_table, rich_table, step_ticker
from workflows.agent_flow import WORKFLOW_NAME, FlowInput

# A worker that dies mid workflow task is noticed after this, not the 10 s default.
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)
PARKING_WINDOW = timedelta(hours=24)
"""How long a run may wait beyond its retry budgets (parked by a bad deploy, or
with no worker running) before Temporal closes it as timed out."""


def execution_timeout(rule: RetryRule | None = None, env=None) -> timedelta:
    """The run's execution timeout: ``RUN_TIMEOUT_SECONDS``, or by default every
    step's retry budget plus the parking window. Never below the budgets: a
    timeout that could cut a retrying step short is refused."""
    env = os.environ if env is None else env
    rule = rule or rule_from_env(env)
    floor = run_timeout_floor(rule, len(STEP_NAMES))
    raw = (env.get("RUN_TIMEOUT_SECONDS") or "").strip()
    if not raw:
        return timedelta(seconds=floor) + PARKING_WINDOW
    try:
        seconds = float(raw)
        if not seconds > 0:
            raise ValueError
    except ValueError:
        raise InputError(f"RUN_TIMEOUT_SECONDS={raw!r} must be a positive number of seconds") from None
    if seconds < floor:
        raise InputError(
            f"RUN_TIMEOUT_SECONDS={raw} would cut a retrying step short: it must be at least {floor:g} s, "
            f"the {len(STEP_NAMES)} steps' retry budgets ({rule.budget_seconds:g} s each, LAB_RETRY_BUDGET_SECONDS) "
            "plus a minute each. Raise it, or lower the budget."
        )
    return timedelta(seconds=seconds)


async def start_run(
    client: Client, run_id: str, task: str, email: str, conversation_id: str | None = None,
    queue: str | None = None, timeouts: str = "tuned", rule: RetryRule | None = None,
) -> tuple[bool, dict | None]:
    """Start the run, or attach to the existing one. Returns (created, existing status).

    The server decides, atomically: REJECT_DUPLICATE refuses an id whose run has
    closed, FAIL refuses one whose run is open. Either refusal means "attach".
    The retry rule (``steps.retry``, from the environment unless given) goes
    into the run's input: the numbers a run runs under are in its history.
    """
    rule = rule or rule_from_env()
    try:
        await client.start_workflow(
            WORKFLOW_NAME,
            FlowInput(run_id=run_id, task=task, email=email,
                      conversation_id=conversation_id or run_id, timeouts=timeouts, retry=rule.to_dict()),
            id=run_id,
            task_queue=queue or task_queue(),
            # "defaults" exists for bench/bench_resume.py: Temporal's 10 s task timeout.
            task_timeout=WORKFLOW_TASK_TIMEOUT if timeouts == "tuned" else timedelta(seconds=10),
            execution_timeout=execution_timeout(rule),
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
    """Until the run completes, fails or is parked (which needs an operator)."""
    return await wait_for_status(client, run_id, lambda s: s["status"] != "running", on_change, poll)


class NoWorker(RuntimeError):
    """``status --live`` asks the workflow itself, which needs a worker; none answered."""


LIVE_TIMEOUT = timedelta(seconds=5)


async def live_status(client: Client, run_id: str) -> dict:
    try:
        return await client.get_workflow_handle(run_id).query("progress", rpc_timeout=LIVE_TIMEOUT)
    except RPCError as err:
        if err.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED) or "imeout" in str(err):
            raise NoWorker(
                f"no worker answered the query for run {run_id} in {LIVE_TIMEOUT.total_seconds():g} s: start one "
                f"(python worker.py), or drop --live to read Temporal's history, which needs none"
            ) from None
        raise


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


async def follow_live(client: Client, run_id: str) -> dict:
    """Follow the run in a live rich table until it closes."""
    from rich.console import Console
    from rich.live import Live

    first = await run_status(client, run_id)
    caption = ui_url(run_id)
    with Live(rich_table(first, caption), console=Console(), refresh_per_second=8, transient=False) as live:
        return await wait_for_close(client, run_id, lambda s: live.update(rich_table(s, caption)))


def _exit_code(status: dict) -> int:
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


class RetryRefused(ValueError):
    """A run that cannot be retried; the message says why and what to do."""


async def retry_run(client: Client, run_id: str) -> tuple[str, int, str]:
    """Reset a failed or timed-out run to the workflow task that first scheduled
    its failed step. Returns (step, reset event id, new Temporal run id)."""
    description, history = await read_history(client, run_id)
    state = description.status
    if state == WorkflowExecutionStatus.COMPLETED:
        raise RetryRefused(f"run {run_id} completed; a completed run cannot be retried. "
                           "Start a new RUN_ID to do the task again.")
    if state == WorkflowExecutionStatus.RUNNING:
        raise RetryRefused(f"run {run_id} is still open ({(await run_status(client, run_id))['status']}); "
                           "retry is for a run that failed or timed out")
    status = await run_status(client, run_id)
    if (status.get("error") or "").startswith("input refused"):
        raise RetryRefused(f"run {run_id} failed on its input ({status['error']}); the same input would fail "
                           "again. Start a new RUN_ID with corrected input.")
    step = status["current_step"]
    traces = [t for t in (await activity_traces(client, history)).values() if t.step == step]
    if traces:
        point = traces[0].workflow_task_completed_event_id
    else:  # closed before the step was ever scheduled (e.g. timed out while parked)
        completed = [e.event_id for e in history.events
                     if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        if not completed:
            raise RetryRefused(f"run {run_id} never completed a workflow task; start a new RUN_ID")
        point = completed[-1]
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=run_id, run_id=description.run_id),
            reason=f"starter.py retry: restart at step {step} ({status.get('error') or 'closed'})"[:1000],
            workflow_task_finish_event_id=point,
            request_id=str(uuid.uuid4()),
        )
    )
    return step or "?", point, response.run_id


async def _cmd_retry(args) -> int:
    run_id = check_run_id(args.run_id)
    client = await connect()
    try:
        step, point, new_run = await retry_run(client, run_id)
    except RetryRefused as err:
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
    from provider.client import ProviderClient, provider_url_from_env
    from steps.settle import render_settle, settle

    run_id = check_run_id(args.run_id)
    async with ProviderClient(provider_url_from_env(os.environ)) as provider:
        report = await settle(provider, run_id)
    print(json.dumps({"run_id": run_id, "steps": report}, indent=2) if args.json else render_settle(run_id, report),
          flush=True)
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
    # Bad input, unknown run, unreachable server, bad configuration (e.g. LAB_CODEC_KEY;
    # InputError is a ValueError too).
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except (RunNotFound, ConnectionError, ValueError) as err:
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
