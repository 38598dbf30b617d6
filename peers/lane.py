"""What one peer framework's lane gives the driver (``python -m peers``): the contract every lane module
(``peers/pydantic_ai_lane.py``, ``peers/openai_agents_lane.py``) fills, so the driver runs each the same way,
under the same kills, against the same provider, model stand-in and dev server.

A lane is one framework's durable agent on Temporal, written the way that framework's own documentation
shows it, with the lab's four tools (``lookup_order``, ``issue_refund``, ``send_email``, ``create_ticket``)
calling the lab's provider. A variant is one way of writing its tools:

- ``documented``: the tool as the framework's docs show one; the provider demands an ``Idempotency-Key`` on
  every effect, and a tool written without one in mind sends a fresh key per call (what a request with no key
  amounts to at a receiver that dedups by key);
- ``keyed``: the tool keyed by what the framework gives a tool to identify its call (pydantic-ai's
  ``RunContext.tool_call_id``; under the Agents SDK's ``activity_as_tool``, ``activity.info()``'s workflow id
  and activity id);
- a lane may have more (the Agents SDK: a ``function_tool`` run inside the workflow, and ``activity_as_tool``).

The worker of a lane is its own OS process, so the driver can SIGKILL it: ``worker_argv`` gives its command.
It reads, from its environment: ``TEMPORAL_ADDRESS``, ``PROVIDER_URL``, ``LLM_BASE_URL`` (the model
stand-in's API root, ending in ``/v1``), ``LAB_PEER_RUN`` (the run the worker's model requests are counted
under at the stand-in, sent as ``X-Lab-Run``), and ``CRASH_AT`` (``durable_agents.steps.crashpoints``: the same names in
every lane, listed in ``CRASH_POINTS``). It prints ``worker ready`` once it polls the task queue.
"""

from __future__ import annotations

from typing import Protocol

from temporalio.client import Client, WorkflowHandle

CRASH_POINTS = (
    "tool:issue_refund:after_effect",  # in the tool body, right after the provider's 200 for the refund
    "tool:send_email:after_effect",  # ... for the email
    "tool:create_ticket:after_effect",  # ... for the ticket
    "peer:between_turns",  # a turn's tool results are in, the next model request not yet sent
)
"""Crash points every lane's worker reaches, by the same names as the lab's loop (``durable_agents.steps.loop``). The
fifth fault, a kill during a model request, is made by the driver: the stand-in answers late and the worker is
SIGKILLed while the request is in flight (the stand-in has counted it)."""

READY = "worker ready"


class Lane(Protocol):
    """One framework's lane, as a module the driver imports."""

    NAME: str
    """As the tables name it, e.g. ``"pydantic-ai 2.68.0"`` (the installed version, read at import)."""

    VARIANTS: tuple[str, ...]
    """The ways of writing the tools this lane runs, ``documented`` first."""

    def worker_argv(self, variant: str, task_queue: str) -> list[str]:
        """The command that runs one worker of ``variant`` on ``task_queue`` (a ``python -m ...`` list)."""
        ...

    async def start_run(self, client: Client, *, run_id: str, task: str, email: str, task_queue: str,
                        variant: str) -> WorkflowHandle:
        """Start one agent run with workflow id ``run_id``; its result is the agent's final text."""
        ...
