"""The workflow of pydantic-ai's lane: one run of the agent (``peers.pydantic_ai_agent``) on its task.

Workflow code only. The agent is imported passed through the sandbox: it was built in the worker's process,
where ``TemporalDurability`` registered its activities, and pydantic-ai refuses one built in workflow code.
``PydanticAIWorkflow`` gives the class ``__pydantic_ai_agents__``, by which ``PydanticAIPlugin`` registers the
agent's activities on the worker.

Input: a JSON object ``{"run_id", "task", "email", "variant"}`` (``run_id`` is the workflow id), so a client
without the plugin (the driver's) can start it; the result is the agent's final text.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow

    from peers.pydantic_ai_agent import PeerDeps, agent

WORKFLOW_NAME = "PeerPydanticAIRun"


@workflow.defn(name=WORKFLOW_NAME)
class PeerPydanticAIRun(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, inputs: dict[str, Any]) -> str:
        deps = PeerDeps(run_id=inputs["run_id"], email=inputs["email"], variant=inputs.get("variant", "documented"))
        result = await agent.run(inputs["task"], deps=deps)
        return result.output
