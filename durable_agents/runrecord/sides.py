"""The run record's side of the comparison (``durable_agents.steps.sides``): what
``durable_agents.runrecord.compare.record_side`` reads of one run from its record, and the lab's ``python -m
lesson.compare --json`` prints. Plain JSON data, the fields every side has first (``Side``,
``SideStep``), then the record's own: each effect attempt's intent, the lease, the record's footprint. Told apart from
the other engines' sides by ``only_here["lease"]``."""

from __future__ import annotations

from typing import TypedDict, final

from durable_agents.steps.sides import Side, SideStep


class RecordIntent(TypedDict):
    """One attempt of an effect step: the intent written before the request."""

    attempt: int
    key: str
    # The record's word: in_doubt, answered, error or settled (durable_agents.runrecord.store)
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
