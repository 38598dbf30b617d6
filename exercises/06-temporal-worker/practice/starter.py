"""Exercise 6: start a run and wait for it. ``python starter.py RUN_ID "TASK" --email ADDR``.

Starting a run id that exists attaches to it instead of starting it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from temporalio.common import WorkflowIDConflictPolicy

from flowclient.connect import connect


async def main() -> None:
    parser = argparse.ArgumentParser(description="Start (or attach to) an exercise run and wait for its result.")
    parser.add_argument("run_id")
    parser.add_argument("task")
    parser.add_argument("--email", required=True)
    args = parser.parse_args()
    client = await connect(os.environ)
    handle = await client.start_workflow(
        "ExerciseFlow", {"run_id": args.run_id, "task": args.task, "email": args.email}, id=args.run_id,
        task_queue=os.environ.get("TASK_QUEUE") or "exercise-flow",
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
    print(f"run {args.run_id} started; waiting for it (kill the worker now and then, and start another)", flush=True)
    print(json.dumps(await handle.result(), indent=2))


if __name__ == "__main__":
    asyncio.run(main())
