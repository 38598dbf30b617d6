"""What the grader reads to judge a run, and nothing else: the provider's
bookkeeping (effects and requests per idempotency key, and what it applied
under each), the model stand-in's count of drafts (``grader.model``), and the
learner's run record, read straight from the SQLite file at ``RECORD_DB``.

The learner's printed lines are never evidence. The record is the thing
being judged, so every claim it makes that the outside world can confirm
(a draft's words, a message id, a ticket id, an intent's key) is compared
with what the model or the provider says happened.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from durable_agents.providerclient import fetch_effects
from durable_agents.steps.runstate import unix

KIND_OF_STEP = {"send_confirmation": "email", "record_outcome": "ticket"}
WORDS = {"send_confirmation": "the confirmation email", "record_outcome": "the ticket"}

# The tables and columns the exercises' schema gives (exercises/*/practice/flow.py, SCHEMA).
SCHEMA_COLUMNS = {
    "runs": ("run_id", "task", "email", "status", "current_step", "error"),
    "steps": ("run_id", "name", "result"),
    "intents": ("run_id", "step", "attempt", "idempotency_key", "request"),
}


# ---------------------------------------------------------------- the provider


@dataclass(frozen=True)
class Effect:
    """One idempotency key of a run at the provider, and what it applied under it."""

    key: str
    kind: str  # "email" or "ticket"
    requests: int
    applied: int  # 0 or 1
    request: dict[str, Any] | None = None  # the applied body
    response: dict[str, Any] | None = None  # the provider's answer: message_id or ticket_id
    first_seen: str = ""  # the provider's clock (ISO 8601 UTC) at the key's first and latest request
    last_seen: str = ""

    def seconds_between_first_and_last_request(self) -> float:
        return (unix(self.last_seen) or 0.0) - (unix(self.first_seen) or 0.0)


def effects(provider_url: str, run_id: str) -> list[Effect]:
    """Every key the provider saw for ``run_id``, with the request it applied (if any)."""
    found = []
    for e in fetch_effects(provider_url, run_id=run_id):
        request = response = None
        if e.effects_applied:
            with httpx.Client(timeout=5.0) as http:
                held = http.get(f"{provider_url}/v1/requests/{quote(e.key, safe='')}").json()
            request, response = held.get("request"), held.get("response")
        found.append(Effect(e.key, e.kind, e.requests, e.effects_applied, request, response, e.first_seen,
                            e.last_seen))
    return found


@dataclass(frozen=True)
class Witnesses:
    """A snapshot of what the outside world saw of one run."""

    drafts: int  # draft calls the model stand-in answered
    effects: tuple[Effect, ...]

    def requests(self, step: str) -> int:
        return sum(e.requests for e in self.effects if e.kind == KIND_OF_STEP[step])

    def applied(self, step: str) -> list[Effect]:
        return [e for e in self.effects if e.kind == KIND_OF_STEP[step] and e.applied]

    def executions(self, step: str) -> int:
        """How often ``step`` reached the outside world: a model call, or a request to the provider."""
        return self.drafts if step == "draft" else self.requests(step)


# ---------------------------------------------------------------- the learner's record


class SchemaChanged(Exception):
    """The record's tables are not the ones the exercise gives."""


@dataclass
class Record:
    """One run as the learner's record holds it (``run`` is None: no row)."""

    exists: bool  # the file is there
    run: dict[str, Any] | None = None
    steps: dict[str, str] = field(default_factory=dict)  # name -> result as stored (JSON text)
    intents: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)  # rows per table, all runs

    def result(self, step: str) -> dict[str, Any] | None:
        """A completed step's result, parsed; None if absent or not a JSON object."""
        try:
            value = json.loads(self.steps[step])
        except (KeyError, TypeError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def intents_of(self, step: str) -> list[dict[str, Any]]:
        return [i for i in self.intents if i["step"] == step]

    def describe(self) -> str:
        """The run's rows in a few lines, for a failure message."""
        if not self.exists:
            return "no record at RECORD_DB: the program never created its tables (open_record)"
        if self.run is None:
            counts = ", ".join(f"{t}: {n} row(s)" for t, n in self.tables.items())
            return f"no row for this run in `runs` (the record holds {counts})"
        run = ", ".join(f"{k} {self.run.get(k)!r}" for k in ("status", "current_step", "error"))
        done = [s for s in self.steps]
        lines = [f"runs: {run}", f"steps: {', '.join(done) if done else 'none'}"]
        for i in self.intents:
            lines.append(f"intent: {i['step']} attempt {i['attempt']}, key {i['idempotency_key']}")
        if not self.intents:
            lines.append("intents: none")
        return "; ".join(lines)


def read_record(db: Path, run_id: str) -> Record:
    """The learner's record of ``run_id``, read by a process of its own (so only what was committed)."""
    if not db.exists():
        return Record(exists=False)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        conn.row_factory = sqlite3.Row
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone():
            return Record(exists=False)  # the file the grader made, never given the schema
        _check_schema(conn)
        record = Record(exists=True)
        record.tables = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in SCHEMA_COLUMNS}
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        record.run = dict(row) if row is not None else None
        record.steps = {r["name"]: r["result"] for r in conn.execute(
            "SELECT name, result FROM steps WHERE run_id = ?", (run_id,))}
        record.intents = [dict(r) for r in conn.execute(
            "SELECT step, attempt, idempotency_key, request FROM intents WHERE run_id = ? ORDER BY step, attempt",
            (run_id,))]
        return record
    finally:
        conn.close()


def _check_schema(conn: sqlite3.Connection) -> None:
    for table, wanted in SCHEMA_COLUMNS.items():
        have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        missing = [c for c in wanted if c not in have]
        if missing:
            raise SchemaChanged(
                f"the record has {'no table ' + repr(table) if not have else f'no column(s) {missing} in {table!r}'}"
                f": the grader reads the tables of the SCHEMA given in practice/flow.py; keep them as given "
                f"(you may add columns, not remove or rename them)")
