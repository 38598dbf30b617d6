"""The comparison's shapes: what each engine's reader says of one run, read
from its own record, and the provider's count per key. The readers build them
(``runrecord.compare.record_side``, ``flowclient.compare.temporal_side``,
``dbosflow.compare.dbos_side``, which ``python -m dbosflow steps --json``
prints); the lesson lays them side by side (``lesson.compare``) and draws them
(``lesson.lanes``). Here, and not in the lesson, because the readers cannot
import the lesson and no engine may import another; here, and not in each
reader, because the lesson reads DBOS's side as JSON from a process of its
own (the DBOS engine is an optional extra).

Plain JSON data, as ``steps.runstate``'s entries are: times are ``iso``
strings, a step's ``status`` is a ``StepStateName`` and a run's a
``RunStateName``. Every side has ``run_id``, ``status`` and ``error``, and
every side's step ``name``, ``status``, ``attempts``, ``seconds`` and
``result`` (``Side``, ``SideStep``): what the comparison reads of any engine.
The rest is each engine's own, in the order its JSON prints it. The three
sides are ``final``: an ``EngineSide`` is told apart by the keys only one of
them has (``executions``: Temporal's; ``workflow``: DBOS's).
"""

from __future__ import annotations

from typing import TypedDict, final

from steps.runstate import JsonValue, RunStateName, StepStateName


class SideStep(TypedDict):
    """What every engine's side says of one step."""

    name: str
    # The run record: its step row's own word (pending, running, completed, failed); Temporal and DBOS: the
    # status ``status`` shows
    status: StepStateName
    attempts: int
    # From the step's start to its end, as the engine recorded them; None if it has not both
    seconds: float | None
    result: JsonValue


class Side(TypedDict):
    """What every engine's side says of the run."""

    run_id: str
    status: RunStateName
    error: str | None


# -- the run record (runrecord.compare.record_side) ---------------------------------------------------------


class RecordIntent(TypedDict):
    """One attempt of an effect step: the intent written before the request."""

    attempt: int
    key: str
    # The record's word: in_doubt, answered, error or settled (runrecord.store)
    state: str
    recorded_at: str | None
    settled_at: str | None


class RecordStep(SideStep):
    # The step row, plus one intent per attempt of an effect step
    rows: int
    started_at: str | None
    completed_at: str | None
    intents: list[RecordIntent]


class Lease(TypedDict):
    holder: str | None
    expires_at: str | None


class RecordOnlyHere(TypedDict):
    intents: int
    # Intents in doubt now, and those a later attempt or ``settle`` settled after a crash left them in doubt
    in_doubt: int
    settled_after_doubt: int
    lease: Lease


@final
class RecordSide(Side):
    steps: list[RecordStep]
    # ``RunRecord.footprint``: <table>_rows and <table>_bytes for runs, steps and intents; rows and bytes in all
    totals: dict[str, int]
    only_here: RecordOnlyHere


# -- Temporal (flowclient.compare.temporal_side) ------------------------------------------------------------


class TemporalStep(SideStep):
    # The step's last activity execution's events, by type
    events: list[str]
    scheduled_at: str | None
    started_at: str | None
    closed_at: str | None


class TemporalTotals(TypedDict):
    events: int
    # The serialized History protobuf, as the server stores and ships it
    bytes: int
    activity_events: int
    workflow_task_events: int
    timer_events: int
    other_events: int


class Execution(TypedDict):
    """One activity execution (an attempt: the workflow retries), for the picture."""

    step: str
    scheduled_at: str | None
    started_at: str | None
    closed_at: str | None
    # The server's attempt number: 1, but in runs recorded before the workflow-side retries
    attempt: int
    # running, completed, failed, timed_out or canceled (flowclient.status.ActivityTrace)
    outcome: str
    # Ended by a heartbeat timeout or its worker's shutdown
    crashed: bool
    # The worker that started it, as history names it
    identity: str | None


class WorkflowTask(TypedDict):
    started_at: str | None
    closed_at: str | None
    # completed, failed or timedout; None while open
    outcome: str | None
    identity: str


class TemporalOnlyHere(TypedDict):
    workflow_task_events: int
    timer_events: int
    # The starter client and the workers, in the order history first names them
    worker_identities: list[str]
    # Each event type (ActivityTaskScheduled, ...) and how many history holds
    event_types: dict[str, int]


@final
class TemporalSide(Side):
    steps: list[TemporalStep]
    totals: TemporalTotals
    executions: list[Execution]
    workflow_tasks: list[WorkflowTask]
    only_here: TemporalOnlyHere


# -- DBOS (dbosflow.compare.dbos_side) ----------------------------------------------------------------------


class DbosStep(SideStep):
    crashes: int
    # 1 once DBOS wrote the step's operation_outputs row (when it returned), else 0
    rows: int


class DbosRow(TypedDict):
    """One ``operation_outputs`` row, as stored."""

    function_id: int
    name: str
    started_at: str | None
    completed_at: str | None
    bytes: int
    # The lab's own fields in the step's output: which dispatch (process) ran it, and the attempt within it
    dispatch: int | None
    attempt: int | None
    # Its error's type, or its result in short with the dispatch and attempt
    summary: str


class DbosTotals(TypedDict):
    """Rows and bytes per table of DBOS's (``dbosflow.compare.TABLES``), by the run record's byte rule."""

    workflow_status_rows: int
    workflow_status_bytes: int
    workflow_input_rows: int
    workflow_input_bytes: int
    workflow_output_rows: int
    workflow_output_bytes: int
    operation_outputs_rows: int
    operation_outputs_bytes: int
    rows: int
    bytes: int
    # Each table and its rows, as one line
    detail: str


class DbosWorkflow(TypedDict):
    """The run's ``workflow_status`` row, as DBOS's client reads it."""

    workflow_id: str
    # DBOS's word: PENDING, SUCCESS, ERROR, ...
    status: str
    app_version: str | None
    executor_id: str | None
    recovery_attempts: int | None
    queue_name: str | None


class DbosOnlyHere(TypedDict):
    application_version: str | None
    # One per dispatch of the run
    recovery_attempts: int | None
    executor_id: str | None
    queue: str | None
    workflow_inputs_recorded: bool


@final
class DbosSide(Side):
    steps: list[DbosStep]
    rows: list[DbosRow]
    totals: DbosTotals
    workflow: DbosWorkflow
    only_here: DbosOnlyHere


EngineSide = RecordSide | TemporalSide | DbosSide
"""Any engine's side."""


# -- the provider (lesson.effects.effect_entries) -----------------------------------------------------------


class EffectEntry(TypedDict):
    """The provider's count for one idempotency key, and when it first and last saw it (its record)."""

    # The kind of effect the key's requests asked for (an email, a ticket, ...)
    kind: str
    requests: int
    # 0 or 1
    effects_applied: int
    first_seen: str | None
    last_seen: str | None
