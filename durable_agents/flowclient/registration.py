"""Temporal's registration in the lab's engine registry (``durable_agents.steps.engine_row``, found by
``lab.registry``): workers (``worker.py``) serving a task queue of a server the caller starts, the runs started as
``starter.py`` starts them (``durable_agents.flowclient.runs``)."""

from __future__ import annotations

from collections.abc import Sequence

from durable_agents.steps.engine_row import Engine
from durable_agents.steps.plan import FlowStep

NAME = "temporal"


def crash_points(flow: Sequence[FlowStep]) -> tuple[str, ...]:
    """``temporal:S:after_record`` for each step S (``durable_agents.workflows.agent_flow``, never on replay): S's
    ActivityTaskCompleted is in history, the next activity not yet scheduled."""
    return tuple(f"{NAME}:{s.name}:after_record" for s in flow)


ENGINE = Engine(
    name=NAME, rank=1, label="Temporal", driver="lab.engines:TemporalDriver",
    loop_session="lab.loop_chaos:TemporalSession", crash_points=crash_points, letter="T", runner="worker",
    # The dev server's SQLite history: the lab's level (lab.processes.FILE_PRAGMAS), then SQLite's default.
    sync_levels=("EXTRA", "FULL"), needs_server=True)
