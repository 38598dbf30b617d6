"""Resets, as an operator does them: ``temporal workflow reset`` on runs that
completed and runs that failed, to each of their workflow tasks, with the
deterministic offline model and with one that words every answer
differently. Every reset run must end COMPLETED with each effect applied
exactly once, counted by the provider.

    .venv/bin/python -m lab.resets [--json]

It starts its own dev server (in memory), provider and two workers (one per
model mode), and prints one row per (model, run, reset point):

- ``first``: ``-t FirstWorkflowTask``: everything runs again, the draft too;
- ``after draft``: ``-e`` the workflow task that scheduled send_confirmation;
- ``after send``: ``-e`` the one that scheduled record_outcome;
- ``last``: ``-t LastWorkflowTask``.

A completed run is reset at each point in turn (each reset starts from the
newest run of the id); failed runs (the ticket API refusing with 503s until
their 2 s budget was spent) one per point, after the provider is back. A
reset is an operator's "try again from here": the attempts it keeps are
history, and every step's budget and death count start again at the reset
(``durable_agents/workflows/agent_flow.py``, ``_attempts``), so a failed run reset even to
its last task tries its failed step again. ``starter.py retry`` resets to
just before the failed step's first attempt.
What a re-run step did to its effect is read from the status: ``replayed``
(the same request as before: the provider answered from its store),
``adopted`` (a different request of the same run: ``durable_agents.steps.adoption``),
``applied`` (the first request that reached the provider) or ``kept``
(before the reset point: not run again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.status import run_status
from durable_agents.providerclient import ProviderClient, fetch_effects
from durable_agents.steps.retry import RetryRule
from lab.processes import LAB_SERVER_CONFIG, DevServer, start_worker, temporal_cli, wait_until
from lab.provider_process import start_provider

POINTS = ("first", "after draft", "after send", "last")
TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"


def reset_point(point: str, history) -> int:
    """The workflow task a reset to ``point`` goes back to: its WorkflowTaskCompleted event id."""
    completed = [e.event_id for e in history.events if e.HasField("workflow_task_completed_event_attributes")]
    if point == "first":
        return completed[0]
    if point == "last":
        return completed[-1]
    step = {"after draft": "send_confirmation", "after send": "record_outcome"}[point]
    scheduled = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
                 and e.activity_task_scheduled_event_attributes.activity_type.name == step]
    return scheduled[0].activity_task_scheduled_event_attributes.workflow_task_completed_event_id


def reset(address: str, run_id: str, point: str, history) -> int:
    """Reset ``run_id`` with the temporal CLI as an operator would; returns the event id it went back to."""
    event_id = reset_point(point, history)
    argv = [temporal_cli(), "workflow", "reset", "--address", address, "--workflow-id", run_id,
            "--reason", f"lab.resets: {point}"]
    if point == "first":
        argv += ["--type", "FirstWorkflowTask"]
    elif point == "last":
        argv += ["--type", "LastWorkflowTask"]
    else:
        argv += ["--event-id", str(event_id)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"temporal workflow reset failed ({done.returncode}): {done.stderr or done.stdout}")
    return event_id


def _what(name: str, step: dict, history, after_event: int) -> str:
    """What the reset run did with one step: kept it, or ran it again and how that went."""
    again = [e for e in history.events if e.event_id > after_event
             and e.HasField("activity_task_scheduled_event_attributes")
             and e.activity_task_scheduled_event_attributes.activity_type.name == name]
    if not again:
        return "kept"
    if name == "draft":
        return "re-run"
    if step["status"] == "adopted":
        return "adopted"
    return "replayed" if (step["result"] or {}).get("replayed") else "applied"


async def _closed(client, run_id: str, newer_than: str | None = None) -> dict:
    async def check():
        handle = client.get_workflow_handle(run_id)
        if newer_than is not None and (await handle.describe()).run_id == newer_than:
            return None
        status = await run_status(client, run_id)
        return status if status["status"] not in ("running",) else None

    return await wait_until(check, 90, f"run {run_id} to close", interval=0.2)


async def _reset_and_wait(client, address: str, run_id: str, point: str) -> tuple[dict, int]:
    """Reset ``run_id`` to ``point`` as an operator does; the status of the run the reset made,
    once closed, and the event id it was reset to."""
    handle = client.get_workflow_handle(run_id)
    old_run = (await handle.describe()).run_id
    event_id = reset(address, run_id, point, await handle.fetch_history())
    return await _closed(client, run_id, newer_than=old_run), event_id


async def matrix(say=print) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="resets-") as tmp:
        work = Path(tmp)
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider_proc = start_provider(work / "provider.db")
        url = provider_proc.url
        workers = []
        try:
            client = await connect({**os.environ, "TEMPORAL_ADDRESS": server.address})
            for mode, vary in (("deterministic", "0"), ("varying", "1")):
                queue = f"resets-{mode}-{uuid.uuid4().hex[:6]}"
                workers.append(start_worker(server.address, url, queue,
                                            {"MEMORY_DB": str(work / f"memory-{mode}.db"), "LLM_OFFLINE_VARY": vary}))
                from durable_agents.flowclient.runs import start_run

                # A completed run, reset at every point in turn.
                run_id = f"reset-{mode}-{uuid.uuid4().hex[:6]}"
                await start_run(client, run_id, TASK, EMAIL, queue=queue)
                await _closed(client, run_id)
                for point in POINTS:
                    after, event_id = await _reset_and_wait(client, server.address, run_id, point)
                    rows.append(await _row(client, mode, "completed", point, run_id, after, url, event_id))
                    say(_line(rows[-1]))

                # Failed runs (the ticket API down until the 2 s budget was spent), one per reset
                # point, each reset once the API is back.
                for point in POINTS:
                    run_id = f"reset-{mode}-failed-{uuid.uuid4().hex[:6]}"
                    async with ProviderClient(url) as pc:
                        await pc.set_faults(fail_next=10_000, status=503, kinds=["ticket"])
                        await start_run(client, run_id, TASK, EMAIL, queue=queue, rule=RetryRule(budget_seconds=2))
                        await _closed(client, run_id)
                        await pc.clear_faults()
                    after, event_id = await _reset_and_wait(client, server.address, run_id, point)
                    rows.append(await _row(client, mode, "failed", point, run_id, after, url, event_id))
                    say(_line(rows[-1]))
        finally:
            for w in workers:
                w.kill()
            provider_proc.stop()
            server.stop()
    return rows


async def _row(client, mode: str, was: str, point: str, run_id: str, after: dict, url: str, event_id: int) -> dict:
    effects = {e.key.rsplit("/", 1)[-1]: e for e in fetch_effects(url, run_id=run_id)}
    history = await client.get_workflow_handle(run_id).fetch_history()
    steps = {s["name"]: _what(s["name"], s, history, event_id) for s in after["steps"]}
    return {
        "model": mode, "run": was, "reset to": point, "run_id": run_id, "outcome": after["status"],
        "draft": steps["draft"], "send_confirmation": steps["send_confirmation"],
        "record_outcome": steps["record_outcome"],
        "emails applied": effects["send_confirmation"].effects_applied if "send_confirmation" in effects else 0,
        "tickets applied": effects["record_outcome"].effects_applied if "record_outcome" in effects else 0,
        "reset event id": event_id,
    }


def _line(row: dict) -> str:
    return (f"{row['model']:<14} {row['run']:<10} {row['reset to']:<12} {row['outcome']:<10} "
            f"{row['draft']:<9} {row['send_confirmation']:<18} {row['record_outcome']:<15} "
            f"{row['emails applied']:>6} {row['tickets applied']:>7}")


HEADER = (f"{'model':<14} {'run was':<10} {'reset to':<12} {'outcome':<10} {'draft':<9} {'send_confirmation':<18} "
          f"{'record_outcome':<15} {'emails':>6} {'tickets':>7}")


def ok(rows: list[dict]) -> bool:
    return all(r["outcome"] == "completed" and r["emails applied"] == 1 and r["tickets applied"] == 1 for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.resets", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.json:
        print(HEADER, flush=True)
    rows = asyncio.run(matrix(say=(lambda line: None) if args.json else (lambda line: print(line, flush=True))))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("PASS every reset run completed, each effect applied once" if ok(rows) else "FAIL see the rows above")
    return 0 if ok(rows) else 1


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
