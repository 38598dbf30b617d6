"""The lab's agent written in pydantic-ai, made durable on Temporal the way pydantic-ai documents it.

An ``Agent`` with an OpenAI chat model pointed at the model stand-in (``LLM_BASE_URL``), the lab's
instructions (``durable_agents.steps.loop.LOOP_SYSTEM_PROMPT``), the four tools as ``@agent.tool`` functions over the
shared bodies (``peers.tools``), and the ``TemporalDurability`` capability (``pydantic_ai.durable_exec.temporal``):
model requests and tool calls run as Temporal activities. In pydantic-ai 2.68.0 that capability is what the
docs show; the ``TemporalAgent`` wrapper the issue names is deprecated in its favour (its deprecation message
says how each argument moves) and does the same thing.

Built at import, in the worker's process and never in workflow code (pydantic-ai refuses an agent built
inside a workflow): the workflow module imports this one passed through the sandbox.

Where the lab's faults sit:

- ``tool:<name>:after_effect``: in the shared tool bodies, right after the provider's 200 (``peers.tools``);
- ``peer:between_turns``: in ``BetweenTurns``, the model this agent is given, which wraps the OpenAI chat
  model and is what the model-request activity calls. When a request's newest message holds tool results
  (turn 2 on), the turn before it is recorded in history and its tool calls completed, and this request is
  not yet sent: the point the lab's loop calls ``<engine>:loop:after_turn``. A wrapper model is the one place
  pydantic-ai runs user code inside the model activity without patching it.

The keys: ``documented`` sends ``peers.tools.fresh_key()`` per call (the tool as pydantic-ai's docs write one,
with no key in mind); ``keyed`` derives the key from the run and ``RunContext.tool_call_id`` (the model's id of
the call, which ``TemporalRunContext`` carries into the tool's activity).

The worker's model requests carry ``X-Lab-Run: $LAB_PEER_RUN`` (the OpenAI client's default headers), so the
stand-in counts them under the run; it counts each under the turn its window implies.

Timeouts: pydantic-ai's defaults are a 60 s ``start_to_close_timeout`` for every activity and a 30 s heartbeat
timeout for model requests (its activities heartbeat in the background). A SIGKILLed worker's attempt would
then be retried only after those: the lanes run with the lab's own 3 s heartbeat timeout
(``durable_agents.steps.retry.DEFAULT_HEARTBEAT_TIMEOUT``) on every activity, so the clock compares like with like.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent, RunContext
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from temporalio.workflow import ActivityConfig

from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.loop import LOOP_SYSTEM_PROMPT
from durable_agents.steps.retry import DEFAULT_HEARTBEAT_TIMEOUT
from peers import tools

AGENT_NAME = "lab_peer_agent"
MODEL_NAME = "lab-model-stand-in"
RUN_HEADER = "X-Lab-Run"


@dataclass
class PeerDeps:
    """What a run's tools need: the run (the workflow id), the customer's address, the variant of the keys."""

    run_id: str
    email: str
    variant: str = "documented"


class BetweenTurns(WrapperModel):
    """The chat model, with the ``peer:between_turns`` crash point where a turn after the first begins."""

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        newest = messages[-1] if messages else None
        if isinstance(newest, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in newest.parts):
            crash_point("peer:between_turns")
        return await super().request(messages, model_settings, model_request_parameters)


def _model() -> BetweenTurns:
    base_url = os.environ.get("LLM_BASE_URL", "")
    if not base_url:
        raise SystemExit("LLM_BASE_URL is not set: point it at the model stand-in's API root (python -m "
                         "durable_agents.testing.standin prints it), ending in /v1")
    client = AsyncOpenAI(base_url=base_url, api_key="lab-stand-in", max_retries=0,
                         default_headers={RUN_HEADER: os.environ.get("LAB_PEER_RUN", "-")})
    return BetweenTurns(OpenAIChatModel(MODEL_NAME, provider=OpenAIProvider(openai_client=client)))


_ACTIVITIES = ActivityConfig(start_to_close_timeout=timedelta(seconds=60),
                             heartbeat_timeout=timedelta(seconds=DEFAULT_HEARTBEAT_TIMEOUT))

agent: Agent[PeerDeps, str] = Agent(
    _model(),
    name=AGENT_NAME,
    deps_type=PeerDeps,
    instructions=LOOP_SYSTEM_PROMPT,
    capabilities=[TemporalDurability(activity_config=_ACTIVITIES, model_activity_config=_ACTIVITIES)],
)

_provider = tools.provider()


def _key(ctx: RunContext[PeerDeps], tool: str) -> str:
    if ctx.deps.variant == "keyed":
        return tools.call_key(ctx.deps.run_id, tool, ctx.tool_call_id or "")
    return tools.fresh_key()


@agent.tool
async def lookup_order(ctx: RunContext[PeerDeps], order_id: str) -> dict[str, Any]:
    """Look up an order: its total and how much of it was already refunded, in cents."""
    return await tools.lookup_order(_provider, run_id=ctx.deps.run_id, order_id=order_id)


@agent.tool
async def issue_refund(ctx: RunContext[PeerDeps], order_id: str, amount: int) -> dict[str, Any]:
    """Refund part or all of an order, in cents. Never more than the order's total in all."""
    return await tools.issue_refund(_provider, run_id=ctx.deps.run_id, order_id=order_id, amount=amount,
                                    idempotency_key=_key(ctx, "issue_refund"))


@agent.tool
async def send_email(ctx: RunContext[PeerDeps], subject: str, body: str) -> dict[str, Any]:
    """Send an email to the customer of this conversation."""
    return await tools.send_email(_provider, run_id=ctx.deps.run_id, to=ctx.deps.email, subject=subject, body=body,
                                  idempotency_key=_key(ctx, "send_email"))


@agent.tool
async def create_ticket(ctx: RunContext[PeerDeps], summary: str) -> dict[str, Any]:
    """Record the outcome in the ticket system, in one line."""
    return await tools.create_ticket(_provider, run_id=ctx.deps.run_id, summary=summary,
                                     idempotency_key=_key(ctx, "create_ticket"))
