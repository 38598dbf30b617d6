"""Durable agents: bring your own agent (its tools, instructions, model and services) and run it on Temporal,
on a hand-rolled SQLite run record or on DBOS, killed at any point and resumed, each effect once.

What an agent builder declares, and imports from here:

- ``Tool``: a tool as declared data (name, description, arguments as a pydantic model, effect kind, async
  handler, and a ``lookup`` by key answering ``Applied``); ``Toolbox``: an agent's tools;
- ``Agent``: an agent as declared data (name, instructions, tools, model, services, run parameters,
  bounds); ``ScriptedModel`` and ``FunctionModel`` for a model of your own; ``load_agent`` reads an agent by
  import string (``pkg.mod:attr``);
- ``AgentPlugin`` and ``start_agent``: serve agents on your own Temporal ``Worker`` (a
  ``temporalio.plugin.SimplePlugin``) and start a run of one.

The contracts are in ``durable_agents.tools``, ``durable_agents.agent`` and
``durable_agents.flowclient.agents`` (docs/your-agent.md walks through them). The engines and their commands
are subpackages: ``python -m durable_agents.worker`` and ``python -m durable_agents.starter`` (Temporal),
``python -m durable_agents.runrecord`` (the run record), ``python -m durable_agents.dbosflow`` (DBOS, with the
``dbos`` extra). The lab around the package (its demo, lesson, grader, stand-in provider) is not part of it.

Importing this namespace imports none of them: each name is loaded when first used (PEP 562), so that a
workflow sandbox, which imports the package afresh for every run it builds, or a command's ``--help`` pays
for what it uses only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

_WHERE = {
    "Agent": "durable_agents.agent",
    "Call": "durable_agents.agent",
    "FunctionModel": "durable_agents.agent",
    "Model": "durable_agents.agent",
    "Reply": "durable_agents.agent",
    "ScriptedModel": "durable_agents.agent",
    "load_agent": "durable_agents.agent",
    "Applied": "durable_agents.tools",
    "Approval": "durable_agents.tools",
    "Arguments": "durable_agents.tools",
    "Lookup": "durable_agents.tools",
    "Tool": "durable_agents.tools",
    "ToolContext": "durable_agents.tools",
    "ToolOutput": "durable_agents.tools",
    "ToolRefused": "durable_agents.tools",
    "Toolbox": "durable_agents.tools",
    "AgentPlugin": "durable_agents.flowclient.agents",
    "start_agent": "durable_agents.flowclient.agents",
}

__all__ = ["Agent", "AgentPlugin", "Applied", "Approval", "Arguments", "Call", "FunctionModel", "Lookup", "Model",
           "Reply", "ScriptedModel", "Tool", "ToolContext", "ToolOutput", "ToolRefused", "Toolbox", "__version__",
           "load_agent", "start_agent"]

if TYPE_CHECKING:
    from durable_agents.agent import Agent, Call, FunctionModel, Model, Reply, ScriptedModel, load_agent
    from durable_agents.flowclient.agents import AgentPlugin, start_agent
    from durable_agents.tools import (
        Applied,
        Approval,
        Arguments,
        Lookup,
        Tool,
        Toolbox,
        ToolContext,
        ToolOutput,
        ToolRefused,
    )


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'durable_agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
