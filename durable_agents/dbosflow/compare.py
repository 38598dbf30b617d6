"""DBOS's side of the comparison (``python -m lesson.compare ... --dbos``):
what DBOS's system database holds for one run, read from its SQLite tables
as stored, with the same byte rule as the run record's ``footprint`` (the
sum of the stored values' lengths; SQLite's page overhead not counted).

DBOS keeps a run in four tables: ``workflow_status`` (one row: status,
version, executor, ``recovery_attempts``, times), ``workflow_input`` and
``workflow_output`` (the serialized inputs and result) and
``operation_outputs`` (one row per step, written when the step returned:
output or error, start and end times). Nothing is written when a step
starts, so an attempt in flight, or killed, leaves no row.

On PostgreSQL (``DBOSFLOW_DB`` a URL: ``durable_agents.dbosflow.sysdb``) the same tables, in
the ``dbos`` schema; a value's bytes are those of its text form
(``octet_length``), as SQLite's ``length`` of it as a blob counts them.
"""

from __future__ import annotations

from pathlib import Path

from durable_agents.dbosflow import sysdb
from durable_agents.dbosflow.sides import DbosRow, DbosSide, DbosStep, DbosTotals
from durable_agents.dbosflow.status import DbosRunNotFound, read, status_of
from durable_agents.dbosflow.sysdb import SystemDb
from durable_agents.steps.runstate import iso
from durable_agents.steps.runview import short_result

TABLES = ("workflow_status", "workflow_input", "workflow_output", "operation_outputs")


def _held(con: sysdb.Reader, table: str, run_id: str) -> tuple[int, int]:
    """The rows ``table`` holds for the run, and their bytes."""
    size = " + ".join(con.size(c) for c in con.columns(table))
    count, total = con.rows(f"SELECT count(*), coalesce(sum({size}), 0) FROM {table} WHERE workflow_uuid = ?",
                            (run_id,))[0]
    return int(str(count)), int(str(total))


def _footprint(con: sysdb.Reader, run_id: str) -> DbosTotals:
    held = {table: _held(con, table, run_id) for table in TABLES}
    return {
        "workflow_status_rows": held["workflow_status"][0], "workflow_status_bytes": held["workflow_status"][1],
        "workflow_input_rows": held["workflow_input"][0], "workflow_input_bytes": held["workflow_input"][1],
        "workflow_output_rows": held["workflow_output"][0], "workflow_output_bytes": held["workflow_output"][1],
        "operation_outputs_rows": held["operation_outputs"][0],
        "operation_outputs_bytes": held["operation_outputs"][1],
        "rows": sum(rows for rows, _ in held.values()),
        "bytes": sum(size for _, size in held.values()),
        "detail": ", ".join(f"{table} {held[table][0]}" for table in TABLES),
    }


def dbos_side(db: Path | SystemDb, run_id: str) -> DbosSide:
    """The run as DBOS recorded it: its rows per step, totals, what only DBOS keeps."""
    raw = read(db, run_id)
    status = status_of(raw)
    with sysdb.connect(db) as con:
        size = " + ".join(con.size(c) for c in con.columns("operation_outputs"))
        sizes = {int(str(fid)): int(str(n)) for fid, n in con.rows(
            f"SELECT function_id, {size} FROM operation_outputs WHERE workflow_uuid = ?", (run_id,))}
        totals = _footprint(con, run_id)
    wf = raw["workflow"]
    by_name = {r["function_name"]: r for r in raw["steps"]}
    rows: list[DbosRow] = []
    steps: list[DbosStep] = []
    for r in raw["steps"]:
        out = r["output"] if isinstance(r["output"], dict) else {}
        rows.append({"function_id": r["function_id"], "name": r["function_name"],
                     "started_at": iso(r["started_at_epoch_ms"] / 1000) if r["started_at_epoch_ms"] else None,
                     "completed_at": iso(r["completed_at_epoch_ms"] / 1000) if r["completed_at_epoch_ms"] else None,
                     "bytes": sizes.get(r["function_id"], 0),
                     # The lab's own fields in the step's output: which dispatch (process) ran it, and the attempt.
                     "dispatch": out.get("dispatch"), "attempt": out.get("attempt"),
                     "summary": (f"error: {type(r['error']).__name__}" if r["error"] is not None
                                 else short_result(out.get("result")) + f" (dispatch {out.get('dispatch')}, "
                                 f"attempt {out.get('attempt')})")})
    for s in status["steps"]:
        r = by_name.get(s["name"])
        seconds = None
        if r is not None and r["started_at_epoch_ms"] and r["completed_at_epoch_ms"]:
            seconds = round((r["completed_at_epoch_ms"] - r["started_at_epoch_ms"]) / 1000, 3)
        steps.append({"name": s["name"], "status": s["status"], "attempts": s["attempts"],
                      "crashes": s["crashes"], "rows": 1 if r is not None else 0, "seconds": seconds,
                      "result": s["result"]})
    return {
        "run_id": run_id,
        "status": status["status"],
        "error": status["error"],
        "steps": steps,
        "rows": rows,
        "totals": totals,
        "workflow": {"workflow_id": wf.workflow_id, "status": wf.status, "app_version": wf.app_version,
                     "executor_id": wf.executor_id, "recovery_attempts": wf.recovery_attempts,
                     "queue_name": wf.queue_name},
        "only_here": {
            "application_version": wf.app_version,
            "recovery_attempts": wf.recovery_attempts,
            "executor_id": wf.executor_id,
            "queue": wf.queue_name,
            "workflow_inputs_recorded": True,
        },
    }


__all__ = ["DbosRunNotFound", "dbos_side"]
