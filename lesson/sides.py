"""Any engine's side of the comparison: the union of the sides each engine's package declares (the shared
fields: ``durable_agents.steps.sides``). The lesson reads them side by side; each is told apart by a key only it has."""

from __future__ import annotations

from durable_agents.dbosflow.sides import DbosSide
from durable_agents.flowclient.sides import TemporalSide
from durable_agents.runrecord.sides import RecordSide

EngineSide = RecordSide | TemporalSide | DbosSide
"""Any engine's side."""
