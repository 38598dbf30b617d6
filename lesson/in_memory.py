"""THE "BEFORE": the three-step agent flow held entirely in process memory.

    python -m lesson.in_memory RUN_ID "TASK" --email ADDR [--keys random|stable]

This is where the lesson starts, and it is deliberately wrong. It calls the
same step functions (``durable_agents.steps.flow``) against the same provider as the durable
engines, but:

- **no run record**: which steps are done lives in local variables. Kill the
  process and that knowledge is gone; start it again with the same RUN_ID and
  it begins at step 1 (and reports ``attempt 1``: it cannot know better);
- **no stable idempotency keys**: by default every execution of an effectful
  step sends a fresh random key (``inmem/<run id>/<step>/<random hex>``), so
  the provider cannot tell a repeat from a new request and applies it again;
- conversation memory is a ``durable_agents.memory.InMemoryStore`` in this process: also lost.

Crash points (``CRASH_AT``, see ``durable_agents.steps.crashpoints``; any name is accepted):
``in_memory:after_draft``, ``in_memory:after_send_confirmation`` and
``in_memory:after_record_outcome``, reached right after each step returns.

``CRASH_AT=in_memory:after_send_confirmation`` then a second start of the same
command: steps 1 and 2 run again, and the provider shows two email keys with
one effect each: the confirmation email went out twice.

``--keys stable`` uses the durable engines' keys (``durable_agents.steps.keys``): the steps
still run again (no record), but the provider replays the email instead of
sending a second one. Keys make the *effect* idempotent; only a record stops
the *work* from being redone.

It prints ``step <name> started: run <id> attempt <n>`` per execution (like
every engine: ``durable_agents.steps.startedline``, so executions can be counted) and ``step
<name> completed: run <id>`` after each step (``completed_line``; read back by
``completed_step``: with no record, these lines are all that says what a
killed process had done). Exit codes: 0 completed, 1 a step
failed (no retries, nothing recorded: a new start begins again at step 1),
2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from durable_agents.memory import InMemoryStore, MemoryPolicy, Message
from durable_agents.steps import flow
from durable_agents.steps.controls import printable
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.errors import StepError
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
from durable_agents.steps.plan import FLOW
from durable_agents.steps.ports import Remembered
from durable_agents.steps.requests import RunInputs, remember_request
from durable_agents.steps.startedline import started_line

KEY_MODES = ("random", "stable")
COMPLETED = "step %s completed: run %s"
_COMPLETED = re.compile(r"(?:^|(?<=\s))step (\w+) completed: run ")


def completed_line(step: str, run_id: str) -> str:
    """The line printed once ``step`` of ``run_id`` has returned."""
    return COMPLETED % (step, run_id)


def completed_step(line: str) -> str | None:
    """The step a ``completed_line`` names, or None if ``line`` is not one."""
    found = _COMPLETED.search(line)
    return found[1] if found else None


def completed_steps(text: str) -> list[str]:
    """The steps a process of this module said it completed, in order (its ``completed_line`` lines)."""
    return [step for step in map(completed_step, text.splitlines()) if step is not None]


def make_key(run_id: str, step: str, mode: str) -> str:
    """``random``: a new key per execution (the bug). ``stable``: ``durable_agents.steps.keys``."""
    if mode == "stable":
        return idempotency_key(run_id, step)
    return f"inmem/{run_id}/{step}/{secrets.token_hex(8)}"


def in_process_memory(deps: Any) -> InMemoryStore:
    """Point the steps' memory at a store that lives (and dies) with this process."""
    store = InMemoryStore(MemoryPolicy(max_tokens=2000, max_messages=40))

    def context(conversation_id: str, as_of: float | None = None) -> list[dict[str, Any]]:
        return [m.to_chat() for m in store.window(conversation_id, include_pinned=False, as_of=as_of)]

    def remember(conversation_id: str, messages: list[Remembered]) -> int:
        return sum(store.append(conversation_id, Message(id=i, role=r, content=c)).added for i, r, c in messages)

    deps.context, deps.remember = context, remember
    return store


async def run_flow(run_id: str, task: str, email: str, deps: Any, *, conversation_id: str | None = None,
                   keys: str = "random", say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the steps of ``durable_agents.steps.plan`` in order, holding their results only in ``done``.

    The requests are the durable engines' (``durable_agents.steps.requests``), but for the
    keys: ``make_key`` replaces them (``random``: the bug). No start id and no
    memory cut-off: this engine has no record to keep them in."""
    done: dict[str, Any] = {}  # the whole "record": gone when the process is
    inputs = RunInputs(run_id=run_id, task=task, email=email, conversation_id=conversation_id or run_id)
    for step in FLOW:
        # Always attempt 1: nothing tells this process that an earlier one ran the step.
        say(started_line(step.name, run_id, 1))
        request = step.request(inputs, done)
        if step.effect:
            request = replace(request, idempotency_key=make_key(run_id, step.name, keys))
        done[step.name] = await step.run(request, deps)
        say(completed_line(step.name, run_id))
        crash_point(f"in_memory:after_{step.name}")

    await flow.remember_exchange(remember_request(inputs, done), deps)
    return done


async def _main(args: argparse.Namespace) -> int:
    from durable_agents.wiring import deps_from_env

    run_id = check_run_id(args.run_id)
    task, email = check_task(args.task), check_email(args.email)
    conversation = check_conversation_id(args.conversation) if args.conversation else None
    try:
        deps = deps_from_env({**os.environ, "MEMORY_DB": "off"})
    except ValueError as err:
        raise InputError(str(err)) from err
    in_process_memory(deps)
    print(f"in-memory run {run_id} (the 'before': no run record, {args.keys} idempotency keys)", flush=True)
    try:
        done = await run_flow(run_id, task, email, deps, conversation_id=conversation, keys=args.keys,
                              say=lambda line: print(printable(line), flush=True))
    except StepError as err:
        print(printable(f"step failed: {err}. Nothing was recorded: starting again begins at step 1."),
              file=sys.stderr, flush=True)
        return 1
    finally:
        await deps.provider.aclose()
    sent, recorded = done["send_confirmation"], done["record_outcome"]
    print(printable(f"run {run_id} completed: email {sent.message_id} (key {sent.idempotency_key}"
                    f"{', replayed' if sent.replayed else ''}), ticket {recorded.ticket_id}"), flush=True)
    print("nothing of this run survives this process: starting it again starts again at step 1", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lesson.in_memory",
        description="The 'before': the agent flow held only in memory (no run record, random idempotency keys).")
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument("task", metavar="TASK")
    parser.add_argument("--email", required=True)
    parser.add_argument("--conversation", default=None, help="conversation id for memory (default: RUN_ID)")
    parser.add_argument("--keys", choices=KEY_MODES, default="random",
                        help="random: a fresh key per execution (default, the bug); stable: durable_agents.steps.keys")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except InputError as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
