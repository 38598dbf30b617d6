"""Outages of the email and ticket API, on both engines: the provider process
is really stopped while runs reach their email, for each length given, and
started again on the same port and store; then, for a run that failed
because the outage outlasted its budget, ``retry``.

    .venv/bin/python -m lab.outage [--outages 12,30,120] [--budget 900] [--json]

Each outage length gets a provider of its own, so the rows run side by side
(the longest outage sets the wall time). Per row and engine: the outcome
when the provider is back, the attempts the email step made, how long after
the provider's return the run completed, and, for a run that failed, the
outcome of ``retry`` and the effects the provider applied (each must be 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from durable_agents.providerclient import fetch_effects
from durable_agents.steps.retry import RetryRule
from lab.engines import EngineDriver, RunRecordDriver, TemporalDriver
from lab.processes import LAB_SERVER_CONFIG, DevServer
from lab.provider_process import start_provider

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"


async def _row(server: DevServer, work: Path, outage: float, budget: float, say) -> dict:
    provider = start_provider(work / f"provider-{outage:g}.db")  # stopped and started again on this port and store
    # The two engines' drivers (lab.engines), each with files of its own; the run record's rule from its
    # environment, as `python -m durable_agents.runrecord start` reads it, Temporal's given to the run it starts.
    temporal = TemporalDriver(server, {"PROVIDER_URL": provider.url, "MEMORY_DB": str(work / f"memory-{outage:g}.db")},
                              queue=f"outage-{outage:g}-{uuid.uuid4().hex[:6]}", timeout=budget + 300, poll=0.5)
    record = RunRecordDriver({"RUNRECORD_DB": str(work / f"runrecord-{outage:g}.db"),
                              "MEMORY_DB": str(work / f"memory-r-{outage:g}.db"), "PROVIDER_URL": provider.url,
                              "LAB_RETRY_BUDGET_SECONDS": f"{budget:g}"}, timeout=budget + 300)
    temporal_id, record_id = (f"outage-{outage:g}-t-{uuid.uuid4().hex[:4]}",
                              f"outage-{outage:g}-r-{uuid.uuid4().hex[:4]}")
    try:
        worker = await temporal.start_worker()
        provider.kill()
        down = time.monotonic()
        await temporal.submit(temporal_id, TASK, EMAIL, rule=RetryRule(budget_seconds=budget))
        runner = await record.start(record_id, TASK, EMAIL)
        await asyncio.sleep(max(0.0, outage - (time.monotonic() - down)))  # the outage itself, not a wait for state
        provider.restart()
        back = time.monotonic()
        say(f"  outage {outage:g} s: provider back")

        t_status = (await temporal.settle(temporal_id, worker)).status
        t_done = time.monotonic() - back
        r_status = (await record.settle(record_id, runner)).status
        r_done = time.monotonic() - back
        result: dict[str, Any] = {"outage seconds": outage, "budget seconds": budget, "engines": {}}
        drivers: tuple[tuple[EngineDriver, str, Any, float], ...] = (
            (temporal, temporal_id, t_status, t_done), (record, record_id, r_status, r_done))
        for driver, run_id, status, took in drivers:
            entry = {"outcome": status["status"], "email attempts": status["steps"][1]["attempts"],
                     "completed after return (s)": round(took, 1) if status["status"] == "completed" else None,
                     "error": status.get("error"), "retry": None}
            if status["status"] == "failed":
                retried = await driver.retry(run_id, timeout=300)
                entry["retry"] = retried["status"] if retried else None
            effects = {e.key.rsplit("/", 1)[-1]: e.effects_applied for e in fetch_effects(provider.url, run_id=run_id)}
            entry["emails applied"] = effects.get("send_confirmation", 0)
            entry["tickets applied"] = effects.get("record_outcome", 0)
            result["engines"][driver.name] = entry
        return result
    finally:
        temporal.close()
        record.close()
        provider.kill()


async def table(outages: list[float], budget: float, say=print) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="outage-") as tmp:
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        try:
            return list(await asyncio.gather(*(_row(server, Path(tmp), o, budget, say) for o in outages)))
        finally:
            server.stop()


def render(rows: list[dict]) -> str:
    lines = [f"{'outage':>7} {'budget':>7} {'engine':<10} {'outcome':<10} {'email attempts':>14} "
             f"{'done after return':>17} {'retry':<10} {'emails':>6} {'tickets':>7}"]
    for row in rows:
        for engine, e in row["engines"].items():
            done = "" if e["completed after return (s)"] is None else f"{e['completed after return (s)']:.1f} s"
            lines.append(f"{row['outage seconds']:>6g}s {row['budget seconds']:>6g}s {engine:<10} {e['outcome']:<10} "
                         f"{e['email attempts']:>14} {done:>17} {e['retry'] or '':<10} {e['emails applied']:>6} "
                         f"{e['tickets applied']:>7}")
    return "\n".join(lines)


def ok(rows: list[dict]) -> bool:
    return all(e["emails applied"] == 1 and e["tickets applied"] == 1
               and (e["outcome"] == "completed" or e["retry"] == "completed")
               for row in rows for e in row["engines"].values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.outage", description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="12,30,120", help="outage lengths in seconds, comma-separated")
    parser.add_argument("--budget", type=float, default=900.0, help="the step budget the runs record (default 900)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    outages = [float(x) for x in args.outages.split(",") if x.strip()]
    rows = asyncio.run(table(outages, args.budget, say=(lambda line: None) if args.json else print))
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    if not args.json:
        print("PASS every run completed (or completed on retry), each effect applied once" if ok(rows)
              else "FAIL see the rows above")
    return 0 if ok(rows) else 1


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
