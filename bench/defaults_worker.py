"""A worker with Temporal's defaults, for bench/bench_resume.py's "defaults"
mode: ``python bench/defaults_worker.py`` (task queue from TASK_QUEUE, the rest
of the environment as worker.py reads it).

What differs from worker.py, and only here: the workflow is
``bench/defaults_flow.py``'s ``DefaultsFlow`` (no heartbeat timeout, 10 s
start-to-close), and the Worker gets no tuned option but the lab's sandbox
(Temporal's default cache, 10 s sticky timeout, 100 workflow-task slots).
The starter's side, the 10 s workflow task timeout, is bench_resume.py's
``start_run(..., task_timeout=...)``. Prints ``worker ready`` once polling.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from defaults_flow import DefaultsFlow  # noqa: E402  (a sibling module: bench/ is this script's directory)
from temporalio.worker import Worker  # noqa: E402
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner  # noqa: E402

from durable_agents.activities import FlowActivities  # noqa: E402
from durable_agents.flowclient.connect import connect, exit_now, task_queue  # noqa: E402
from durable_agents.flowclient.logs import configure_logging  # noqa: E402
from durable_agents.flowclient.worker_options import workflow_restrictions  # noqa: E402
from durable_agents.wiring import deps_from_env  # noqa: E402


async def serve(queue: str) -> None:
    deps = deps_from_env()
    client = await connect()
    worker = Worker(client, task_queue=queue, workflows=[DefaultsFlow], activities=FlowActivities(deps).all(),
                    workflow_runner=SandboxedWorkflowRunner(restrictions=workflow_restrictions()),
                    graceful_shutdown_timeout=timedelta(seconds=5))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print(f"worker ready: task queue {queue!r}, pid {os.getpid()}, Temporal's default timeouts (benchmark)",
              flush=True)
        await stop.wait()
    await deps.provider.aclose()


def main() -> int:
    configure_logging(False)
    asyncio.run(serve(task_queue()))
    return 0


if __name__ == "__main__":
    exit_now(main())
