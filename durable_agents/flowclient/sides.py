"""Temporal's side of the comparison (``durable_agents.steps.sides``): what
``durable_agents.flowclient.compare.temporal_side`` reads of one run from its history. Plain JSON data, the fields every
side has first (``Side``, ``SideStep``), then Temporal's own: each activity execution and workflow task, the history's
events and bytes. Told apart from the other engines' sides by ``executions``, which only it has."""

from __future__ import annotations

from typing import TypedDict, final

from durable_agents.steps.sides import Side, SideStep


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
    # running, completed, failed, timed_out or canceled (durable_agents.flowclient.status.ActivityTrace)
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
