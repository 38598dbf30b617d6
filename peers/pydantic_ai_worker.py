"""A worker of pydantic-ai's lane: ``python -m peers.pydantic_ai_worker --task-queue Q``.

The client and the worker get ``PydanticAIPlugin`` (its data converter, its sandbox passthroughs, and the
agent's activities, found through the workflow's ``__pydantic_ai_agents__``), as pydantic-ai documents. Reads
``TEMPORAL_ADDRESS``, ``PROVIDER_URL``, ``LLM_BASE_URL``, ``LAB_PEER_RUN`` and ``CRASH_AT`` (``peers.lane``).
Prints ``worker ready`` once it polls; stops on SIGTERM or SIGINT.

The workflow cache's sticky timeout is the lab's (``durable_agents.flowclient.worker_options.CACHED_STICKY_TIMEOUT``,
100 ms instead of Temporal's 10 s): a killed worker's sticky queue then holds the run's next workflow task no longer
than it does for the lab's own workers, so the resume times compare the frameworks, not this setting.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agents.flowclient.signals import run_until_signalled
from durable_agents.flowclient.worker_options import CACHED_STICKY_TIMEOUT
from durable_agents.steps import crashpoints
from peers.lane import READY
from peers.pydantic_ai_workflow import PeerPydanticAIRun


async def serve(task_queue: str) -> None:
    client = await Client.connect(os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"), plugins=[PydanticAIPlugin()])
    worker = Worker(client, task_queue=task_queue, workflows=[PeerPydanticAIRun],
                    sticky_queue_schedule_to_start_timeout=CACHED_STICKY_TIMEOUT)

    def ready() -> None:
        armed = ", ".join(sorted(crashpoints.armed())) or "none"
        print(f"{READY}: pydantic-ai, task queue {task_queue!r}, pid {os.getpid()}, crash points {armed}", flush=True)

    await run_until_signalled(worker, ready)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m peers.pydantic_ai_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--task-queue", required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.task_queue))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
