"""Agents on Temporal through one plugin on the user's ``Worker`` (``temporalio.plugin.SimplePlugin``).

    from temporalio.worker import Worker
    from durable_agents.flowclient.agents import AgentPlugin, start_agent

    worker = Worker(client, task_queue="agents", plugins=[AgentPlugin(SCHEDULER)])
    await start_agent(client, SCHEDULER, "run-1", "Book a room for Tuesday", task_queue="agents",
                      params={"organizer": "ana@example.com"})

The plugin adds the loop's workflow (``AgentLoop``) and its two activities (``model_turn``, ``tool_call``)
to the worker, serving the agents it is given, with the lab's sandbox (Temporal's default plus ``sqlite3``
refused). A run names its agent when it starts; a worker that does not serve that agent, or serves another
version of it, refuses the run's workflow tasks, naming both, and the run waits for a worker that does.

``deps``: what an agent declared without a model or services gets (the lab's ``durable_agents.steps.flow.StepDeps``); an
agent with its own model and services needs none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkerConfig
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from durable_agents.activities.loop import LoopActivities
from durable_agents.agent import Agent
from durable_agents.flowclient.worker_options import workflow_restrictions
from durable_agents.steps.served import Served, serve, serve_on
from durable_agents.workflows.agent_loop import AgentLoop

__all__ = ["AgentPlugin", "start_agent"]


class AgentPlugin(SimplePlugin):
    """Serve ``agents`` on the worker this plugin is given to (see the module docstring). ``ValueError``
    for an agent with no model and no ``deps`` to take one from, or two agents of one name."""

    def __init__(self, *agents: Agent, deps: Any = None, heartbeat_every: float = 0.3) -> None:
        if not agents:
            raise ValueError("AgentPlugin serves at least one durable_agents.Agent")
        for agent in agents:
            if agent.model is None and getattr(deps, "agent", None) is None:
                raise ValueError(f"agent {agent.name} has no model: declare it with one "
                                 "(durable_agents.Agent(model=...)) or give the plugin deps with a model")
        self.served: list[Served] = serve(agents, deps)
        self.deps = deps
        loop = LoopActivities(deps, served=self.served, heartbeat_every=heartbeat_every)
        super().__init__("durable_agents.AgentPlugin", workflows=[AgentLoop], activities=loop.all(),
                         workflow_runner=SandboxedWorkflowRunner(restrictions=workflow_restrictions()))

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        serve_on(config["task_queue"], self.served)  # what the loop's workflow code reads on this queue
        return super().configure_worker(config)


async def start_agent(client: Client, agent: Agent, run_id: str, task: str, *, task_queue: str,
                      params: Mapping[str, str] | None = None, **options: Any) -> tuple[bool, dict[str, Any] | None]:
    """Start a run of ``agent`` on ``task`` (or attach to the run of that id):
    ``durable_agents.flowclient.loop.start_loop`` with the agent named, its version, instructions and tools recorded.
    ``(created, existing status)``; ``durable_agents.steps.limits.InputError`` saying what to give for a bad input,
    before a run exists."""
    from durable_agents.flowclient.loop import start_loop  # the client side: not needed by a worker-only process

    return await start_loop(client, run_id, task, task_queue=task_queue, agent=agent, params=params, **options)
