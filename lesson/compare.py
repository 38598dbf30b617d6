"""Side by side: what Temporal's event history recorded for one run, what the
run record holds for another run of the same task and, with ``--dbos``, what
DBOS keeps for a third, with the provider's own counts for each run's
idempotency keys.

    python -m lesson.compare RECORD_RUN_ID --temporal TEMPORAL_RUN_ID [--dbos DBOS_RUN_ID] [--json] [--html PATH]

The lab's command, run from the checkout: the adapter's packages read their own records
(``durable_agents.runrecord.compare``, ``durable_agents.flowclient.compare``,
``durable_agents.dbosflow.compare``) and start nothing of the lab.

Three run ids, because the keys derive from the run id: the same id on two
engines would make the second engine's email a replay of the first's.

Each engine reads its own record: the run record ``durable_agents.runrecord.compare.
record_side``, Temporal ``durable_agents.flowclient.compare.temporal_side``, DBOS
``durable_agents.dbosflow.compare.dbos_side`` (asked of ``python -m durable_agents.dbosflow steps --json``
in a process of its own: the DBOS engine is an optional extra). This module,
in the layer that puts engines side by side, lays them out and asks the
provider. ``compare(...)`` returns a ``Comparison`` (``--json`` prints it); ``render``
makes the table, ``compare_page`` the picture (``--html``, a lane per engine
from ``lesson.lanes``). Figures:

- per step, Temporal: the activity's events, attempts, scheduled / started /
  closed times and result; the record: its rows (the step row plus one intent
  per attempt of an effect step), attempts, times, result and intents; DBOS:
  one ``operation_outputs`` row per recorded step;
- totals: Temporal's events and history bytes (the serialized ``History``
  protobuf, as the server stores and ships it); the record's rows and bytes
  (sum of the stored values' lengths across its three tables; SQLite's page
  and index overhead not counted, as the history's storage overhead is not);
  DBOS's rows and bytes by the same rule as the record's;
- what only one side records: Temporal's workflow-task events, timer events,
  worker identities and bookkeeping events; the record's intents (including
  any in doubt) and its lease; DBOS's application version, executor and
  dispatches;
- for the picture: Temporal's every activity execution and workflow task, and
  per key the provider's ``kind``, ``first_seen`` and ``last_seen`` beside its
  counts;
- checks: for each effect step, attempts against the provider's request count
  for its key, and effects applied once per completed step. An attempt killed
  before it sent anything is counted by the engine and not by the provider,
  so after such a crash the two may differ by design; the check says so.

Exit codes: 0 the comparison was printed; 2 bad input, an unknown run id on
any engine, Temporal or the provider unreachable, or an unwritable ``--html``
path.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

from temporalio.client import Client

from durable_agents.dbosflow.sides import DbosSide
from durable_agents.flowclient.compare import temporal_side
from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.sides import TemporalSide
from durable_agents.flowclient.status import TemporalRunNotFound
from durable_agents.payloadcodec import CodecConfigError
from durable_agents.providerclient import provider_url_from_env
from durable_agents.runrecord.compare import record_side
from durable_agents.runrecord.sides import RecordSide
from durable_agents.runrecord.store import RecordRunNotFound, RunRecord, SchemaError, SettingError, db_path_from
from durable_agents.steps.controls import basic_config, printable
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.limits import InputError, check_run_id
from durable_agents.steps.plan import EFFECT_STEPS
from durable_agents.steps.runstate import JsonValue
from durable_agents.steps.sides import EffectEntry, Side, SideStep
from lesson.effects import provider_side
from lesson.lanes import dbos_lane, record_lane, temporal_lane
from timeline import render_page

EXIT_OK, EXIT_INPUT = 0, 2
DBOS_SIDE_TIMEOUT = 120.0  # seconds for `python -m durable_agents.dbosflow steps --json` (it only reads DBOS's tables)


class Check(TypedDict):
    """One check of an engine's record against the provider's count."""

    engine: str
    step: str
    what: str
    engine_value: int
    provider_value: int
    ok: bool


class ProviderCounts(TypedDict):
    """The provider's count per key (``lesson.effects.provider_side``) for each engine's run."""

    url: str
    record: dict[str, EffectEntry]
    temporal: dict[str, EffectEntry]
    dbos: NotRequired[dict[str, EffectEntry]]


class Comparison(TypedDict):
    """What ``compare`` returns and ``--json`` prints: each engine's side (``durable_agents.steps.sides``), the
    provider's counts (None without PROVIDER_URL) and the checks against them."""

    record: RecordSide
    temporal: TemporalSide
    provider: ProviderCounts | None
    checks: list[Check]
    dbos: NotRequired[DbosSide]


def _checks(run_id: str, steps: Sequence[SideStep], effects: Mapping[str, EffectEntry], engine: str) -> list[Check]:
    checks: list[Check] = []
    for step in steps:
        if step["name"] not in EFFECT_STEPS:
            continue
        found = effects.get(idempotency_key(run_id, step["name"]))
        counted = (found["requests"], found["effects_applied"]) if found else (0, 0)
        checks.append(
            {
                "engine": engine,
                "step": step["name"],
                "what": "attempts == provider requests",
                "engine_value": step["attempts"],
                "provider_value": counted[0],
                "ok": step["attempts"] == counted[0],
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
                    "provider_value": counted[1],
                    "ok": counted[1] == 1,
                }
            )
    return checks


async def compare(record: RunRecord, record_run_id: str, client: Client, temporal_run_id: str,
                  provider_url: str | None, dbos: DbosSide | None = None) -> Comparison:
    """The whole comparison as a dict; see the module docstring for each figure.

    ``client``: a Temporal client (``durable_agents.flowclient.connect``). ``dbos``: DBOS's column, as
    ``durable_agents.dbosflow.compare.dbos_side`` reads it (the caller reads it: the DBOS engine is an optional
    extra)."""
    rec = record_side(record, record_run_id)
    tmp = await temporal_side(client, temporal_run_id)
    out: Comparison = {"record": rec, "temporal": tmp, "provider": None, "checks": []}
    if dbos:
        out["dbos"] = dbos
    if provider_url:
        counts: ProviderCounts = {"url": provider_url, "record": provider_side(provider_url, record_run_id),
                                  "temporal": provider_side(provider_url, temporal_run_id)}
        out["provider"] = counts
        out["checks"] = (_checks(record_run_id, rec["steps"], counts["record"], "record")
                         + _checks(temporal_run_id, tmp["steps"], counts["temporal"], "temporal"))
        if dbos:
            counts["dbos"] = provider_side(provider_url, dbos["run_id"])
            out["checks"] += _checks(dbos["run_id"], dbos["steps"], counts["dbos"], "dbos")
    return out


def _short(value: JsonValue) -> str:
    if not isinstance(value, dict):
        return "" if value is None else str(value)
    # An effect's id, whatever its kind (message_id, ticket_id, refund_id), else a draft's subject.
    for k in [k for k in value if k.endswith("_id") and k != "run_id"] + ["subject"]:
        if k in value:
            return f"{k}={value[k]}" + (" (replayed)" if value.get("replayed") else "")
    return ""


def render(report: Comparison) -> str:
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
        *_checks_against_the_provider(report["checks"]),
    ]
    # Results, identities and the provider's values are data: escaped for the terminal.
    return "\n".join(printable(line) for line in lines)


def _engine_row(name: str, engine: str, step: SideStep, rows: int, recorded: str) -> str:
    seconds = "" if step["seconds"] is None else step["seconds"]
    return (f"  {name:<18} {engine:<9} {step['status']:<10} {step['attempts']:>3} {rows:>7} {seconds:>6}  "
            f"{recorded}  {_short(step['result'])}")


def _provider_row(counted: EffectEntry | None) -> list[str]:
    """The provider's count for one engine's key of a step; nothing when it holds no such key."""
    if not counted:
        return []
    return [f"  {'':<18} {'provider':<9} requests {counted['requests']}, effects applied {counted['effects_applied']}"]


def _counts(report: Comparison) -> dict[str, dict[str, EffectEntry]]:
    """The provider's count per key, by engine; empty without a provider."""
    prov = report["provider"]
    if prov is None:
        return {}
    counts = {"record": prov["record"], "temporal": prov["temporal"]}
    if "dbos" in prov:
        counts["dbos"] = prov["dbos"]
    return counts


def _step_rows(report: Comparison) -> list[str]:
    rec, tmp, dbs = report["record"], report["temporal"], report.get("dbos")
    prov = _counts(report)

    def counted(engine: str, run_id: str, step: str) -> EffectEntry | None:
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


def _totals(report: Comparison) -> list[str]:
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


def _only_here(report: Comparison) -> list[str]:
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


def _checks_against_the_provider(checks: list[Check]) -> list[str]:
    if not checks:
        return []
    return ["", "  checks against the provider:", *(
        f"    {'ok  ' if c['ok'] else 'DIFF'} {c['engine']:<8} {c['step']:<18} {c['what']}: "
        f"{c['engine_value']} vs {c['provider_value']}"
        for c in checks
    )]


def compare_page(report: Comparison) -> str:
    """``--html PATH``: the comparison's runs as one page, a lane per engine (``lesson.lanes``)."""
    provider = _counts(report)
    rec, tmp, dbs = report["record"], report["temporal"], report.get("dbos")
    lanes = [record_lane(rec, provider.get("record")), temporal_lane(tmp, provider.get("temporal"))]
    # Per engine: its side, its steps' attempts, its size
    columns: list[tuple[str, Side, Sequence[SideStep], str]] = [
        ("record", rec, rec["steps"], f"{rec['totals']['rows']} rows"),
        ("temporal", tmp, tmp["steps"], f"{tmp['totals']['events']} events")]
    if dbs:
        lanes.append(dbos_lane(dbs, provider.get("dbos")))
        columns.append(("dbos", dbs, dbs["steps"], f"{dbs['totals']['rows']} rows"))
    rows: list[list[str]] = [["engine", "run", "status", "attempts per step", "rows / events", "checks"]]
    for engine, side, steps, size in columns:
        checks = [c for c in report["checks"] if c["engine"] == engine]
        rows.append([engine, side["run_id"], side["status"], ", ".join(str(s["attempts"]) for s in steps),
                     size, (f"{sum(c['ok'] for c in checks)} of {len(checks)} ok" if checks else
                            "no provider (PROVIDER_URL)")])
    notes = ["Each lane has its own time axis: the runs ran at different times. Times from a record are drawn "
             "with solid edges, times only observed with dashed ones; this page was drawn from the records "
             "alone, so it has no kill or restart marks (make scenario draws those)."]
    return render_page("The same task on each engine, from their records", "python -m lesson.compare: the run "
                       "record's run beside Temporal's" + (" and DBOS's" if report.get("dbos") else "") + ".",
                       lanes, summary=rows, notes=notes)


def _dbos_side(args: argparse.Namespace) -> DbosSide | None:
    """DBOS's column of ``--dbos``, asked of DBOS's own command in a process of
    its own (``python -m durable_agents.dbosflow steps RUN_ID --json``, which prints
    ``durable_agents.dbosflow.compare.dbos_side``): the DBOS engine is an optional extra, and
    launching it is its own business."""
    if not args.dbos:
        return None
    run_id = check_run_id(args.dbos)
    if importlib.util.find_spec("dbos") is None:
        raise InputError("--dbos needs the dbos extra (DBOS Transact): pip install -e '.[dbos]' "
                         "(make test installs it with the dev extra)")
    argv = [sys.executable, "-m", "durable_agents.dbosflow", "steps", run_id, "--json"]
    done = subprocess.run(argv + (["--db", args.dbos_db] if args.dbos_db else []), capture_output=True, text=True,
                          timeout=DBOS_SIDE_TIMEOUT)
    if done.returncode == 0:
        side: DbosSide = json.loads(done.stdout)
        return side
    said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    if done.returncode == 2 and said:  # dbosflow's own refusal (no such run, or bad input): this command's input
        raise InputError(said[-1].removeprefix("error: "))
    raise RuntimeError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


async def _compare(args: argparse.Namespace) -> int:
    record_id = check_run_id(args.run_id)
    temporal_id = check_run_id(args.temporal)
    with RunRecord(db_path_from(args.db)) as record:
        record.load(record_id)  # unknown id: say so before connecting anywhere
        client = await connect()
        try:
            report = await compare(record, record_id, client, temporal_id, provider_url_from_env(os.environ),
                                   dbos=_dbos_side(args))
        except TemporalRunNotFound as err:  # --temporal names no run: this command's input
            raise InputError(str(err)) from err
    print(json.dumps(report, indent=2) if args.json else render(report), flush=True)
    if args.html:
        path = Path(args.html)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(compare_page(report))
        except OSError as err:
            raise InputError(f"cannot write --html {path}: {err.strerror or err}; give a path in a writable "
                             "directory") from err
        print(printable(f"the picture of it: {path} (open it in a browser)"),
              file=sys.stderr if args.json else sys.stdout, flush=True)
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lesson.compare",
                                description="A run record's run beside a Temporal run of the same task (and a DBOS "
                                "run's, with --dbos), each from its own record, with the provider's counts for their "
                                "keys.")
    p.add_argument("run_id", metavar="RECORD_RUN_ID")
    p.add_argument("--temporal", required=True, metavar="TEMPORAL_RUN_ID")
    p.add_argument("--dbos", default=None, metavar="DBOS_RUN_ID",
                   help="also a DBOS run of the same task (python -m durable_agents.dbosflow; needs the dbos extra)")
    p.add_argument("--db", default=None,
                   help="the run record's SQLite file (default: $RUNRECORD_DB or .state/runrecord.db)")
    p.add_argument("--dbos-db", default=None,
                   help="DBOS's system database, a SQLite file or a postgresql:// URL (default: $DBOSFLOW_DB or "
                        ".state/dbosflow.db)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", default=None, metavar="PATH",
                   help="also draw the runs as one page (a lane per engine, from their records), written to PATH")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    basic_config(logging.WARNING, "%(message)s")  # the SDK's warnings, escaped like every other line
    try:
        return asyncio.run(_compare(args))
    except (InputError, RecordRunNotFound, SchemaError, SettingError, ConnectionError, CodecConfigError) as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return EXIT_INPUT


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
