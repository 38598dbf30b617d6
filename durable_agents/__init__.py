"""The adapter: what an agent builder declares to make their own agent durable, and imports from here.

A tool is declared data (``Tool``: name, description, arguments as a pydantic model, effect kind, async
handler, and a lookup by key answering ``Applied``), an agent's tools are a ``Toolbox`` (the model's
``tools=``, the check of a call's arguments, the dispatch to the declared handler, the signature recorded
with each run), and an agent is declared data too (``Agent``: its name, instructions, tools, model,
services, run parameters and bounds; ``load_agent`` reads one by import string). The contracts are in
``durable_agents.tools`` and ``durable_agents.agent``; on Temporal, ``flowclient.agents.AgentPlugin``
serves agents on a worker. Nothing here imports the lab: the lab's refund agent is one user of it
(``steps.refund_agent``); docs/your-agent.md shows another.
"""

from durable_agents.agent import Agent, Call, FunctionModel, Model, Reply, ScriptedModel, load_agent
from durable_agents.tools import Applied, Arguments, Lookup, Tool, Toolbox, ToolContext, ToolOutput, ToolRefused

__all__ = ["Agent", "Applied", "Arguments", "Call", "FunctionModel", "Lookup", "Model", "Reply", "ScriptedModel",
           "Tool", "ToolContext", "ToolOutput", "ToolRefused", "Toolbox", "load_agent"]
