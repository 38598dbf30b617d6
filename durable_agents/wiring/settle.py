"""Settling an agent loop's calls from a command (``starter.py settle``, ``python -m durable_agents.runrecord settle``,
``python -m durable_agents.dbosflow settle``): each call with an effect asked through its tool's own lookup by key
(``durable_agents.steps.settle.settle_calls``), with the agent's services built for the command and closed after.

An agent that declares no services of its own (the lab's refund agent) is given the lab's: a provider
client at ``PROVIDER_URL``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from durable_agents.agent import Agent
from durable_agents.drafting import OfflineModel
from durable_agents.providerclient import ProviderClient, provider_url_from_env
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.served import close_services, serve
from durable_agents.steps.settle import settle_calls


async def settle_loop_calls(calls: Mapping[str, tuple[str, str]], agent: Agent,
                            env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """``calls``: ``{step: (tool name, key)}`` of a run of ``agent``; the report ``settle_calls`` gives."""
    async with ProviderClient(provider_url_from_env(os.environ if env is None else env)) as provider:
        deps = StepDeps(provider=provider, llm=OfflineModel())  # no step of the flow runs here
        served = serve([agent], deps, model="own")  # no model is asked here: AGENT_MODEL is not this command's
        try:
            return await settle_calls(calls, served[0].agent.tools, served[0].services)
        finally:
            await close_services(served, deps)
