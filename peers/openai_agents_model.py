"""The model the Agents SDK lane's worker gives ``OpenAIAgentsPlugin``: chat completions against the lab's
model stand-in, and the crash point ``peer:between_turns``.

The plugin runs every model call as its activity (``invoke_model_activity``) and asks the ``model_provider``
it was given for the model there, on the worker; that parameter is the plugin's own hook for "custom model
integrations", and the only place a worker decides how the model is reached. So:

- **Chat completions, not the Responses API.** The stand-in (``durable_agents.testing.standin``) speaks chat completions
  only: the Agents SDK's ``OpenAIProvider(use_responses=False)`` gives ``OpenAIChatCompletionsModel`` for any
  model name, on an ``AsyncOpenAI`` client at ``LLM_BASE_URL``.
- **``max_retries=0`` on that client**, as the plugin's own default provider has it (``ModelActivity``'s
  docstring: "Disabling retries in your model of choice is recommended to allow activity retries to define
  the retry model"): a failed request fails the activity attempt, and Temporal's retry policy retries it.
- **``X-Lab-Run``**, a default header of the client, from ``LAB_PEER_RUN``: the stand-in counts every model
  request under it (and under the turn the request's window implies: it sends no ``X-Lab-Turn``).
- **``peer:between_turns``** (``durable_agents.steps.crashpoints``): the model activity of a turn after the first,
  before its request is sent. The activity's input (in ``ActivityTaskScheduled``, so in the history) holds the tool
  results of the turn before it; nothing of the next turn has been asked. A turn after the first is one whose
  input holds a tool result (an item of type ``function_call_output``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from agents import Model, ModelProvider, ModelResponse, OpenAIProvider
from openai import AsyncOpenAI

from durable_agents.steps.crashpoints import crash_point

BETWEEN_TURNS = "peer:between_turns"
# durable_agents.testing.standin.RUN_HEADER; not imported: the stand-in's module starts a server's imports
RUN_HEADER = "X-Lab-Run"
NO_KEY = "lab-stand-in"
"""The API key sent when ``OPENAI_API_KEY`` is unset: the stand-in takes any; the client refuses none."""


def model_provider(env: dict[str, str] | None = None) -> ModelProvider:
    """The provider for the plugin's ``model_provider=`` (see the module docstring); ``ValueError`` naming the
    variable when ``LLM_BASE_URL`` is unset."""
    env = dict(os.environ) if env is None else env
    base_url = env.get("LLM_BASE_URL", "").strip()
    if not base_url:
        raise ValueError("LLM_BASE_URL is unset: give the model stand-in's API root, e.g. http://127.0.0.1:PORT/v1 "
                         "(python -m durable_agents.testing.standin prints it)")
    headers = {RUN_HEADER: quote(env.get("LAB_PEER_RUN", "-"), safe="")}
    client = AsyncOpenAI(base_url=base_url, api_key=env.get("OPENAI_API_KEY") or NO_KEY, max_retries=0,
                         default_headers=headers)
    return BetweenTurnsProvider(OpenAIProvider(openai_client=client, use_responses=False))


class BetweenTurnsProvider(ModelProvider):
    """``inner``'s models, each with the crash point ``peer:between_turns`` before a request after the first."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner

    def get_model(self, model_name: str | None) -> Model:
        return BetweenTurnsModel(self.inner.get_model(model_name))

    async def aclose(self) -> None:
        await self.inner.aclose()


def after_a_tool_result(input: str | list[Any]) -> bool:
    """Whether a model request's input holds a tool result: the request of a turn after the first."""
    if isinstance(input, str):
        return False
    return any(_kind(item) == "function_call_output" for item in input)


def _kind(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


class BetweenTurnsModel(Model):
    def __init__(self, inner: Model) -> None:
        self.inner = inner

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        if after_a_tool_result(input):
            # The previous turn's tool results are in this activity's recorded input; no request is sent yet.
            crash_point(BETWEEN_TURNS)
        return await self.inner.get_response(system_instructions, input, *args, **kwargs)

    def stream_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if after_a_tool_result(input):
            crash_point(BETWEEN_TURNS)
        return self.inner.stream_response(system_instructions, input, *args, **kwargs)

    async def close(self) -> None:
        await self.inner.close()
