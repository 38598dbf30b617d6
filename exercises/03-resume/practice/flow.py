"""Exercise 3, practice: resume by run id.

    python flow.py start RUN_ID "TASK" --email ADDR
    python flow.py resume RUN_ID

The record now holds everything a restart needs; nothing reads it yet.
Write ``resume``: read the run back (TODO 5) and continue at its recorded
step with the recorded results (TODO 6), so no completed step runs again
and an effect left in doubt is repeated under its key.

Check: ``python -m grader.grade 3`` (exercises/03-resume/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import sys
from contextlib import contextmanager
from dataclasses import asdict, replace

from durable_agents.steps import flow
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.limits import InputError, check_email, check_run_id, check_task
from durable_agents.steps.requests import RunInputs, draft_request, record_request, send_request
from durable_agents.wiring import deps_from_env

RECORD_DB = os.environ.get("RECORD_DB", ".state/exercise-record.db")

# The flow, in order: (name, step function, request builder). A builder takes
# the run's inputs and the results of the steps before it; nothing else.
STEPS = [
    ("draft", flow.draft, draft_request),
    ("send_confirmation", flow.send_confirmation, send_request),
    ("record_outcome", flow.record_outcome, record_request),
]
NAMES = [name for name, _, _ in STEPS]
EFFECTS = {"send_confirmation", "record_outcome"}  # the steps that change the world outside

# The run record. The grader reads these tables directly: keep their names and columns.
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    task          TEXT NOT NULL,
    email         TEXT NOT NULL,
    status        TEXT NOT NULL,     -- 'running', 'completed' or 'failed'
    current_step  TEXT,              -- the next step to run; NULL once completed
    error         TEXT               -- why the run failed, naming the step (exercise 5)
);
CREATE TABLE IF NOT EXISTS steps (   -- one row per completed step
    run_id  TEXT NOT NULL,
    name    TEXT NOT NULL,
    result  TEXT NOT NULL,           -- what the step returned, as JSON
    PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS intents ( -- one row per attempt of an effect, written BEFORE its request goes out
    run_id           TEXT NOT NULL,
    step             TEXT NOT NULL,
    attempt          INTEGER NOT NULL,
    idempotency_key  TEXT NOT NULL,
    request          TEXT NOT NULL,  -- the request about to be sent, as JSON
    PRIMARY KEY (run_id, step, attempt)
);
"""


def open_record() -> sqlite3.Connection:
    os.makedirs(os.path.dirname(RECORD_DB) or ".", exist_ok=True)
    conn = sqlite3.connect(RECORD_DB, isolation_level=None)  # no hidden transactions: you write them
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # a COMMIT returns once its write is on the disk: a power cut keeps it
    conn.executescript(SCHEMA)
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection):
    """One atomic write: everything inside is committed together, or not at all."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def random_key(run_id: str, step: str) -> str:
    """The "before"'s key (lesson/in_memory.py): a new one at every execution."""
    return f"inmem/{run_id}/{step}/{secrets.token_hex(8)}"


def say(line: str) -> None:
    print(line, flush=True)


def make_deps():
    """What the steps need from the world (durable_agents/steps/ports.py): the provider and the model, from the
    environment."""
    deps = deps_from_env({**os.environ, "MEMORY_DB": "off"})  # the lab's memory stays out: memory is exercise 4
    return deps


class RunFailed(Exception):
    """The run ended in its terminal failed state, recorded (exercise 5)."""


async def call_step(name: str, step, request, deps):
    """One attempt at a step: the call. Exercise 5 makes it retry what is worth retrying."""
    return await step(request, deps)


async def run_steps(conn, inputs: RunInputs, results: dict, deps, start_at: str = "draft") -> None:
    """Run the steps from ``start_at`` to the end; ``results`` holds those done before."""
    for name, step, build in STEPS[NAMES.index(start_at):]:
        request = build(inputs, results)
        if name in EFFECTS:  # the provider applies an effect once per idempotency key
            key = idempotency_key(inputs.run_id, name)
            request = replace(request, idempotency_key=key)
            with transaction(conn):
                (attempts,) = conn.execute("SELECT COUNT(*) FROM intents WHERE run_id = ? AND step = ?",
                                           (inputs.run_id, name)).fetchone()
                conn.execute("INSERT INTO intents VALUES (?, ?, ?, ?, ?)",
                             (inputs.run_id, name, attempts + 1, key, json.dumps(asdict(request))))
        say(f"step {name} started: run {inputs.run_id}")
        results[name] = asdict(await call_step(name, step, request, deps))
        after = NAMES[NAMES.index(name) + 1] if name != NAMES[-1] else None
        with transaction(conn):
            conn.execute("INSERT INTO steps VALUES (?, ?, ?)", (inputs.run_id, name, json.dumps(results[name])))
            conn.execute("UPDATE runs SET current_step = ?, status = ? WHERE run_id = ?",
                         (after, "running" if after else "completed", inputs.run_id))
        say(f"step {name} completed: run {inputs.run_id}")


async def start(run_id: str, task: str, email: str) -> int:
    conn, deps = open_record(), make_deps()
    inputs = RunInputs(run_id=run_id, task=task, email=email, conversation_id=email)  # a customer's conversation
    try:
        try:
            with transaction(conn):
                conn.execute("INSERT INTO runs (run_id, task, email, status, current_step) "
                             "VALUES (?, ?, ?, 'running', ?)", (run_id, task, email, NAMES[0]))
        except sqlite3.IntegrityError:
            say(f"run {run_id} already exists: resume it with `python flow.py resume {run_id}`, "
                "or start a new run id")
            return 2
        await run_steps(conn, inputs, {}, deps)
        say(f"run {run_id}: completed")
        return 0
    finally:
        await deps.provider.aclose()


async def resume(run_id: str) -> int:
    """Continue run ``run_id`` at its recorded step."""
    # TODO 5 (exercise 3): everything resume needs comes from the record, nothing from running a
    #   step again: the run as it was started, the step it is at, and the result of every step it
    #   completed. An unknown run id is bad input (say so, exit 2); a run that is no longer
    #   running has nothing to resume (exit 0).
    # END TODO 5
    # TODO 6 (exercise 3): the run goes on from the step the record says is next, the recorded
    #   results standing in for the steps before it: a completed step never runs again (a draft
    #   asked again is another text, an effect repeated is a second email), and a step whose intent
    #   has no result runs again under its key. Exit 0 once the run has completed.
    say("resume is exercise 3: not built yet")
    return 2
    # END TODO 6


def main() -> int:
    parser = argparse.ArgumentParser(description="The agent flow on a run record you write.")
    commands = parser.add_subparsers(dest="command", required=True)
    started = commands.add_parser("start", help="start a new run")
    started.add_argument("run_id")
    started.add_argument("task")
    started.add_argument("--email", required=True)
    resumed = commands.add_parser("resume", help="continue a run at its recorded step")
    resumed.add_argument("run_id")
    args = parser.parse_args()
    try:
        if args.command == "start":
            return asyncio.run(start(check_run_id(args.run_id), check_task(args.task), check_email(args.email)))
        return asyncio.run(resume(check_run_id(args.run_id)))
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunFailed as err:
        print(err, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
