"""The faults: one run per subject and fault, its worker killed there, a standby worker started, the run
followed to its end, and what the provider applied and the stand-in was asked, counted where they happen.

A run's task names one order with all of its total left to refund: 4 turns (the lookup; the refund and its
email, two calls in one turn; the ticket; the final answer), so each run should leave 1 refund, 1 email and
1 ticket applied, and ask each turn once (a kill during a model request asks that turn again, on every
engine: its answer was lost before anything recorded it).

The five faults: the four crash points of ``peers.lane.CRASH_POINTS`` (worker A armed with ``CRASH_AT``), and
``MODEL_FAULT``: worker A on the slow stand-in, SIGKILLed by the driver as soon as the stand-in has counted
the run's turn-2 request (the request is in flight; its answer comes after the delay). Then worker B, not
armed, on the same queue; the run's result is awaited with a deadline (a run past it is terminated and
reported as such).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.testing.standin import turns_asked
from peers.lane import CRASH_POINTS
from peers.subjects import Context, Subject, effects_of

MODEL_FAULT = "model:during_request"
FAULTS = (*CRASH_POINTS, MODEL_FAULT)
EXPECTED = {"refund": 1, "email": 1, "ticket": 1}
TURNS = 4
ORDER_TOTAL = 4200
RUN_TIMEOUT = 120.0
DEATH_TIMEOUT = 90.0
_ORDERS = itertools.count(random.randrange(100_000, 900_000) * 10)


def new_task() -> tuple[str, dict[str, int]]:
    order = f"P-{next(_ORDERS)}"
    return f"Order {order} arrived broken: please refund it.", {order: ORDER_TOTAL}


@dataclass
class Trial:
    subject: str
    fault: str
    run_id: str
    killed: bool  # worker A died at the fault (False: the run never reached it)
    outcome: str  # "completed", or what ended the run otherwise
    effects: dict[str, dict[str, int]] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)  # model requests per turn, at the stand-in


async def run_fault(ctx: Context, subject: Subject, fault: str, tag: str) -> Trial:
    """One run of ``subject`` killed at ``fault`` and finished by a standby worker (the module docstring)."""
    subject.fresh_queue()
    task, orders = new_task()
    await asyncio.to_thread(seed_orders, ctx.provider_url, orders)
    run_id = f"peers-{tag}-{next(iter(orders)).lower()}"
    llm_url = ctx.slow_url if fault == MODEL_FAULT else ctx.standin_url
    armed = "" if fault == MODEL_FAULT else fault
    workers = [await subject.start_worker(run_id, crash_at=armed, llm_url=llm_url, name=f"{tag}-A")]
    a = workers[0]
    await subject.start_run(run_id, task)
    result = asyncio.ensure_future(subject.result(run_id, RUN_TIMEOUT))
    try:
        deadline = time.monotonic() + DEATH_TIMEOUT
        if fault == MODEL_FAULT:
            # Killed once the stand-in has counted turn 2's request: it is in flight (answered after the delay).
            while not result.done() and time.monotonic() < deadline:
                if (await asyncio.to_thread(turns_asked, llm_url, run_id)).get("2", 0) >= 1:
                    a.kill()
                    break
                await asyncio.sleep(0.02)
        while a.alive() and not result.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # Dead by its crash point (it says so before the SIGKILL), or by the driver's kill.
        killed = not a.alive() and (fault == MODEL_FAULT or "CRASH_AT=" in a.output())
        if not a.alive() and not killed:
            outcome = f"worker A exited {a.popen.returncode} before the fault: {a.last_lines(3)}"[:200]
            return Trial(subject.label, fault, run_id, False, outcome)
        if killed:
            workers.append(await subject.start_worker(run_id, crash_at="", llm_url=llm_url, name=f"{tag}-B"))
        outcome, _ = await result
    finally:
        result.cancel()
        for proc in workers:
            proc.kill()
    effects = effects_of(await asyncio.to_thread(fetch_effects, ctx.provider_url, run_id))
    turns = await asyncio.to_thread(turns_asked, llm_url, run_id)
    return Trial(subject.label, fault, run_id, killed, outcome, effects, turns)
