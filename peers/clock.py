"""The clock: what each subject costs per turn, and how long a kill holds a run up, in the same invocation.

1. **Time per turn**, the stand-in answering at once: a task of two orders (6 turns, 7 tool calls), started
   on a worker already polling, from the start call to the run's result in the caller's hands, divided by 6.
   Every subject's worker polls at once and the runs go round by round, one of each subject per round, the
   order reversed every other round (``per_turn``): load that drifts over the clock's minutes falls on all
   alike. The first round is a warm-up and not counted. The peers and the lab's loop on Temporal run in worker
   processes (``peers.subjects``); the lab's run record and DBOS, and the bare loop (no engine at all: the
   baseline), run in this process through ``bench/bench_loop.py``'s ``InProcess`` with its model pointed at
   the same stand-in over HTTP.
2. **History events per turn** of the Temporal runs: the closed run's event count over its turns.
3. **From a kill to the run done, with a standby ready**: worker A armed at ``tool:issue_refund:after_effect``
   and worker B not armed, both polling before a run starts; runs are started until A takes one and dies
   (when B takes a run, it completes untouched and another is started); from A seen dead to the run's result.
   The lab's run record and DBOS through ``bench_loop.cli_kill`` (their resume is a fresh process started as
   soon as the first is seen dead: its interpreter start-up is part of the figure).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_agents.providerclient import seed_orders
from peers.faults import RUN_TIMEOUT
from peers.subjects import Context, Subject

KILL_POINT = "tool:issue_refund:after_effect"
CLOCK_TURNS = 6
MAX_KILL_RUNS = 8


@dataclass
class Figures:
    subject: str
    per_turn: list[float] = field(default_factory=list)  # seconds
    events_per_turn: list[float] = field(default_factory=list)
    kill_to_done: list[float] = field(default_factory=list)  # seconds
    note: str = ""


def clock_task() -> tuple[str, dict[str, int]]:
    from peers.faults import new_task

    (_, first), (_, second) = new_task(), new_task()
    orders = {**first, **second}
    return "Orders " + " and ".join(orders) + " arrived broken: please refund both.", orders


async def per_turn(ctx: Context, subjects: list[Subject], runs: int, figures: list[Figures]) -> None:
    """Every subject's worker polling at once, and their runs taken in turn: round by round, one run of each,
    the order reversed every other round, so the machine's drift over the minutes of the clock falls on every
    subject alike rather than on whichever was measured last. The first round warms the workers up."""
    workers = []
    try:
        for subject in subjects:
            subject.fresh_queue()
            workers.append(await subject.start_worker(f"peers-clock-{subject.queue}", crash_at="",
                                                      llm_url=ctx.standin_url, name="clock"))
        pairs = list(zip(subjects, figures, strict=True))
        for i in range(runs + 1):
            for subject, f in pairs if i % 2 == 0 else reversed(pairs):
                if not f.note:
                    await _clocked(ctx, subject, i, f)
    finally:
        for worker in workers:
            worker.kill()


async def _clocked(ctx: Context, subject: Subject, i: int, figures: Figures) -> None:
    task, orders = clock_task()
    await asyncio.to_thread(seed_orders, ctx.provider_url, orders)
    run_id = f"peers-clock-{subject.queue}-{i}"
    began = time.perf_counter()
    await subject.start_run(run_id, task)
    outcome, _ = await subject.result(run_id, RUN_TIMEOUT)
    seconds = time.perf_counter() - began
    if outcome != "completed":
        figures.note = f"a clock run ended: {outcome}"
    elif i:  # the first run warms the worker up
        figures.per_turn.append(seconds / CLOCK_TURNS)
        figures.events_per_turn.append(await subject.history_events(run_id) / CLOCK_TURNS)


async def kill_to_done(ctx: Context, subject: Subject, trials: int, figures: Figures) -> None:
    for _ in range(trials):
        subject.fresh_queue()
        label = f"peers-kill-{subject.queue}"
        armed, standby = await asyncio.gather(
            subject.start_worker(label, crash_at=KILL_POINT, llm_url=ctx.standin_url, name="armed"),
            subject.start_worker(label, crash_at="", llm_url=ctx.standin_url, name="standby"))
        try:
            for i in range(MAX_KILL_RUNS):
                task, orders = clock_task()
                await asyncio.to_thread(seed_orders, ctx.provider_url, orders)
                run_id = f"{label}-{i}"
                await subject.start_run(run_id, task)
                result = asyncio.ensure_future(subject.result(run_id, RUN_TIMEOUT))
                while armed.alive() and not result.done():
                    await asyncio.sleep(0.02)
                died = time.time()
                outcome, ended = await result
                if not armed.alive():
                    if outcome == "completed":
                        figures.kill_to_done.append(ended - died)
                    else:
                        figures.note = f"a killed run ended: {outcome}"
                    break
            else:
                figures.note = f"the armed worker took none of {MAX_KILL_RUNS} runs"
        finally:
            armed.kill()
            standby.kill()


async def lab_in_process(ctx: Context, runs: int, kills: int) -> list[Figures]:
    """The bare loop, the run record and DBOS: ``bench/bench_loop.py``'s own harness, called."""
    from bench import bench_loop

    work = Path(ctx.work)
    bare, record, dbos = bench_loop.BARE, bench_loop.RECORD, bench_loop.DBOS_ENGINE
    out = {e: Figures(name) for e, name in ((bare, "the bare loop (no engine)"), (record, "the lab's run record"),
                                            (dbos, "the lab's loop on DBOS"))}
    eng = bench_loop.InProcess(work, ctx.provider_url, ctx.server)
    # The same model as every other subject: the stand-in over HTTP, not the scripted model in this process.
    eng.env.update({"LLM_BASE_URL": ctx.standin_url, "LLM_MODEL": "scripted"})
    eng.deps = {e: bench_loop.probed_deps(eng.env, eng.probe) for e in bench_loop.WITH_DEPS}
    async with eng:
        for i in range(runs + 1):
            for engine, figures in out.items():
                timed = await eng.run(engine, CLOCK_TURNS)
                if i:
                    figures.per_turn.append(timed.end / CLOCK_TURNS)
        await eng.close_engines()
    for engine in (record, dbos):
        for _ in range(kills):
            kill: Any = await bench_loop.cli_kill(engine, KILL_POINT, CLOCK_TURNS, work, ctx.provider_url)
            out[engine].kill_to_done.append(kill.total)
    out[record].note = out[dbos].note = "kill: the resume is a new process (its start-up included)"
    return list(out.values())


def environment_note() -> str:
    return f"{os.cpu_count()} cores"
