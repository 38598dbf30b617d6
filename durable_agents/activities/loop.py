"""The agent loop's two activities, around the engine-agnostic steps of ``durable_agents.steps.loop``.

- ``model_turn(TurnRequest) -> TurnResult`` (activity name ``model_turn``):
  one turn of the model on the prompt the workflow derived (``req.window``).
  No effect: an unexpected error is retried, never in doubt.
- ``tool_call(ToolRequest) -> ToolResult`` (activity name ``tool_call``): one
  tool call of a recorded turn, under the key the workflow derived
  (``durable_agents.steps.loop.tool_key``, in the request, so in the history and the same on
  every attempt). A call of a tool with an effect (its agent's ``Toolbox.effects``; the lab's:
  ``issue_refund``, ``send_email``, ``create_ticket``) is in doubt on an
  unexpected error, like a flow step with an effect; ``lookup_order`` reads.

Both run through the wrapper every activity shares (``durable_agents.activities.run_heartbeating``):
heartbeats (a killed worker is noticed after the run's heartbeat timeout),
the started line ``step <name> started: run <run id> attempt <n>`` under the
loop step's name (``turn-3``, ``turn-3/call-1``; ``durable_agents.steps.loop``), and the
error mapping the workflow's retry rules read (``durable_agents.steps.retry``). The attempt
number comes from the activity id the workflow gives each attempt:
``turn-<n>/<attempt>``, ``turn-<n>/call-<i>/<attempt>``.

A turn asked in a run that a reset made (``TurnRequest.started_as`` names another run) is first looked for
in what the runs before it recorded (``durable_agents.activities.recorded_turns``): found, that record is the answer
(``reused=True``) and the model is not asked, so its calls keep their recorded keys.

What the model chose is untrusted: the tool step checks it and answers a
refused call with a ``refused`` result, nothing applied (``durable_agents.steps.loop.run_tool``);
only what cannot be answered so (an idempotency conflict, a model answer the
turn refuses, the turn limit) fails the run.
"""

from __future__ import annotations

import dataclasses

from temporalio import activity

from durable_agents.activities import run_heartbeating, step_attempt
from durable_agents.activities.recorded_turns import recorded_turn
from durable_agents.steps import loop
from durable_agents.steps.errors import TransientError
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.limits import InputError
from durable_agents.steps.loop import ToolRequest, ToolResult, TurnRequest, TurnResult
from durable_agents.steps.served import REFUND, Served, find

MODEL_TURN = "model_turn"
TOOL_CALL = "tool_call"
"""The activity names: histories record them, so they never change."""


class LoopActivities:
    """The loop's activities, bound to the dependencies of one worker process (``StepDeps.agent``: the
    model of an agent declared without one; ``StepDeps.provider``: the lab's orders, refunds, emails and
    tickets) and to the agents it serves (``served``, ``durable_agents.steps.served.serve``; None: the refund agent
    alone, its tools given ``deps``). A run is run by the agent it names, or its task fails, naming what this
    worker serves, and is retried under the run's rule (a worker that serves it may take it)."""

    def __init__(self, deps: StepDeps | None, *, served: list[Served] | None = None,
                 heartbeat_every: float = 0.3) -> None:
        self.deps = deps
        self.served = {s.name: s for s in (served if served is not None else [REFUND])}
        self.heartbeat_every = heartbeat_every

    def _agent(self, name: str) -> Served:
        try:
            return find(self.served, name, "this worker")
        except InputError as err:
            raise TransientError(str(err)) from None

    @activity.defn(name=MODEL_TURN)
    async def model_turn(self, req: TurnRequest) -> TurnResult:
        return await run_heartbeating(self._turn(req), name=loop.turn_step(req.turn),
                                      effect=False, heartbeat_every=self.heartbeat_every)

    async def _turn(self, req: TurnRequest) -> TurnResult:
        info = activity.info()
        workflow_id, run = info.workflow_id, info.workflow_run_id
        if req.started_as and workflow_id and run and req.started_as != run:  # asked in a run a reset made
            recorded = await recorded_turn(activity.client(), workflow_id, run, req.turn, turn_activity=MODEL_TURN)
            if recorded is not None:
                return dataclasses.replace(recorded, reused=True)
        return await loop.model_turn(req, self.deps, self._agent(req.agent).agent)

    @activity.defn(name=TOOL_CALL)
    async def tool_call(self, req: ToolRequest) -> ToolResult:
        served = self._agent(req.agent)
        return await run_heartbeating(loop.run_tool(req, self.deps, served.agent, served.services,
                                                    attempt=step_attempt()),
                                      name=loop.call_step(req.turn, req.index),
                                      effect=req.call.name in served.agent.tools.effects,
                                      heartbeat_every=self.heartbeat_every)

    def all(self) -> list:
        return [self.model_turn, self.tool_call]
