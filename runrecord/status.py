"""A run's status from the record, in exactly the shape ``starter.py status
--json`` prints from Temporal's history::

    {"run_id", "status", "current_step", "steps": [{"name", "status", "attempts", "result"}], "error"}

What only the record knows (intents, the lease) is shown by ``render`` below
the table, never added to the JSON, so one parser reads both engines.
"""

from __future__ import annotations

import json
import time
from typing import Any

from runrecord.store import IntentRow, RunRecord, RunRow


def status_of(run: RunRow) -> dict[str, Any]:
    steps = [
        {
            "name": s.name,
            "status": s.status,
            "attempts": s.attempts,
            "result": s.result if s.status == "completed" else None,
        }
        for s in run.steps
    ]
    current = next((s["name"] for s in steps if s["status"] != "completed"), None)
    return {"run_id": run.run_id, "status": run.status, "current_step": current, "steps": steps, "error": run.error}


def run_status(record: RunRecord, run_id: str) -> dict[str, Any]:
    """The status JSON for ``run_id``; ``RunNotFound`` if there is none."""
    return status_of(record.load(run_id))


def in_doubt(intents: list[IntentRow]) -> list[IntentRow]:
    return [i for i in intents if i.state == "in_doubt"]


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def render(run: RunRow, intents: list[IntentRow], now: float | None = None) -> str:
    """The starter's table, plus the intents and the lease."""
    from starter import render_table  # the same table for both engines

    now = time.time() if now is None else now
    lines = [render_table(status_of(run))]
    for i in intents:
        note = {
            "in_doubt": "IN DOUBT: recorded before sending, no answer recorded; resume repeats it with the same key",
            "answered": "answered",
            "error": f"error: {(i.outcome or {}).get('error', '')}",
            "settled": f"was in doubt; settled by attempt {(i.outcome or {}).get('settled_by_attempt')}",
        }[i.state]
        lines.append(f"  intent {i.step} attempt {i.attempt} key {i.idempotency_key}: {note}")
    if run.lease_holder:
        left = (run.lease_expires_at or 0) - now
        state = f"expires in {left:.1f} s" if left > 0 else f"expired {-left:.1f} s ago: resume may take it"
        lines.append(f"  lease: {run.lease_holder}, {state}")
    elif run.status == "running":
        lines.append("  lease: none (no process is running it): resume it to continue")
    return "\n".join(lines)


def dumps(status: dict[str, Any]) -> str:
    return json.dumps(status, indent=2)
