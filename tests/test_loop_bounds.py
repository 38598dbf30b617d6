"""The agent loop on Temporal under an operator's hands and a heavy model (issue 41), against the session's
dev server, with in-process workers: what is under test is the workflow's decisions and how the run is
reported, not the activities (stand-ins here, written the way ``durable_agents.activities.run_heartbeating`` ends an
attempt).

- a loop run whose workflow task keeps failing is **parked**, not running: ``loop_status`` says what
  failed it and what to do; ``starter.py status``, ``watch`` and ``loop`` (attached to it) say so and
  exit 3, as for a run of the flow;
- a window that cannot hold the system instructions, the task and one round is refused at the start,
  by the workflow itself, naming what the task needs;
- a turn whose model answers the same error to the same window again and again stops the run within
  ``SAME_ERROR_LIMIT`` attempts, naming the turn; an outage in between is waited out;
- the history bound holds within a turn's retries: the run continues as new, the turn's spending carried;
- a run started under another loop (its recorded ``loop_signature``) is parked, naming both; every turn
  is asked with the prompt and tools the run recorded, whatever this code's are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from durable_agents.flowclient.loop import loop_status, start_loop
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.steps.loop import (
    ONE_ROUND_TOKENS,
    ToolRequest,
    ToolResult,
    TurnRequest,
    TurnResult,
    loop_signature,
    tool_specs,
)
from durable_agents.steps.retry import SAME_ERROR_LIMIT, RetryRule
from durable_agents.workflows.agent_loop import LOOP_WORKFLOW_NAME, AgentLoop
from durable_agents.workflows.loop_state import LoopInput, LoopInstructions
from lab.processes import REPO
from tests.support import EMAIL, poll_until

pytestmark = pytest.mark.process

TASK = "Order A-1001 arrived broken: please refund it."
FAST = RetryRule(initial_interval=0.05, maximum_interval=0.2, jitter=0.0, heartbeat_timeout=5.0)


@workflow.defn(name=LOOP_WORKFLOW_NAME, sandboxed=False)
class CannotRunTheLoop:
    """A deploy whose loop cannot run the run: its workflow task fails every time (a bug; non-determinism
    and a payload over the limit fail it the same way, as Temporal sees it)."""

    @workflow.run
    async def run(self, inp: LoopInput) -> None:
        raise RuntimeError("this deploy cannot run the agent loop")


def starter(dev_server, task_queue: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "starter.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=90)


async def test_a_loop_run_whose_workflow_task_keeps_failing_is_reported_parked(client, dev_server, task_queue):
    run_id = f"parked-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[CannotRunTheLoop]):
        await start_loop(client, run_id, TASK, EMAIL, task_queue=task_queue, rule=FAST)

        async def parked():
            status = await loop_status(client, run_id)
            return status if status["status"] == "parked" else None

        status = await poll_until(parked, timeout=30, what="the loop run to be reported parked")
        assert "WORKFLOW_WORKER_UNHANDLED_FAILURE: this deploy cannot run the agent loop" in status["detail"]
        assert "Deploy code that can replay this run" in status["detail"]
        for command in (["status", run_id], ["watch", run_id], ["loop", run_id, TASK, "--email", EMAIL]):
            shown = starter(dev_server, task_queue, *command)
            assert shown.returncode == 3, (command, shown.stdout, shown.stderr)
            assert f"loop run {run_id}: parked" in shown.stdout, (command, shown.stdout)
            assert "parked: the workflow task has failed since" in shown.stdout, (command, shown.stdout)
    await client.get_workflow_handle(run_id).terminate("test over")


class StandIns:
    """The loop's activities as a script says: a turn fails with the errors given, in order, then answers
    with no tool call."""

    def __init__(self, errors: list[tuple[str, bool]]) -> None:
        self.errors = list(errors)
        self.turns = 0
        self.asked: list[TurnRequest] = []

    @activity.defn(name="model_turn")
    async def model_turn(self, req: TurnRequest) -> TurnResult:
        self.turns += 1
        self.asked.append(req)
        if self.errors:
            message, outage = self.errors.pop(0)
            raise ApplicationError(message, {"seconds": 0.01, "outage": outage}, type="TransientError")
        return TurnResult(turn=req.turn, content="Done.", model="stand-in")

    @activity.defn(name="tool_call")
    async def tool_call(self, req: ToolRequest) -> ToolResult:
        raise AssertionError("no tool call is asked for")


async def run_loop(client, task_queue: str, stand_ins: StandIns, inp: LoopInput):
    async with Worker(client, task_queue=task_queue, workflows=[AgentLoop],
                      activities=[stand_ins.model_turn, stand_ins.tool_call],
                      **{k: v for k, v in worker_options().items() if k == "workflow_runner"}):
        handle = await client.start_workflow(LOOP_WORKFLOW_NAME, inp, id=inp.run_id, task_queue=task_queue)
        try:
            return await handle.result()
        except WorkflowFailureError as err:
            return err.cause


def loop_input(task: str = TASK, **numbers) -> LoopInput:
    return LoopInput(run_id=f"bounds-{uuid.uuid4().hex[:8]}", task=task, email=EMAIL, retry=FAST.to_dict(),
                     **numbers)


async def test_the_same_model_error_on_the_same_window_stops_the_turn(client, task_queue):
    boom = "the LLM server answered HTTP 500: the model failed on this prompt"
    stand_ins = StandIns([(boom, False), ("HTTP 503: busy", True), (boom, False)] + [(boom, False)] * 5)
    failure = await run_loop(client, task_queue, stand_ins, loop_input())
    assert isinstance(failure, ApplicationError), failure
    assert failure.message == (f"step turn-1 failed after 4 attempt(s): the same error on {SAME_ERROR_LIMIT} "
                               "attempts in a row on an unchanged request (an outage would clear or change; this "
                               f"is the answer to the request itself): {boom}")
    assert stand_ins.turns == 4  # the outage (503) between neither counted nor broke the row


async def test_an_outage_is_waited_out_and_errors_that_change_do_not_stop_the_turn(client, task_queue):
    stand_ins = StandIns([("HTTP 503: busy", True)] * 4 + [(f"HTTP 500: error {n}", False) for n in range(4)])
    result = await run_loop(client, task_queue, stand_ins, loop_input())
    assert result["status"] == "completed" and result["answer"] == "Done.", result
    assert stand_ins.turns == 9


async def test_a_window_too_small_for_the_start_is_refused_by_the_workflow(client, task_queue):
    task = TASK + " The parcel was crushed and the glass inside it was broken in pieces." * 8
    stand_ins = StandIns([])
    failure = await run_loop(client, task_queue, stand_ins, loop_input(task, window_tokens=300))
    assert isinstance(failure, ApplicationError) and failure.type == "InputError", failure
    assert "input refused: window tokens of 300 cannot hold the system instructions and the task" in failure.message
    assert f"and one round of a tool call and its result ({ONE_ROUND_TOKENS}): give at least" in failure.message
    assert stand_ins.turns == 0  # refused before the model was asked


async def test_the_history_bound_holds_within_a_turns_retries(client, task_queue):
    """A turn retried past the history bound continues as new before its next attempt: the turn is asked
    in the next run, its spending carried (the attempt numbers go on), and it is one turn in the status."""
    stand_ins = StandIns([("HTTP 503: busy", True)] * 3 + [("HTTP 500: boom", False)] * 2)
    inp = loop_input(history_bound=10)
    result = await run_loop(client, task_queue, stand_ins, inp)
    assert result["status"] == "completed" and result["answer"] == "Done.", result
    assert stand_ins.turns == 6
    status = await loop_status(client, inp.run_id)
    assert len(status["runs"]) >= 3, status["runs"]  # continued as new within the turn's retries
    assert [(t["turn"], t["status"], t["attempts"]) for t in status["turns"]] == [(1, "completed", 6)], status
    # The ledger went with the turn: the attempts kept their numbers across the runs of the chain.
    ids = []
    for temporal_run in status["runs"]:
        history = await client.get_workflow_handle(inp.run_id, run_id=temporal_run).fetch_history()
        ids += [e.activity_task_scheduled_event_attributes.activity_id for e in history.events
                if e.HasField("activity_task_scheduled_event_attributes")]
    assert ids == [f"turn-1/{n}" for n in range(1, 7)], ids


async def test_a_run_under_another_loop_is_parked_naming_the_change(client, task_queue):
    """A deploy that removed a tool: the run recorded the loop it started under, and this code's differs.
    It is not run by a loop it was not started under: parked, the detail naming both signatures."""
    started_under = [line for line in loop_signature() if not line.startswith("tool create_ticket:")]
    inp = loop_input(loop=started_under)
    stand_ins = StandIns([])
    async with Worker(client, task_queue=task_queue, workflows=[AgentLoop],
                      activities=[stand_ins.model_turn, stand_ins.tool_call],
                      **{k: v for k, v in worker_options().items() if k == "workflow_runner"}):
        await client.start_workflow(LOOP_WORKFLOW_NAME, inp, id=inp.run_id, task_queue=task_queue)

        async def parked():
            status = await loop_status(client, inp.run_id)
            return status if status["status"] == "parked" else None

        status = await poll_until(parked, timeout=30, what="the run under another loop to be parked")
    assert "was started by an agent loop of version" in status["detail"], status["detail"]
    assert "Deploy code of the run's own loop" in status["detail"], status["detail"]
    assert stand_ins.turns == 0  # no turn asked by a loop the run did not start under
    await client.get_workflow_handle(inp.run_id).terminate("test over")


async def test_every_turn_is_asked_with_the_instructions_the_run_recorded(client, task_queue):
    """A deploy that changed the prompt and the tools does not change a run in flight: it asks with its own."""
    told = LoopInstructions("You are the run's own agent: answer in one word.", tool_specs()[:1])
    stand_ins = StandIns([("HTTP 500: once", False)])
    result = await run_loop(client, task_queue, stand_ins, loop_input(loop=list(loop_signature()), instructions=told))
    assert result["status"] == "completed", result
    assert [(r.window[0]["content"], r.tools) for r in stand_ins.asked] == [(told.prompt, told.tools)] * 2
