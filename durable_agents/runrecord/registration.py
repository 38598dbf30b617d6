"""The run record's registration in the lab's engine registry (``durable_agents.steps.engine_row``, found by
``lab.registry``)."""

from __future__ import annotations

from collections.abc import Sequence

from durable_agents.runrecord.store import DEFAULT_SYNCHRONOUS, SYNCHRONOUS_ENV
from durable_agents.steps.engine_row import Engine
from durable_agents.steps.plan import FlowStep

NAME = "runrecord"


def crash_points(flow: Sequence[FlowStep]) -> tuple[str, ...]:
    """For each step S (``durable_agents.runrecord.runner``): its attempt committed (``after_start``; ``after_intent``
    for a step with an effect: the intent too), then its result and the advance (``after_record``)."""
    return tuple(point for s in flow for point in (
        f"{NAME}:{s.name}:{'after_intent' if s.effect else 'after_start'}",
        f"{NAME}:{s.name}:after_record",
    ))


ENGINE = Engine(
    name=NAME, rank=2, label="run record (SQLite)", driver="lab.engines:RunRecordDriver",
    loop_session="lab.loop_chaos:RunRecordSession", cli=__package__, crash_points=crash_points, letter="R",
    sync_env=SYNCHRONOUS_ENV, sync_levels=(DEFAULT_SYNCHRONOUS, "NORMAL"), cut_start=f"{NAME}:draft:after_start")
