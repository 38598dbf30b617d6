"""DBOS's registration in the lab's engine registry (``durable_agents.steps.engine_row``, found by ``lab.registry``).
Importing it imports no DBOS: the lab lists the engine whether or not the extra is installed."""

from __future__ import annotations

from collections.abc import Sequence

from durable_agents.steps.engine_row import Engine
from durable_agents.steps.plan import FlowStep

NAME = "dbos"
SYNCHRONOUS_ENV = "DBOSFLOW_SYNCHRONOUS"
DEFAULT_SYNCHRONOUS = "EXTRA"
"""The system database's ``synchronous`` level: EXTRA keeps every acknowledged commit under a power cut
(the rollback journal's deletion synced to its directory); FULL is SQLite's default and DBOS's."""


def crash_points(flow: Sequence[FlowStep]) -> tuple[str, ...]:
    """``dbos:S:after_record`` for each step S (``durable_agents.dbosflow.engine``): DBOS has written S's output."""
    return tuple(f"{NAME}:{s.name}:after_record" for s in flow)


ENGINE = Engine(
    name=NAME, rank=3, label="DBOS (SQLite)", driver="lab.engines:DbosDriver",
    loop_session="lab.loop_chaos:DbosSession", cli=__package__, crash_points=crash_points, letter="D",
    sync_env=SYNCHRONOUS_ENV, sync_levels=(DEFAULT_SYNCHRONOUS, "FULL"), on_postgres=True, cut_start="draft:before")
