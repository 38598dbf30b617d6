"""The adapter: what an agent builder declares to make their own agent durable, and imports from here.

A tool is declared data (``Tool``: name, description, arguments as a pydantic model, effect kind, async
handler), an agent's tools are a ``Toolbox`` (the model's ``tools=``, the check of a call's arguments, the
dispatch to the declared handler, the signature recorded with each run). The contracts are in
``durable_agents.tools``. Nothing here imports the lab: the lab's refund agent is one user of it
(``steps.refund_agent``).
"""

from durable_agents.tools import Arguments, Tool, Toolbox, ToolContext, ToolOutput, ToolRefused

__all__ = ["Arguments", "Tool", "ToolContext", "ToolOutput", "ToolRefused", "Toolbox"]
