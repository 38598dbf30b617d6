"""Building the steps' dependencies from the environment: the composition root
shared by the Temporal worker, the run record, DBOS and the lesson, so every
engine talks to the same provider, model and memory in the same way.

- ``PROVIDER_URL``: the provider (default http://127.0.0.1:8780);
- ``LLM_BASE_URL`` / ``LLM_MODEL`` / ``LLM_API_KEY``: the model (offline by default;
  see ``drafting``): the draft's (``StepDeps.llm``) and the agent loop's
  (``StepDeps.agent``). With a server, both are one ``OpenAIChatModel``: one
  client, one connection pool, one preload; offline, the draft gets the
  offline template and the loop the scripted model;
- ``MEMORY_DB``, ``MEMORY_MAX_TOKENS``, ``MEMORY_MAX_MESSAGES``: conversation
  memory (``durable_agents.wiring.memory``);
- ``LAB_STEP_SECONDS``: slow each step down for demonstrations (default 0).

Configuration errors raise ``ValueError`` (``InputError`` is one) naming the
variable, so a process stops at start-up instead of failing every run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from durable_agents.drafting import OpenAIChatModel, agent_from_env, model_from_env
from durable_agents.providerclient import ProviderClient, provider_url_from_env
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.limits import InputError
from durable_agents.wiring.memory import memory_from_env


def pace_from_env(env: Mapping[str, str]) -> float:
    raw = env.get("LAB_STEP_SECONDS") or "0"
    try:
        pace = float(raw)
        if pace < 0 or pace > 600:
            raise ValueError
    except ValueError:
        raise InputError(f"LAB_STEP_SECONDS={raw!r} must be a number of seconds between 0 and 600") from None
    return pace


def deps_from_env(env: Mapping[str, str] | None = None) -> StepDeps:
    env = os.environ if env is None else env
    context, remember = memory_from_env(env)
    llm = model_from_env(env)
    # A server answers both steps: one instance, so the worker builds and preloads one client.
    agent = llm if isinstance(llm, OpenAIChatModel) else agent_from_env(env)
    return StepDeps(
        provider=ProviderClient(provider_url_from_env(env)),
        llm=llm,
        context=context,
        remember=remember,
        pace_seconds=pace_from_env(env),
        agent=agent,
    )


def preload(deps: StepDeps) -> None:
    """Load now what the steps would load at their first call, for a process
    that runs steps on an event loop that also heartbeats (``worker.py``, before
    it polls): the OpenAI-compatible model's client (``OpenAIChatModel.preload``,
    ~0.4-0.6 s of imports). The offline model, the provider client and memory
    need nothing. The other processes that build ``StepDeps`` (a status command,
    a resume past the draft) do not call it, so they never import ``openai``.
    The loop's model is preloaded too when it is another instance (``StepDeps``
    built by hand); from ``deps_from_env`` it is the draft's."""
    for model in {id(m): m for m in (deps.llm, deps.agent)}.values():
        if isinstance(model, OpenAIChatModel):
            model.preload()
