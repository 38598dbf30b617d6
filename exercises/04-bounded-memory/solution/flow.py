"""Exercise 4, solution: bounded conversation memory feeds the prompt.

    python flow.py start RUN_ID "TASK" --email ADDR
    python flow.py resume RUN_ID

Exercise 3's flow, with the customer's conversation memory
(bounded_memory.py, bounded by its stated eviction rule) feeding the draft
step's prompt, and each completed run's exchange appended to it. Memory is
context for the model; the run record alone says what was done, so wiping
memory mid-run changes nothing about what a resume does.
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

import bounded_memory  # this folder's bounded_memory.py: the memory you write

from durable_agents.steps import flow
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.limits import InputError, check_email, check_run_id, check_task
from durable_agents.steps.requests import RunInputs, draft_request, record_request, remember_request, send_request
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
    deps.context, deps.remember = bounded_memory.context, bounded_memory.remember
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
    await flow.remember_exchange(remember_request(inputs, results), deps)


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
    conn = open_record()
    row = conn.execute("SELECT task, email, status, current_step FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        say(f"no run {run_id} in {RECORD_DB}: start it first")
        return 2
    task, email, status, current_step = row
    if status != "running":
        say(f"run {run_id} is {status}: nothing to resume")
        return 0
    results = {name: json.loads(result) for name, result in
               conn.execute("SELECT name, result FROM steps WHERE run_id = ?", (run_id,))}
    say(f"resuming run {run_id} at step {current_step}; recorded: {', '.join(results) or 'nothing yet'}")
    inputs = RunInputs(run_id=run_id, task=task, email=email, conversation_id=email)  # a customer's conversation
    deps = make_deps()
    try:
        await run_steps(conn, inputs, results, deps, start_at=current_step)
    finally:
        await deps.provider.aclose()
    say(f"run {run_id}: completed")
    return 0


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
