"""Print one run of an exercise's record, as the grader reads it.

    python -m grader.show RUN_ID [--db PATH]

``--db`` defaults to ``RECORD_DB`` (``.state/exercise-record.db``), where the
exercises' ``flow.py`` keeps its record. Exit 0, or 2 if there is no such
record or run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from grader.evidence import SchemaChanged, read_record
from steps.controls import printable

DEFAULT_DB = ".state/exercise-record.db"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.show", description=__doc__.splitlines()[0])
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument("--db", default=os.environ.get("RECORD_DB") or DEFAULT_DB,
                        help="the record file (default: RECORD_DB, else .state/exercise-record.db)")
    args = parser.parse_args(argv)
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
