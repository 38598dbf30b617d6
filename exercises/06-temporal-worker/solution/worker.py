"""Exercise 6: the worker. ``python worker.py`` (Ctrl-C stops it; SIGKILL is the real test).

It connects as every process of the lab does (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``: durable_agents.flowclient.connect), polls ``TASK_QUEUE`` (default
``exercise-flow``), and runs the workflow under the lab's shipped worker
options (durable_agents.flowclient.worker_options: Temporal's sandbox plus sqlite3, the
workflow cache), with the activities this folder defines.
"""

from __future__ import annotations

import asyncio
import os

from agent_activities import FlowActivities
from agent_workflow import ExerciseFlow
from temporalio.worker import Worker

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.wiring import deps_from_env


async def main() -> None:
    client = await connect(os.environ)
    steps = FlowActivities(deps_from_env({**os.environ, "MEMORY_DB": "off"}))
    activities = [getattr(steps, name) for name in ("draft", "send_confirmation", "record_outcome")
                  if hasattr(steps, name)]
    queue = os.environ.get("TASK_QUEUE") or "exercise-flow"
    async with Worker(client, task_queue=queue, workflows=[ExerciseFlow], activities=activities, **worker_options()):
        print(f"worker ready on task queue {queue} (pid {os.getpid()})", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
