"""The run record's side of the comparison (the lab's ``python -m lesson.compare``): what the SQLite record
holds for one run, read from its own rows.

``record_side(record, run_id)`` returns a ``durable_agents.runrecord.sides.RecordSide``:

- ``steps``: per step, its rows (the step row plus one intent per attempt of
  an effect step), attempts, started / completed times, result and intents
  (attempt, key, state, recorded and settled times);
- ``totals``: the record's rows and bytes for the run (``RunRecord.footprint``:
  the sum of the stored values' lengths across its three tables; SQLite's
  page and index overhead not counted, as Temporal's history storage overhead
  is not);
- ``only_here``: what the other engines do not record: the intents (any in
  doubt now, and those settled after a crash left them in doubt) and the lease.

Temporal's side is ``durable_agents.flowclient.compare``, DBOS's ``durable_agents.dbosflow.compare``; the
lesson (``lesson.compare``) lays them side by side with the provider's
counts. This package imports neither engine.
"""

from __future__ import annotations

from durable_agents.runrecord.sides import RecordSide, RecordStep
from durable_agents.runrecord.status import iso, status_of
from durable_agents.runrecord.store import RunRecord
from durable_agents.steps.runstate import step_state


def record_side(record: RunRecord, run_id: str) -> RecordSide:
    """The run as the record holds it (module docstring)."""
    run = record.load(run_id)
    status = status_of(run)
    intents = record.intents(run_id)
    steps: list[RecordStep] = []
    for row in run.steps:
        mine = [i for i in intents if i.position == row.position]
        steps.append(
            {
                "name": row.name,
                "status": step_state(row.status),  # the step row's own word
                "rows": 1 + len(mine),
                "attempts": row.attempts,
                "started_at": iso(row.started_at),
                "completed_at": iso(row.completed_at),
                "seconds": None
                if row.started_at is None or row.completed_at is None
                else round(row.completed_at - row.started_at, 3),
                "result": status["steps"][row.position]["result"],
                "intents": [
                    {"attempt": i.attempt, "key": i.idempotency_key, "state": i.state,
                     "recorded_at": iso(i.recorded_at), "settled_at": iso(i.settled_at)}
                    for i in mine
                ],
            }
        )
    return {
        "run_id": run_id,
        "status": status["status"],  # the run row's word, as status_of gives it back (no flow compared: never parked)
        "error": run.error,
        "steps": steps,
        "totals": record.footprint(run_id),
        "only_here": {
            "intents": len(intents),
            "in_doubt": sum(i.state == "in_doubt" for i in intents),
            "settled_after_doubt": sum(i.state == "settled" for i in intents),
            "lease": {"holder": run.lease_holder, "expires_at": iso(run.lease_expires_at)},
        },
    }
