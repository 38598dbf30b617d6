"""The models: the one behind the flow's first step, "draft" (task plus
conversation context in, a checked :class:`Draft`: subject, body, one-line
summary, out), and the one that chooses the tools of the agent loop
(``durable_agents.steps.loop``: the window and the tools in, text and tool calls out).

The draft's model, chosen by :func:`model_from_env`:

- :class:`OfflineModel` (the default): a deterministic template, no network.
  Same messages, same draft, which the lab's crash-and-resume demos rely on.
- :class:`OpenAIChatModel`: any OpenAI-compatible chat-completions server.

The loop's model (``durable_agents.steps.ports.ToolModel``), chosen by :func:`agent_from_env`
from the same variables:

- :class:`ScriptedModel` (the default): a fixed script that decides from the
  window it is given (``durable_agents.drafting.scripted``), no network;
- :class:`OpenAIChatModel` (``turn``): the same server and settings as the
  draft's; the model must support tool calling (Ollama: llama3.1, qwen2.5).
  ``durable_agents.wiring.deps_from_env`` gives both steps one instance: one client.

Environment variables:

``LLM_BASE_URL``
    API root of an OpenAI-compatible server. Unset or empty: the offline model
    for the draft, the scripted model for the loop.
``LLM_OFFLINE_VARY``
    ``1``: the offline model words every answer differently, like a real model
    (for the lab's non-determinism checks). Default ``0``: deterministic.
    For the loop, ``1`` makes the scripted model number its words and give
    random tool call ids, so a turn asked again shows.
``LLM_MODEL``
    Model name on that server. Required when ``LLM_BASE_URL`` is set. For the
    loop, a model that supports tool calling.
``LLM_API_KEY``
    Sent as the bearer token. Optional: local servers ignore it.
``LLM_TIMEOUT``
    Seconds each request may take (default 30). Local models on a CPU are slow;
    raise it rather than let every draft time out. One draft makes up to two
    requests (an unusable answer is asked again once), and both must fit the
    draft's attempt timeout (60 s), or the attempt's timeout, not the model's
    answer, decides how the draft ends: keep it at most 25 s, or raise
    ``LAB_ATTEMPT_TIMEOUT_SECONDS`` with it (docs/operations.md).
``LLM_JSON_MODE``
    ``1`` (default) sends ``response_format={"type": "json_object"}``; ``0``
    leaves it out, for servers that refuse that field. The loop's turn never
    sends it (its answer is tool calls, not JSON).

``LLM_TIMEOUT`` bounds each request of a turn too; a turn makes up to two
requests like a draft (an answer with neither text nor a readable tool call is
asked again once). The lab's stand-in server, ``python -m durable_agents.testing.standin``,
serves the scripted model (and the offline draft) over this API, so the loop
and the flow can run against ``LLM_BASE_URL`` with no real model.

Example, with Ollama on this machine (``ollama pull llama3.1`` first)::

    LLM_BASE_URL=http://localhost:11434/v1 LLM_MODEL=llama3.1 python worker.py

Models do not retry: a failed request raises ``TransientError`` or
``PermanentError`` (see :mod:`durable_agents.steps.errors`) and the durable engine decides.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from durable_agents.steps.ports import ToolModel

from .base import Draft, DraftError, LanguageModel, make_draft
from .offline import OfflineModel
from .openai_compat import OpenAIChatModel
from .scripted import ScriptedModel

__all__ = [
    "Draft",
    "DraftError",
    "LanguageModel",
    "OfflineModel",
    "OpenAIChatModel",
    "ScriptedModel",
    "agent_from_env",
    "make_draft",
    "model_from_env",
]

DEFAULT_TIMEOUT = 30.0


def model_from_env(env: Mapping[str, str] = os.environ) -> LanguageModel:
    """The model the environment asks for; see the module docstring for the variables.

    Raises ``ValueError`` naming the variable to fix when a setting is unusable,
    so a misconfigured worker stops at start-up instead of failing every run.
    """
    base_url = (env.get("LLM_BASE_URL") or "").strip()
    if not base_url:
        return OfflineModel(vary=_vary(env))
    return _openai_from_env(env, base_url)


def agent_from_env(env: Mapping[str, str] = os.environ) -> ToolModel:
    """The agent loop's model the environment asks for: the scripted model when ``LLM_BASE_URL`` is unset,
    else an :class:`OpenAIChatModel` with the settings :func:`model_from_env` reads (and its ``ValueError``s).

    A process that runs both the draft and the loop should share one instance (``durable_agents.wiring.deps_from_env``
    does): this function builds a new one."""
    base_url = (env.get("LLM_BASE_URL") or "").strip()
    if not base_url:
        return ScriptedModel(vary=_vary(env))
    return _openai_from_env(env, base_url)


def _vary(env: Mapping[str, str]) -> bool:
    vary = (env.get("LLM_OFFLINE_VARY") or "0").strip()
    if vary not in ("0", "1"):
        raise ValueError(f"LLM_OFFLINE_VARY={vary!r} must be 0 or 1 (1: the offline model varies every answer)")
    return vary == "1"


def _openai_from_env(env: Mapping[str, str], base_url: str) -> OpenAIChatModel:
    if not base_url.lower().startswith(("http://", "https://")):
        raise ValueError(
            f"LLM_BASE_URL={base_url!r} is not an http(s) URL: give the API root, "
            "e.g. LLM_BASE_URL=http://localhost:11434/v1 for Ollama"
        )
    model = (env.get("LLM_MODEL") or "").strip()
    if not model:
        raise ValueError(
            "LLM_BASE_URL is set but LLM_MODEL is not: set LLM_MODEL to the model name the server knows, "
            "e.g. LLM_MODEL=llama3.1 for Ollama (or unset LLM_BASE_URL to use the offline model)"
        )
    api_key = env.get("LLM_API_KEY") or None
    return OpenAIChatModel(
        base_url,
        model,
        api_key=api_key,
        timeout=_timeout(env.get("LLM_TIMEOUT")),
        json_mode=_json_mode(env.get("LLM_JSON_MODE")),
    )


def _timeout(raw: str | None) -> float:
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"LLM_TIMEOUT={raw!r} is not a positive number of seconds: use e.g. LLM_TIMEOUT=25")
    return value


def _json_mode(raw: str | None) -> bool:
    if raw is None or not raw.strip():
        return True
    value = raw.strip()
    if value not in ("0", "1"):
        raise ValueError(f"LLM_JSON_MODE={raw!r} must be 0 or 1 (1 sends response_format json_object)")
    return value == "1"
