"""The lab's Temporal workflows, which are the adapter's: ``durable_agents.workflows``.

- ``AgentFlow`` (``durable_agents.workflows.agent_flow``): the three-step flow, draft, send_confirmation,
  record_outcome;
- ``AgentLoop`` (``durable_agents.workflows.agent_loop``): the agent loop, a model choosing its tools.

The code lives in the package so that a user who installs it without the lab gets the same workflows
(tests/test_architecture.py checks that these are the package's classes, not copies).
"""

from durable_agents.workflows.agent_flow import AgentFlow
from durable_agents.workflows.agent_loop import AgentLoop

__all__ = ["AgentFlow", "AgentLoop"]
