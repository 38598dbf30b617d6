"""Side by side: what Temporal's event history recorded for one run, and what
the run record holds for another run of the same task, with the provider's
own counts for both runs' idempotency keys.

Two run ids, because the keys derive from the run id: the same id on both
engines would make the second engine's email a replay of the first's.

``compare(...)`` returns a dict (``--json`` prints it); ``render`` makes the
table. Figures:

- per step, Temporal: the activity's events, attempts, scheduled / started /
  closed times and result; the record: its rows (the step row plus one intent
  per attempt of an effect step), attempts, times, result and intents;
- totals: Temporal's events and history bytes (the serialized
  ``History`` protobuf, as the server stores and ships it); the record's rows
  and bytes (sum of the stored values' lengths across its three tables;
  SQLite's page and index overhead not counted, as the history's storage
  overhead is not);
- what only one side records: Temporal's workflow-task events, timer events,
  worker identities and bookkeeping events; the record's intents (including
  any in doubt) and its lease;
- DBOS (``--dbos DBOS_RUN_ID``, when the ``dbos`` extra is installed): a
  third column, what DBOS's system database holds for a third run of the same
  task (``dbosflow.compare.dbos_side``, read by the caller: the CLI asks
  ``python -m dbosflow steps --json``): one ``operation_outputs`` row per
  recorded step, its rows and bytes by the same rule as the record's, and
  what only DBOS keeps (application version, executor, dispatches);
- for the picture (``runrecord.picture``, ``compare --html PATH``): Temporal's
  every activity execution (``executions``: step, times, attempt, outcome,
  the worker that ran it) and workflow task (``workflow_tasks``: times,
  worker), and per key the provider's ``kind``, ``first_seen`` and
  ``last_seen`` beside its counts;
- checks: for each effect step, attempts against the provider's request count
  for its key, and effects applied once per completed step. An attempt killed
  before it sent anything is counted by the engine and not by the provider,
  so after such a crash the two may differ by design; the check says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History

from flowclient.status import activity_traces, read_history
from flowclient.status import run_status as temporal_status
from providerclient import EffectRecord, fetch_effects
from runrecord.status import iso, status_of
from runrecord.store import RunRecord
from steps.controls import printable
from steps.keys import idempotency_key
from steps.plan import EFFECT_STEPS


def _camel(event_type: EventType.ValueType) -> str:
    name = EventType.Name(event_type).removeprefix("EVENT_TYPE_")
    return "".join(part.capitalize() for part in name.split("_"))


def _dt(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds(), 3)


def _identities(history) -> list[str]:
    seen: list[str] = []
    for ev in history.events:
        which = ev.WhichOneof("attributes")
        attrs = getattr(ev, which) if which else None
        if attrs is not None and "identity" in attrs.DESCRIPTOR.fields_by_name and attrs.identity:
            if attrs.identity not in seen:
                seen.append(attrs.identity)
    return seen


def _workers(history) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """Who ran what, as history says: the worker that started each activity execution (by its
    scheduled event id; the last attempt's, as history keeps only that one's start), and each
    workflow task's start, close and worker."""
    activity_worker: dict[int, str] = {}
    tasks: dict[int, dict[str, Any]] = {}
    for ev in history.events:
        et = ev.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = ev.activity_task_started_event_attributes
            activity_worker[a.scheduled_event_id] = a.identity
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            tasks[ev.event_id] = {"started_at": _dt(ev.event_time.ToDatetime()), "closed_at": None,
                                  "outcome": None, "identity": ev.workflow_task_started_event_attributes.identity}
        elif et in _TASK_CLOSED:
            attrs = getattr(ev, _TASK_CLOSED[et])
            if attrs.started_event_id in tasks:
                tasks[attrs.started_event_id].update(closed_at=_dt(ev.event_time.ToDatetime()),
                                                     outcome=_camel(et).removeprefix("WorkflowTask").lower())
    return activity_worker, list(tasks.values())


_TASK_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "workflow_task_completed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow_task_failed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow_task_timed_out_event_attributes",
}


async def temporal_side(client, run_id: str) -> dict[str, Any]:
    _, history = await read_history(client, run_id)
    status = await temporal_status(client, run_id)
    all_traces = await activity_traces(client, history)
    traces = {t.step: t for t in all_traces.values()}
    activity_worker, workflow_tasks = _workers(history)
    counts: dict[str, int] = {}
    for ev in history.events:
        name = _camel(ev.event_type)
        counts[name] = counts.get(name, 0) + 1
    steps = []
    for s in status["steps"]:
        t = traces.get(s["name"])
        steps.append(
            {
                "name": s["name"],
                "status": s["status"],
                "events": t.events if t else [],
                "attempts": s["attempts"],
                "scheduled_at": _dt(t.scheduled_time) if t else None,
                "started_at": _dt(t.started_time) if t else None,
                "closed_at": _dt(t.closed_time) if t else None,
                "seconds": _seconds(t.scheduled_time, t.closed_time) if t else None,
                "result": s["result"],
            }
        )
    wft = sum(v for k, v in counts.items() if k.startswith("WorkflowTask"))
    timers = sum(v for k, v in counts.items() if k.startswith("Timer"))
    activity = sum(v for k, v in counts.items() if k.startswith("ActivityTask"))
    return {
        "run_id": run_id,
        "status": status["status"],
        "error": status["error"],
        "steps": steps,
        "totals": {
            "events": len(history.events),
            "bytes": History(events=list(history.events)).ByteSize(),
            "activity_events": activity,
            "workflow_task_events": wft,
            "timer_events": timers,
            "other_events": len(history.events) - activity - wft - timers,
        },
        # For the picture (runrecord.picture): every activity execution and workflow task, timed.
        "executions": [
            {"step": t.step, "scheduled_at": _dt(t.scheduled_time), "started_at": _dt(t.started_time),
             "closed_at": _dt(t.closed_time), "attempt": t.attempts, "outcome": t.outcome, "crashed": t.crashed,
             "identity": activity_worker.get(t.scheduled_event_id)}
            for t in all_traces.values()
        ],
        "workflow_tasks": workflow_tasks,
        "only_here": {
            "workflow_task_events": wft,
            "timer_events": timers,
            "worker_identities": _identities(history),
            "event_types": counts,
        },
    }


def record_side(record: RunRecord, run_id: str) -> dict[str, Any]:
    run = record.load(run_id)
    status = status_of(run)
    intents = record.intents(run_id)
    steps = []
    for row in run.steps:
        mine = [i for i in intents if i.position == row.position]
        steps.append(
            {
                "name": row.name,
                "status": row.status,
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
        "status": run.status,
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


def effect_entries(effects: Iterable[EffectRecord]) -> dict[str, dict[str, Any]]:
    """The provider's count per key, and when it first and last saw the key (its record)."""
    return {
        e.key: {"kind": e.kind, "requests": e.requests, "effects_applied": e.effects_applied,
                "first_seen": e.first_seen, "last_seen": e.last_seen}
        for e in effects
    }


def provider_side(url: str, run_id: str) -> dict[str, dict[str, Any]]:
    return effect_entries(fetch_effects(url, run_id=run_id))


def _checks(side: dict[str, Any], effects: dict[str, dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    checks = []
    for step in side["steps"]:
        if step["name"] not in EFFECT_STEPS:
            continue
        key = idempotency_key(side["run_id"], step["name"])
        counted = effects.get(key, {"requests": 0, "effects_applied": 0})
        checks.append(
            {
                "engine": engine,
                "step": step["name"],
                "what": "attempts == provider requests",
                "engine_value": step["attempts"],
                "provider_value": counted["requests"],
                "ok": step["attempts"] == counted["requests"],
            }
        )
        want = 1 if step["status"] == "completed" else None
        if want is not None:
            checks.append(
                {
                    "engine": engine,
                    "step": step["name"],
                    "what": "completed step's effect applied exactly once",
                    "engine_value": 1,
                    "provider_value": counted["effects_applied"],
                    "ok": counted["effects_applied"] == 1,
                }
            )
    return checks


async def compare(record: RunRecord, record_run_id: str, client, temporal_run_id: str,
                  provider_url: str | None, dbos: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole comparison as a dict; see the module docstring for each figure.

    ``dbos``: DBOS's column, as ``dbosflow.compare.dbos_side`` reads it (the
    caller reads it: this package does not depend on the DBOS engine)."""
    rec = record_side(record, record_run_id)
    tmp = await temporal_side(client, temporal_run_id)
    out: dict[str, Any] = {"record": rec, "temporal": tmp, "provider": None, "checks": []}
    dbos_run_id = dbos["run_id"] if dbos else None
    if dbos:
        out["dbos"] = dbos
    if provider_url:
        effects = {"record": provider_side(provider_url, record_run_id),
                   "temporal": provider_side(provider_url, temporal_run_id)}
        if dbos_run_id:
            effects["dbos"] = provider_side(provider_url, dbos_run_id)
        out["provider"] = {"url": provider_url, **effects}
        out["checks"] = _checks(rec, effects["record"], "record") + _checks(tmp, effects["temporal"], "temporal")
        if dbos_run_id:
            out["checks"] += _checks(out["dbos"], effects["dbos"], "dbos")
    return out


def _short(value: Any) -> str:
    if not isinstance(value, dict):
        return "" if value is None else str(value)
    for k in ("message_id", "ticket_id", "subject"):
        if k in value:
            return f"{k}={value[k]}" + (" (replayed)" if value.get("replayed") else "")
    return ""


def render(report: dict[str, Any]) -> str:
    """The comparison as text: per step a row per engine, each followed by the
    provider's count for its key; then the totals, what only one engine keeps,
    and the checks against the provider."""
    rec, tmp = report["record"], report["temporal"]
    lines = [
        f"Temporal run {tmp['run_id']}: {tmp['status']}    run record run {rec['run_id']}: {rec['status']}",
        "",
        f"  {'step':<18} {'engine':<9} {'status':<10} {'att':>3} {'rows/ev':>7} {'secs':>6}  recorded",
        *_step_rows(report),
        "",
        *_totals(report),
        "",
        *_only_here(report),
        *_checks_against_the_provider(report.get("checks") or []),
    ]
    # Results, identities and the provider's values are data: escaped for the terminal.
    return "\n".join(printable(line) for line in lines)


def _engine_row(name: str, engine: str, step: dict[str, Any], rows: int, recorded: str) -> str:
    seconds = "" if step["seconds"] is None else step["seconds"]
    return (f"  {name:<18} {engine:<9} {step['status']:<10} {step['attempts']:>3} {rows:>7} {seconds:>6}  "
            f"{recorded}  {_short(step['result'])}")


def _provider_row(counted: dict[str, Any] | None) -> list[str]:
    """The provider's count for one engine's key of a step; nothing when it holds no such key."""
    if not counted:
        return []
    return [f"  {'':<18} {'provider':<9} requests {counted['requests']}, effects applied {counted['effects_applied']}"]


def _step_rows(report: dict[str, Any]) -> list[str]:
    rec, tmp, dbs = report["record"], report["temporal"], report.get("dbos")
    prov = report.get("provider") or {}

    def counted(engine: str, run_id: str, step: str) -> dict[str, Any] | None:
        return prov.get(engine, {}).get(idempotency_key(run_id, step))

    lines: list[str] = []
    for n, (t, r) in enumerate(zip(tmp["steps"], rec["steps"], strict=True)):
        lines.append(_engine_row(t["name"], "temporal", t, len(t["events"]), ", ".join(t["events"])))
        lines += _provider_row(counted("temporal", tmp["run_id"], t["name"]))
        intents = ", ".join(f"#{i['attempt']} {i['state']}" for i in r["intents"]) or "no intents (no effect)"
        lines.append(_engine_row("", "record", r, r["rows"], f"step row; intents: {intents}"))
        lines += _provider_row(counted("record", rec["run_id"], r["name"]))
        if dbs:
            d = dbs["steps"][n]
            kept = "operation_outputs row (written when the step returned)" if d["rows"] else "no row (not recorded)"
            lines.append(_engine_row("", "dbos", d, d["rows"], kept))
            lines += _provider_row(counted("dbos", dbs["run_id"], d["name"]))
    return lines


def _totals(report: dict[str, Any]) -> list[str]:
    tt, rt, dbs = report["temporal"]["totals"], report["record"]["totals"], report.get("dbos")
    lines = [
        f"  totals   temporal: {tt['events']} events, {tt['bytes']} bytes of history "
        f"({tt['activity_events']} activity, {tt['workflow_task_events']} workflow-task, "
        f"{tt['timer_events']} timer, {tt['other_events']} other)",
        f"           record:   {rt['rows']} rows, {rt['bytes']} bytes "
        f"(runs {rt['runs_rows']}, steps {rt['steps_rows']}, intents {rt['intents_rows']})",
    ]
    if dbs:
        dt = dbs["totals"]
        lines.append(f"           dbos:     {dt['rows']} rows, {dt['bytes']} bytes ({dt['detail']})")
    return lines


def _only_here(report: dict[str, Any]) -> list[str]:
    """What each engine records that the others do not."""
    tmp, rec, dbs = report["temporal"]["only_here"], report["record"]["only_here"], report.get("dbos")
    lines = [
        "  only in Temporal's history:",
        f"    workflow-task events: {tmp['workflow_task_events']}; timer events: {tmp['timer_events']}",
        f"    identities (starter client, workers): {', '.join(tmp['worker_identities']) or 'none'}",
        "  only in the run record:",
        f"    intents: {rec['intents']} ({rec['in_doubt']} in doubt now, "
        f"{rec['settled_after_doubt']} settled after a crash left them in doubt)",
        f"    lease: {rec['lease']['holder'] or 'free'}",
    ]
    if dbs:
        only = dbs["only_here"]
        lines += [
            "  only in DBOS's record:",
            f"    application version {only['application_version']}, executor {only['executor_id']}, dispatches "
            f"(recovery_attempts) {only['recovery_attempts']}; no attempt starts, no intents, no lease",
        ]
    return lines


def _checks_against_the_provider(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return []
    return ["", "  checks against the provider:", *(
        f"    {'ok  ' if c['ok'] else 'DIFF'} {c['engine']:<8} {c['step']:<18} {c['what']}: "
        f"{c['engine_value']} vs {c['provider_value']}"
        for c in checks
    )]
