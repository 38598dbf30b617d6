"""Several worker processes on one task queue: they share the work, and
SIGKILL of one of them while runs are in flight loses nothing and repeats no
effect (the provider's own counts say so)."""

from __future__ import annotations

import asyncio

from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import run_status
from durable_agents.providerclient import fetch_effects
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.startedline import started_in
from tests.support import poll_until

RUNS = 8


def started_steps(proc) -> int:
    """Executions a worker began, of any step and run (its started lines, ``durable_agents.steps.startedline``)."""
    return len(started_in(proc.output()))


async def test_two_workers_share_a_queue_and_one_dying_loses_nothing(client, workers, provider, run_id, task_queue):
    # Slowed down so that runs overlap and the kill lands while work is in flight.
    paced = {"LAB_STEP_SECONDS": "0.4"}
    first = workers(extra_env=paced)
    second = workers(extra_env=paced)
    run_ids = [f"{run_id}-{i}" for i in range(RUNS)]
    results = await asyncio.gather(*(
        start_run(client, rid, f"Confirm the refund for order {i}", f"customer{i}@example.com", queue=task_queue)
        for i, rid in enumerate(run_ids)
    ))
    assert all(created for created, _ in results)

    # Both processes take tasks from the one queue.
    await poll_until(lambda: started_steps(first) >= 1 and started_steps(second) >= 1, timeout=60,
                     what=f"both workers to start steps (worker1: {started_steps(first)}, "
                          f"worker2: {started_steps(second)})")
    first.kill()  # SIGKILL: no goodbye, activities in flight on it are abandoned
    statuses = [await run_status(client, rid) for rid in run_ids]
    assert any(s["status"] == "running" for s in statuses), "every run had finished before the kill"

    async def all_closed():
        got = [await run_status(client, rid) for rid in run_ids]
        return got if all(s["status"] != "running" for s in got) else None

    final = await poll_until(all_closed, timeout=180, interval=0.5, what="every run to close after the kill")
    assert [s["status"] for s in final] == ["completed"] * RUNS, [(s["run_id"], s["error"]) for s in final]
    assert started_steps(second) > 0
    # Steps ran at least once; every effect was applied exactly once.
    for rid in run_ids:
        effects = {e.key: e for e in fetch_effects(provider.url, run_id=rid)}
        assert set(effects) == {idempotency_key(rid, "send_confirmation"), idempotency_key(rid, "record_outcome")}
        assert all(e.effects_applied == 1 for e in effects.values()), (rid, effects)
    # The work was split: together the two processes started at least every step once.
    assert started_steps(first) + started_steps(second) >= 3 * RUNS
