"""What the scenario (``lesson.scenario``) saw of one engine's restart, what it expected to see, and the
summary table of both, built once for the text (``lesson.scenario.render``) and for the page
(``lesson.scenario_page``).

The table, one row per engine: where the run resumed (the first step the
restarted process executed), the steps executed again (executed by the
restarted process although they had completed before the restart), the
effects per step as the provider counted them, and whether the row is the
expected one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from durable_agents.steps.plan import STEP_NAMES
from durable_agents.steps.sides import EffectEntry
from lesson.effects import describe
from lesson.lanes import Watched
from lesson.sides import EngineSide

LABELS = {
    "in_memory": "in memory (the before)",
    "runrecord": "run record (SQLite)",
    "temporal": "Temporal",
    "dbos": "DBOS (SQLite)",
}
CRASH = {
    "in_memory": "in_memory:after_send_confirmation",
    "runrecord": "runrecord:send_confirmation:after_record",
    "temporal": "record_outcome:before",
    "dbos": "dbos:send_confirmation:after_record",
}
EXPECTED: dict[str, dict[str, Any]] = {
    "in_memory": {"resumed_at": "draft", "executed_again": ["draft", "send_confirmation"],
                  "applied": {"send_confirmation": 2, "record_outcome": 1}},
    "runrecord": {"resumed_at": "record_outcome", "executed_again": [],
                  "applied": {"send_confirmation": 1, "record_outcome": 1}},
    "temporal": {"resumed_at": "record_outcome", "executed_again": [],
                 "applied": {"send_confirmation": 1, "record_outcome": 1}},
    "dbos": {"resumed_at": "record_outcome", "executed_again": [],
             "applied": {"send_confirmation": 1, "record_outcome": 1}},
}
SUMMARY_HEADER = ("engine", "resumed at", "executed again", "email (send_confirmation)", "ticket (record_outcome)",
                  "check")


@dataclass
class Observed:
    engine: str
    run_id: str
    completed_before: list[str] = field(default_factory=list)
    restarted_executed: list[str] = field(default_factory=list)
    final_status: str = ""
    effects: dict[str, dict[str, int]] = field(default_factory=dict)
    keys: list[dict[str, Any]] = field(default_factory=list)
    # How the restarted process knew what was done: what it read (run record) or replayed (Temporal).
    how_it_knew: str = ""
    # For the picture: what the scenario saw, the engine's own record of the run, the provider's count with times.
    watched: Watched = field(default_factory=Watched)
    record: EngineSide | None = None
    provider: dict[str, EffectEntry] = field(default_factory=dict)

    @property
    def resumed_at(self) -> str | None:
        return self.restarted_executed[0] if self.restarted_executed else None

    @property
    def resumed_where(self) -> str | None:
        """Where it resumed, as the table says it: ``step 3 record_outcome``; None if it executed nothing."""
        return f"step {STEP_NAMES.index(self.resumed_at) + 1} {self.resumed_at}" if self.resumed_at else None

    @property
    def executed_again(self) -> list[str]:
        return [s for s in STEP_NAMES if s in self.completed_before and s in self.restarted_executed]

    def comparable(self) -> dict[str, Any]:
        return {"resumed_at": self.resumed_at, "executed_again": self.executed_again,
                "applied": {step: counts["applied"] for step, counts in self.effects.items()}}

    @property
    def ok(self) -> bool:
        return self.comparable() == EXPECTED[self.engine] and self.final_status == "completed"

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "label": LABELS[self.engine], "run_id": self.run_id,
            "crash_at": CRASH[self.engine], "completed_before_restart": self.completed_before,
            "how_it_knew": self.how_it_knew,
            "resumed_at": self.resumed_at,
            "resumed_at_position": STEP_NAMES.index(self.resumed_at) + 1 if self.resumed_at else None,
            "restarted_process_executed": self.restarted_executed, "executed_again": self.executed_again,
            "final_status": self.final_status, "effects": self.effects, "keys": self.keys,
            "expected": EXPECTED[self.engine], "ok": self.ok,
        }


def summary(results: list[Observed]) -> list[list[str]]:
    """The header (``SUMMARY_HEADER``), then one row per engine, in the order they ran."""
    rows = [list(SUMMARY_HEADER)]
    for obs in results:
        rows.append([LABELS[obs.engine], obs.resumed_where or "-", ", ".join(obs.executed_again) or "none",
                     describe(obs.effects["send_confirmation"]), describe(obs.effects["record_outcome"]),
                     "as expected" if obs.ok else "NOT AS EXPECTED"])
    return rows
