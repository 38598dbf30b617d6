"""Where a reset run looks for a turn already recorded (``durable_agents.activities.recorded_turns``), on histories
built here, in process: the base of the reset, the base of a base (a reset of a reset run), the run a base
continued as new into (a reset of an earlier run of a chain), the runs the reset run continued into; and
no reuse once a turn since the reset was asked of the model, even where a base holds the turn; and how
``status`` and ``watch`` show a reused turn.
(tests/test_loop_resets.py proves the whole of it with the CLI, worker processes and the provider.)"""

from __future__ import annotations

from typing import Any, cast

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter

from durable_agents.activities.loop import MODEL_TURN
from durable_agents.activities.recorded_turns import recorded_turn
from durable_agents.flowclient.loop import REUSED_NOTE, loop_lines, loop_ticker
from durable_agents.steps.loop import TurnResult
from durable_agents.workflows.agent_loop import LOOP_RESET_PATCH

WF = "loop-1"


class _Histories:
    """Just what ``recorded_turn`` asks of a client: a history by (workflow id, run id)."""

    namespace = "default"
    data_converter = DataConverter.default

    def __init__(self) -> None:
        self.runs: dict[str, list[HistoryEvent]] = {}
        self.read: list[str] = []

    def get_workflow_handle(self, workflow_id: str, *, run_id: str) -> Any:
        histories = self

        class Handle:
            async def fetch_history(self) -> WorkflowHistory:
                histories.read.append(run_id)
                return WorkflowHistory(workflow_id, histories.runs[run_id])

        return Handle()

    async def run(self, run_id: str, *steps: tuple[str, Any], continued_from: str = "") -> None:
        """Record run ``run_id``: ``("turn", TurnResult)``, ``("reset", base run id)``, ``("can", next run id)``."""
        events = [HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)]
        events[0].workflow_execution_started_event_attributes.continued_execution_run_id = continued_from
        for kind, value in steps:
            eid = len(events) + 1
            if kind == "turn":
                scheduled = HistoryEvent(event_id=eid, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
                scheduled.activity_task_scheduled_event_attributes.activity_type.name = MODEL_TURN
                done = HistoryEvent(event_id=eid + 1, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
                done.activity_task_completed_event_attributes.scheduled_event_id = eid
                done.activity_task_completed_event_attributes.result.payloads.extend(
                    await self.data_converter.encode([value]))
                events += [scheduled, done]
            elif kind == "reset":
                failed = HistoryEvent(event_id=eid, event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
                failed.workflow_task_failed_event_attributes.cause = \
                    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
                failed.workflow_task_failed_event_attributes.base_run_id = value
                events.append(failed)
            else:
                can = HistoryEvent(event_id=eid, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW)
                can.workflow_execution_continued_as_new_event_attributes.new_execution_run_id = value
                events.append(can)
        self.runs[run_id] = events


def turn(run: str, n: int, *, reused: bool = False) -> tuple[str, TurnResult]:
    return "turn", TurnResult(n, f"{run}'s turn {n}", reused=reused)


async def found(histories: _Histories, asking: str, n: int) -> str | None:
    result = await recorded_turn(cast(Client, histories), WF, asking, n, turn_activity=MODEL_TURN)
    return result.content if result is not None else None


async def test_a_reset_run_finds_its_bases_turns_and_a_reset_of_a_reset_the_older_ones():
    h = _Histories()
    await h.run("B", turn("B", 1), turn("B", 2), turn("B", 3), turn("B", 4))
    await h.run("R1", turn("B", 1), ("reset", "B"), turn("B", 2, reused=True))  # reset again while at turn 3
    await h.run("R2", turn("B", 1), ("reset", "R1"))
    assert await found(h, "R1", 3) == "B's turn 3"
    assert await found(h, "R2", 2) == "B's turn 2"  # R1's record of it: B's, reused
    assert await found(h, "R2", 3) == "B's turn 3"  # past R1's record: R1's own base
    assert await found(h, "R2", 5) is None  # no run recorded it: ask the model


async def test_a_turn_asked_since_the_reset_ends_the_reuse():
    h = _Histories()
    await h.run("B", turn("B", 1), turn("B", 2), turn("B", 3))
    await h.run("R", turn("B", 1), ("reset", "B"), turn("R", 2))  # turn 2 asked of the model, not reused
    assert await found(h, "R", 3) is None
    await h.run("R'", continued_from="R")
    assert await found(h, "R'", 3) is None


async def test_the_turns_after_a_reset_base_are_in_the_runs_it_continued_into():
    h = _Histories()
    await h.run("C1", turn("C1", 1), turn("C1", 2), ("can", "C2"))
    await h.run("C2", turn("C2", 3), turn("C2", 4), ("can", "C3"), continued_from="C1")
    await h.run("C3", turn("C3", 5), continued_from="C2")
    await h.run("R", turn("C1", 1), ("reset", "C1"), turn("C1", 2, reused=True), ("can", "R'"))
    await h.run("R'", turn("C2", 3, reused=True), continued_from="R")
    assert await found(h, "R", 3) == "C2's turn 3"
    assert await found(h, "R'", 4) == "C2's turn 4"
    assert await found(h, "R'", 5) == "C3's turn 5"
    h.read.clear()
    assert await found(h, "R'", 6) is None
    assert sorted(h.read) == ["C1", "C2", "C3", "R", "R'"]  # each history read once


def test_the_reset_patch_keeps_its_recorded_id():
    """Histories carry the id (tests/data/histories/db31b1c50abf/loop-reset-second.json: a reset run that
    reused its base's turns); a changed value would send a reset of a run recorded under it down the old
    path, asking its turns again."""
    assert LOOP_RESET_PATCH == "loop-reset-reuses-turns"


def test_a_reused_turn_says_so_in_status_and_watch():
    """``loop_status`` marks each turn ``reused`` (tests/test_loop_resets.py reads it from real resets); the
    text of ``status`` and the lines of ``watch`` say so on that turn's line, and on no other."""
    call = {"index": 0, "name": "lookup_order", "key": None, "status": "completed", "attempts": 1, "crashes": 0,
            "last_error": None, "run": 0, "outcome": "ok", "arguments": '{"order_id": "A-1001"}', "result": "{}"}
    status = {"run_id": WF, "status": "completed", "turn": 2, "max_turns": 20, "answer": "Done.",
              "turns": [{"turn": 1, "status": "completed", "attempts": 1, "reused": False, "calls": [call]},
                        {"turn": 2, "status": "completed", "attempts": 1, "reused": True, "calls": []}]}
    lines = loop_lines(status)
    assert "  turn 1: completed: asked for lookup_order" in lines, lines
    assert f"  turn 2: completed: the final answer (no tool) ({REUSED_NOTE})" in lines, lines
    ticked: list[str] = []
    loop_ticker(out=ticked.append)(status)
    turn_lines = [line for line in ticked if ": completed (attempt 1): " in line and " turn-" in line]
    assert [REUSED_NOTE in line for line in turn_lines] == [False, True], ticked


def test_watch_says_when_a_reset_replaced_the_runs_it_followed():
    """The chain's runs as ``watch`` saw them give way to a reset run's: a line says so, and the reset run's
    turns are told again from the first (a turn it reused, marked); a continue-as-new (the runs extended)
    says nothing of the kind."""
    def status(runs: list[str], reused: bool) -> dict[str, Any]:
        return {"run_id": WF, "status": "running", "turn": 1, "max_turns": 20, "runs": runs,
                "turns": [{"turn": 1, "status": "completed", "attempts": 1, "reused": reused, "calls": []}]}
    ticked: list[str] = []
    tick = loop_ticker(out=ticked.append)
    tick(status(["r1"], False))
    tick(status(["r1", "r2"], False))  # continued as new: nothing to tell again
    assert len(ticked) == 1 and "reset" not in ticked[0], ticked
    tick(status(["r3"], True))
    assert "reset: run r2 was closed by a reset; following run r3" in ticked[1], ticked
    assert "turn-1: completed (attempt 1)" in ticked[2] and REUSED_NOTE in ticked[2], ticked
