"""pydantic-ai's lane (``peers.lane.Lane``): its ``TemporalDurability`` agent (``peers.pydantic_ai_agent``),
run by ``peers.pydantic_ai_workflow`` on a worker of ``peers.pydantic_ai_worker``.

Variants: ``documented`` (a fresh key per tool call) and ``keyed`` (the key from the run and
``RunContext.tool_call_id``). The variant travels in the run's input, so one worker serves both.
This module imports no pydantic-ai: the driver starts runs by the workflow's name, with a JSON input.
"""

from __future__ import annotations

import sys
from importlib.metadata import version

from temporalio.client import Client, WorkflowHandle

NAME = f"pydantic-ai {version('pydantic-ai-slim')}"
VARIANTS = ("documented", "keyed")
WORKFLOW_NAME = "PeerPydanticAIRun"  # peers.pydantic_ai_workflow.WORKFLOW_NAME (not imported: see above)


def worker_argv(variant: str, task_queue: str) -> list[str]:
    if variant not in VARIANTS:
        raise ValueError(f"pydantic-ai's lane has the variants {', '.join(VARIANTS)}, not {variant!r}")
    return [sys.executable, "-m", "peers.pydantic_ai_worker", "--task-queue", task_queue]


async def start_run(client: Client, *, run_id: str, task: str, email: str, task_queue: str,
                    variant: str) -> WorkflowHandle:
    if variant not in VARIANTS:
        raise ValueError(f"pydantic-ai's lane has the variants {', '.join(VARIANTS)}, not {variant!r}")
    return await client.start_workflow(WORKFLOW_NAME, {"run_id": run_id, "task": task, "email": email,
                                                       "variant": variant}, id=run_id, task_queue=task_queue)
