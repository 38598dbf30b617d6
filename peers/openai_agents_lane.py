"""The OpenAI Agents SDK's lane (``peers.lane.Lane``): an ``agents.Agent`` with the lab's four tools on Temporal
through ``temporalio-openai-agents`` (``temporalio.openai_agents``; ``temporalio.contrib.openai_agents`` forwards
to it), model calls as the plugin's activities.

Variants (``VARIANTS``), the ways the integration's README shows a tool, the documented form for a tool with
I/O first:

- ``activity_as_tool``: the tools as activities through ``activity_as_tool``, a fresh key per attempt (the
  README's form for "External I/O and non-deterministic operations");
- ``activity_as_tool_keyed``: the same, each effect keyed by ``activity.info()``'s workflow id and activity id;
- ``function_tool``: ``@function_tool``, run inside the workflow (the README's default for a ``FunctionTool``,
  meant for "Deterministic, workflow-safe computation"; the workflow sandbox refuses these tools' HTTP calls:
  ``peers/openai_agents_workflow.py`` says what a run then does).

``peers/openai_agents_workflow.py`` has the agent and the options, ``peers/openai_agents_worker.py`` the worker,
``peers/openai_agents_model.py`` the model (chat completions at ``LLM_BASE_URL``) and the crash point
``peer:between_turns`` (the model activity of any turn after the first, before its request is sent).
"""

from __future__ import annotations

import sys
from importlib.metadata import version

from temporalio.client import Client, WorkflowHandle

from peers.openai_agents_workflow import VARIANTS as VARIANTS
from peers.openai_agents_workflow import WORKFLOW_NAME, PeerRunInput

NAME = f"openai-agents {version('openai-agents')} / temporalio-openai-agents {version('temporalio-openai-agents')}"


def worker_argv(variant: str, task_queue: str) -> list[str]:
    _check(variant)
    return [sys.executable, "-m", "peers.openai_agents_worker", "--variant", variant, "--task-queue", task_queue]


async def start_run(client: Client, *, run_id: str, task: str, email: str, task_queue: str,
                    variant: str) -> WorkflowHandle:
    """Start one run (workflow id ``run_id``). ``client`` needs no plugin: the input is a dataclass and the result
    a string, which the default converter and the plugin's read alike."""
    _check(variant)
    return await client.start_workflow(WORKFLOW_NAME, PeerRunInput(task=task, email=email, variant=variant),
                                       id=run_id, task_queue=task_queue, result_type=str)


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"the openai-agents lane has no variant {variant!r}: give one of {', '.join(VARIANTS)}")
