"""Print one run of an exercise's record, as the grader reads it.

    python -m grader.show RUN_ID [--db PATH]

``--db`` defaults to ``RECORD_DB`` (``.state/exercise-record.db``), where the
exercises' ``flow.py`` keeps its record; given exercise 7's record
(``.state/exercise7-record.db``: its ``turns`` table), it prints the run's
turns and each call's key and result. Exit 0, or 2 if there is no such
record or run.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

from durable_agents.steps.controls import printable
from grader.check_loop import read_loop_rows
from grader.evidence import SchemaChanged, read_record

DEFAULT_DB = ".state/exercise-record.db"


def loop_record(db: Path) -> bool:
    """Whether ``db`` is exercise 7's record (its ``turns`` table), not exercises 1-5's."""
    if not db.exists():
        return False
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turns'").fetchone()
    return found is not None


def show_loop(db: Path, run_id: str) -> int:
    """Exercise 7's run: its status, each recorded turn with its calls, and each call's key and result."""
    record = read_loop_rows(db, run_id)
    if record.status is None:
        print(printable(f"error: no run {run_id} in {db}"), file=sys.stderr)
        return 2
    print(printable(f"runs     {run_id}: status {record.status!r}"))
    for n, answer in sorted(record.turns.items()):
        calls = answer.get("calls") or []
        asked = [f"{c.get('name')}(id {c.get('id')!r})" for c in calls if isinstance(c, dict)]
        said = ", ".join(asked) if asked else "final answer: " + str(answer.get("content"))[:100]
        print(printable(f"turns    {n}: {said}"))
        for i in range(len(calls)):
            if (n, i) in record.calls:
                key, result = record.calls[(n, i)]
                print(printable(f"calls    {n}/{i}: key {key}; {str(result.get('status'))} "
                                f"{json.dumps(result.get('content'))[:100]}"))
            else:
                print(f"calls    {n}/{i}: no result recorded")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.show", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument("--db", default=os.environ.get("RECORD_DB") or DEFAULT_DB,
                        help="the record file (default: RECORD_DB, else .state/exercise-record.db)")
    args = parser.parse_args(argv)
    if loop_record(Path(args.db)):
        return show_loop(Path(args.db), args.run_id)
    try:
        record = read_record(Path(args.db), args.run_id)
    except SchemaChanged as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not record.exists or record.run is None:
        print(printable(f"error: {record.describe()} ({args.db}, run {args.run_id})"), file=sys.stderr)
        return 2
    run = record.run
    print(printable(f"runs     {run['run_id']}: status {run['status']!r}, current_step {run['current_step']!r}"
                    + (f", error {run['error']!r}" if run.get("error") else "")))
    flow = ("draft", "send_confirmation", "record_outcome")
    for name, result in sorted(record.steps.items(), key=lambda item: (flow + (item[0],)).index(item[0])):
        shown = record.result(name)
        brief = {k: v for k, v in shown.items() if k != "body"} if shown else result
        print(printable(f"steps    {name}: {json.dumps(brief)[:150]}"))
    for intent in record.intents:
        print(printable(f"intents  {intent['step']} attempt {intent['attempt']}: key {intent['idempotency_key']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
