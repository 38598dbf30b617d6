"""The Agents SDK lane's workflow: one ``agents.Agent`` with the lab's four tools, run by ``Runner.run`` inside a
Temporal workflow, as the integration's README shows (``temporalio.openai_agents``; ``OpenAIAgentsPlugin`` on the
client and the worker turns every model call into the activity ``invoke_model_activity``).

The tools, by the run's variant (``PeerRunInput.variant``):

- ``activity_as_tool``: ``peers.openai_agents_activities`` through ``activity_as_tool``, a fresh key per attempt
  (the README's form for "External I/O and non-deterministic operations");
- ``activity_as_tool_keyed``: the same activities, each effect keyed by its workflow id and activity id;
- ``function_tool``: ``@function_tool`` functions (below). The README: they "execute in the workflow unless
  explicitly backed by a Temporal activity", and are for "deterministic, workflow-safe computation"; here their
  bodies are the lab's tools, which call the provider over HTTP from workflow code. Measured: the workflow
  sandbox refuses it inside the tool (``Cannot access threading.local.__mro_entries__ from inside a workflow``
  when the HTTP client is built; ``Cannot access uuid.uuid4.__call__`` for the fresh key); the Agents SDK's
  default ``failure_error_function`` turns each refusal into the tool's result ("An error occurred while running
  the tool. Please try again. Error: ..."), so the model reads an error, nothing reaches the provider, and the
  run completes. Lifting the sandbox does not help: with ``UnsandboxedWorkflowRunner`` an ``httpx`` request from
  workflow code fails in the workflow's own event loop (``create_connection`` raises ``NotImplementedError``).
  What a user must do instead: make the tool an activity (``activity_as_tool``), or call
  ``workflow.execute_activity`` from the tool's body.

An ``activity_as_tool`` tool is a ``FunctionTool`` with the Agents SDK's default ``failure_error_function`` too: an
activity that fails after its last attempt becomes an error text the model reads, not a failed run (read in
``agents/tool.py`` and ``temporalio/openai_agents/workflow.py``; not measured here).

The options written here, beside each call, are the lab loop's where the integration leaves a choice (the same
clock for every engine): a model attempt is taken for dead after 3 s without a heartbeat (the integration's model
activity heartbeats at half its heartbeat timeout) and a tool attempt after 3 s (a tool takes milliseconds: a
heartbeat timeout with no heartbeat ends an attempt whose worker died 3 s after it started); every retry bounded
(5 attempts; Temporal's default is unlimited); at most ``MAX_TURNS`` model turns (the lab loop's default; the
Agents SDK's is 10).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from agents import Agent, RunConfig, RunContextWrapper, Runner, Tool, function_tool
    from temporalio.openai_agents.workflow import activity_as_tool

    from durable_agents.steps.loop import DEFAULT_MAX_TURNS, LOOP_SYSTEM_PROMPT
    from peers import openai_agents_activities as tool_activities
    from peers import tools
    from peers.openai_agents_activities import CustomerRun

WORKFLOW_NAME = "OpenAIAgentsPeerRun"
MODEL_NAME = "lab-model-stand-in"  # any name: the stand-in answers every one
MAX_TURNS = DEFAULT_MAX_TURNS
VARIANTS = ("activity_as_tool", "activity_as_tool_keyed", "function_tool")
"""``activity_as_tool`` first: the form the README gives a tool with I/O (``peers.lane``: the documented form first)."""

MODEL_RETRY = RetryPolicy(maximum_attempts=5)
MODEL_START_TO_CLOSE = timedelta(seconds=60)
MODEL_HEARTBEAT = timedelta(seconds=3)
TOOL_RETRY = RetryPolicy(maximum_attempts=5)
TOOL_START_TO_CLOSE = timedelta(seconds=10)
TOOL_HEARTBEAT = timedelta(seconds=3)


@dataclass
class PeerRunInput:
    task: str
    email: str
    variant: str


# ---------------------------------------------------------------- the function_tool variant: tools in the workflow


def _text(answer: tools.JsonDict) -> str:
    return json.dumps(answer, ensure_ascii=False)


@function_tool
async def lookup_order(ctx: RunContextWrapper[CustomerRun], order_id: str) -> str:
    """Look up an order: its total and how much of it was already refunded, in cents."""
    async with tools.provider() as client:
        return _text(await tools.lookup_order(client, run_id=ctx.context.run_id, order_id=order_id))


@function_tool
async def issue_refund(ctx: RunContextWrapper[CustomerRun], order_id: str, amount: int) -> str:
    """Refund part or all of an order, in cents. Never more than the order's total in all."""
    async with tools.provider() as client:
        return _text(await tools.issue_refund(client, run_id=ctx.context.run_id, order_id=order_id, amount=amount,
                                              idempotency_key=tools.fresh_key()))


@function_tool
async def send_email(ctx: RunContextWrapper[CustomerRun], subject: str, body: str) -> str:
    """Send an email to the customer of this conversation."""
    run = ctx.context
    async with tools.provider() as client:
        return _text(await tools.send_email(client, run_id=run.run_id, to=run.email, subject=subject, body=body,
                                            idempotency_key=tools.fresh_key()))


@function_tool
async def create_ticket(ctx: RunContextWrapper[CustomerRun], summary: str) -> str:
    """Record the outcome in the ticket system, in one line."""
    async with tools.provider() as client:
        return _text(await tools.create_ticket(client, run_id=ctx.context.run_id, summary=summary,
                                               idempotency_key=tools.fresh_key()))


FUNCTION_TOOLS: list[Tool] = [lookup_order, issue_refund, send_email, create_ticket]


def activity_tools() -> list[Tool]:
    return [activity_as_tool(fn, start_to_close_timeout=TOOL_START_TO_CLOSE, heartbeat_timeout=TOOL_HEARTBEAT,
                             retry_policy=TOOL_RETRY)
            for fn in tool_activities.ACTIVITIES]


def tools_of(variant: str) -> list[Tool]:
    if variant == "function_tool":
        return FUNCTION_TOOLS
    if variant in ("activity_as_tool", "activity_as_tool_keyed"):
        return activity_tools()
    raise ValueError(f"unknown variant {variant!r}: give one of {', '.join(VARIANTS)}")


@workflow.defn(name=WORKFLOW_NAME)
class OpenAIAgentsPeerRun:
    @workflow.run
    async def run(self, inp: PeerRunInput) -> str:
        context = CustomerRun(run_id=workflow.info().workflow_id, email=inp.email,
                              keyed=inp.variant == "activity_as_tool_keyed")
        agent = Agent[CustomerRun](name="customer-service", instructions=LOOP_SYSTEM_PROMPT, model=MODEL_NAME,
                                   tools=tools_of(inp.variant))
        # No tracing: its default exporter sends spans to OpenAI's servers; this lab has no network.
        result = await Runner.run(agent, inp.task, context=context, max_turns=MAX_TURNS,
                                  run_config=RunConfig(tracing_disabled=True))
        return str(result.final_output)
