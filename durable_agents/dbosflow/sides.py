"""DBOS's side of the comparison (``durable_agents.steps.sides``): what ``durable_agents.dbosflow.compare.dbos_side``
reads of one run from DBOS's tables, and ``python -m durable_agents.dbosflow steps --json`` prints. Importing it imports
no DBOS (``dbosflow`` checks for the extra where DBOS is first imported, ``durable_agents.dbosflow.engine``): the lab
and the lesson read this side as JSON from a process of its own, the DBOS engine being an optional extra. Plain JSON
data, the fields every side has first (``Side``, ``SideStep``), then DBOS's own: its ``operation_outputs`` rows, its
tables' totals, the ``workflow_status`` row. Told apart from the other engines' sides by ``workflow``, which only it
has."""

from __future__ import annotations

from typing import TypedDict, final

from durable_agents.steps.sides import Side, SideStep


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
    """Rows and bytes per table of DBOS's (``durable_agents.dbosflow.compare.TABLES``), by the run record's byte
    rule."""

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
