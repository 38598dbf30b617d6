"""The engine's floor for bench_loop.py: the agent loop on Temporal with nothing of the lab's workflow logic.

``BareLoop`` asks a turn, runs its calls one after the other, appends each answer and result to memory's
window (the same ``DerivedWindow`` under the same bounds as ``durable_agents.workflows.agent_loop``, so each turn's
prompt is the same), and ends at the first turn that asks for no tool. Its two activities call the same step
functions the lab's do (``durable_agents.steps.loop.model_turn``, ``durable_agents.steps.loop.run_tool``), with the same
dependencies, plainly: no heartbeating wrapper, no served-agent lookup, no reset reuse. The workflow has no retry
ledger, no progress state, no details text, no history bound, no crash points, no version checks, and
schedules each activity with Temporal's own retry policy. What the lab's loop costs over this is its
workflow's work and what its activities wrap around the steps.

With ``local_reads`` a call of a read-only tool (no effect: running it again applies nothing) is a local
activity, run by the worker inside the workflow task that scheduled it and recorded as a marker: one
activity dispatch fewer per such call. A lane of its own in bench_loop.py (``bare-local``): what that
change would save the lab's loop, measured before anyone makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agents.memory import DerivedWindow, MemoryPolicy
    from durable_agents.steps import loop
    from durable_agents.steps.flow import StepDeps
    from durable_agents.steps.loop import LoopInputs, ToolRequest, ToolResult, TurnRequest, TurnResult
    from durable_agents.steps.refund_agent import REFUND_TOOLS

TIMEOUT = timedelta(seconds=30)


@dataclass
class BareLoopInput:
    run_id: str
    task: str
    email: str
    max_turns: int
    local_reads: bool = False


class BareLoopActivities:
    """The two steps, as plain activities on one worker's dependencies."""

    def __init__(self, deps: StepDeps) -> None:
        self.deps = deps

    @activity.defn(name="bare_model_turn")
    async def turn(self, req: TurnRequest) -> TurnResult:
        return await loop.model_turn(req, self.deps)

    @activity.defn(name="bare_tool_call")
    async def call(self, req: ToolRequest) -> ToolResult:
        return await loop.run_tool(req, self.deps)

    def all(self) -> list:
        return [self.turn, self.call]


@workflow.defn(name="BenchBareLoop")
class BareLoop:
    @workflow.run
    async def run(self, inp: BareLoopInput) -> str:
        inputs = LoopInputs(inp.run_id, inp.task, inp.email, max_turns=inp.max_turns)
        window = DerivedWindow(MemoryPolicy(max_tokens=inputs.window_tokens, max_messages=inputs.window_messages))
        window.add(*loop.system_message(), pin=True)
        window.add(*loop.task_message(inputs))
        for turn in range(1, inputs.max_turns + 1):
            answer = await workflow.execute_activity(
                BareLoopActivities.turn, TurnRequest(inputs.run_id, turn, window.prompt(), inputs.max_turns,
                                                     inputs.window_tokens), start_to_close_timeout=TIMEOUT)
            window.add(*loop.turn_message(answer))
            if not answer.calls:
                return answer.content
            for index, call in enumerate(answer.calls):
                request = loop.tool_request(inputs, turn, index, call)
                if inp.local_reads and call.name not in REFUND_TOOLS.effects:
                    result = await workflow.execute_local_activity(BareLoopActivities.call, request,
                                                                   start_to_close_timeout=TIMEOUT)
                else:
                    result = await workflow.execute_activity(BareLoopActivities.call, request,
                                                             start_to_close_timeout=TIMEOUT)
                window.add(*loop.result_message(answer, result))
        raise ApplicationError(f"turn limit of {inputs.max_turns} reached", non_retryable=True)
