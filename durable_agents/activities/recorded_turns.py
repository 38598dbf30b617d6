"""The turns a reset run's base recorded, read back so that a reset never asks a recorded turn again.

``temporal workflow reset`` re-runs a loop run from a workflow task as a new run of the same workflow id:
what its base recorded after that point is not in the new run's history, so turn n would be asked of the
model again, and a model that words its answer differently or gives new call ids would send its calls
under new keys: each effect twice. Instead ``model_turn`` of a reset run first looks for turn n in what
the runs before it recorded (``recorded_turn``) and, found, answers with that record (``reused=True``): the
calls keep the keys the base sent them under and the provider replays them.

Where it looks, newest first, each run's history read once (at most ``MAX_RUNS_READ``):

- the asking run, and the runs it continued as new from back to the reset run (the runs *since* the
  reset: a turn there is this reset's own record);
- then the reset's base (the ``base_run_id`` of the ``WorkflowTaskFailed`` whose cause is
  ``RESET_WORKFLOW``, the newest in a history: a reset of a reset run names its own base), then, from any
  run before the reset, first the run it continued as new into (a reset of an earlier run of a chain: the
  runs after it recorded later turns), then its own reset's base (a chain of resets).

Once a turn since the reset was asked of the model (``reused=False``), the records of the base no longer
follow from this run's conversation: nothing is reused after it (``None``: ask the model). The first
turn no run recorded is asked the same way, and from it the run goes on as any run does.

What is reused is the turn, not its calls' results: each call of a reused turn runs again as an activity of
the reset run. A call with an effect goes under its recorded key, and the provider replays what it applied.
A read-only call has no key (``lookup_order``: ``durable_agents.steps.loop.EFFECT_OF_TOOL`` names the tools with an
effect) and simply reads again: no effect, one more lookup at the provider, and its result is the order as it is
now (the base's refunds included), recorded in the reset run; the turns after it that the base recorded are
still reused as recorded, so that answer changes no call. ``starter.py status`` shows a reused turn
(``reused`` in ``durable_agents.flowclient.loop.loop_status``).

The cost: a turn asked in a reset run reads a history or more (a reset run that asked the model once reads
its own, finds the fresh turn and stops there); a run of the chain started after the reuse ended reads
nothing (``LoopCarried.started_as`` is carried only while reusing). A turn asked in the run its record began
with (every run never reset) reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client
from temporalio.converter import WorkflowSerializationContext

from durable_agents.steps.loop import TurnResult

MAX_RUNS_READ = 64
"""A bound on the histories one look-up reads: resets of resets and chains of continue-as-new add runs."""


@dataclass
class _Run:
    """What one run's history says for the look-up."""

    turns: dict[int, TurnResult] = field(default_factory=dict)  # completed model_turn results, by turn
    asked_since_reset: bool = False  # a turn after its newest reset event (or, with none, any) was asked
    reset_base: str = ""  # the base of its newest reset
    continued_from: str = ""
    continued_as: str = ""


async def _read(client: Client, workflow_id: str, run_id: str, turn_activity: str) -> _Run:
    converter = client.data_converter.with_context(
        WorkflowSerializationContext(namespace=client.namespace, workflow_id=workflow_id))
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    run = _Run()
    turns_scheduled: set[int] = set()
    completed: list[tuple[int, TurnResult]] = []
    reset_at = 0
    for ev in history.events:
        et = ev.event_type
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            run.continued_from = ev.workflow_execution_started_event_attributes.continued_execution_run_id
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if ev.activity_task_scheduled_event_attributes.activity_type.name == turn_activity:
                turns_scheduled.add(ev.event_id)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = ev.activity_task_completed_event_attributes
            if done.scheduled_event_id in turns_scheduled and done.result.payloads:
                result = (await converter.decode(done.result.payloads, [TurnResult]))[0]
                completed.append((ev.event_id, result))
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed = ev.workflow_task_failed_event_attributes
            if failed.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW and failed.base_run_id:
                run.reset_base, reset_at = failed.base_run_id, ev.event_id
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            run.continued_as = ev.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    for event_id, result in completed:
        run.turns[result.turn] = result
        run.asked_since_reset = run.asked_since_reset or (event_id > reset_at and not result.reused)
    return run


async def recorded_turn(client: Client, workflow_id: str, run_id: str, turn: int, *,
                        turn_activity: str) -> TurnResult | None:
    """Turn ``turn`` as the runs before the reset that led to run ``run_id`` recorded it (see the module
    docstring; turns are the results of activities named ``turn_activity``), or None: ask the model."""
    seen: set[str] = set()
    since_reset = [run_id]  # the asking run and those it continued from, back to the reset run
    before: list[str] = []  # a stack of runs before the reset, the newest on top
    while since_reset:
        current = since_reset.pop()
        if current in seen or len(seen) >= MAX_RUNS_READ:
            return None
        seen.add(current)
        run = await _read(client, workflow_id, current, turn_activity)
        if run.asked_since_reset:
            return None
        if turn in run.turns:
            return run.turns[turn]
        if run.reset_base:
            before.append(run.reset_base)
        elif run.continued_from:
            since_reset.append(run.continued_from)
    while before:
        current = before.pop()
        if current in seen or len(seen) >= MAX_RUNS_READ:
            continue
        seen.add(current)
        run = await _read(client, workflow_id, current, turn_activity)
        if turn in run.turns:
            return run.turns[turn]
        # Pushed oldest first: the run it continued into is newer than its own reset's base.
        for link in (run.reset_base, run.continued_as):
            if link and link not in seen:
                before.append(link)
    return None
