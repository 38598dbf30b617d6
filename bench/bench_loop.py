"""The agent loop on three engines against the same loop with no engine at all, in one invocation.

    .venv/bin/python bench/bench_loop.py [--turns 22] [--runs 8] [--kills 3] [--long-turns 102]
                                         [--long-runs 2] [--can-bound 150]

The model is the scripted one (``durable_agents.drafting.scripted.ScriptedModel``) **in the process that runs the
loop**, on every engine and in the baseline alike: no model server, no delay; it answers in well under a
millisecond. The tools are the provider's, a separate process on loopback (``lab.provider_process``),
one for the whole invocation; every run has orders of its own, seeded before it starts, each with all of
its total left to refund, so a task of k orders takes 2k + 2 turns and 3k + 1 tool calls (``--turns 22``:
k = 10, 31 calls, 21 of them effects). Window bounds, turn limit and retry rule: the defaults, the same
everywhere (the turn limit raised to fit the task).

1. **Per turn and per tool call, in process.** The baseline is the bare loop: ``durable_agents.steps.loop.LoopPlan``,
   ``model_turn`` and ``run_tool`` called one after the other in a plain Python loop, the results in a
   dict, nothing recorded; the prompt is memory's window appended to as results come, as Temporal's
   workflow and DBOS's walk build it (the run record derives it again from the record every turn: that
   is part of its overhead).
   Beside it, interleaved run by run: the engine's floor, ``bare-tmp`` (bench/bare_temporal_loop.py: the same
   two step functions as plain activities of a workflow that only asks, runs the calls in order and appends
   to the same window; no lab logic), and ``bare-local``, the same with its read-only calls as local
   activities, on the same worker as the lab's loop; Temporal (an in-process worker with worker.py's options,
   ``durable_agents.flowclient.worker_options.TUNED_OPTIONS``, on a dev server in memory with ``LAB_SERVER_CONFIG``;
   the run started as ``starter.py loop`` starts it, ``durable_agents.flowclient.loop.start_loop``), the run record
   (``durable_agents.runrecord.runner.Runner.start_loop``, one commit per step, in a file under ``.state/``) and DBOS
   (``durable_agents.dbosflow.loop``, launched once in this process, SQLite). Each engine's model and provider client
   are wrapped in a probe that notes the moment each step's I/O begins (a turn: the model asked; a call:
   its request sent), so a step's time is from its I/O to the next step's: the step's own work plus
   what the engine does between the two (record the result, decide, dispatch). The last turn's time runs
   to the run's result in the caller's hands; the start, from the call that starts the run to the first
   turn's I/O, is given apart. The ratios to the bare loop are medians of per-round ratios: the
   machine's load drifts from round to round more than within one.
2. **History on Temporal, with and without continue-as-new.** One long run (``--long-turns``, 102:
   253 steps) with ``history_bound`` at its ceiling (20,000 events: never continues as new) and one with
   ``--can-bound`` (150 events: continues as new every ~10 turns), interleaved with the bare loop's run
   of the same task: events per turn, the most events one run of the chain held, time per turn, and what
   one continue-as-new costs: the run's time against the run without, per continue-as-new, and, from the
   histories, the hand-over (the old run's ContinuedAsNew to the new run's first workflow task started),
   the part of it the server holds back on purpose (the new run's first workflow task backoff:
   ``history.continueAsNewMinInterval``, 1 s from the old run's start by default) and the new run's first
   workflow task on the worker against its others.
3. **From a kill to the run done, with the replacement ready.** For ``tool:issue_refund:after_effect``
   (mid tool call: the refund applied, its result not recorded) and ``turn:after_answer`` (mid turn: the
   model answered, nothing recorded), ``--kills`` trials each:

   - Temporal: two ``worker.py`` processes poll a fresh queue on the same dev server, one armed with
     ``CRASH_AT``, both ready before a run starts. The worker that takes a run's first workflow task
     keeps the run (sticky, with the activities handed to it); when that is the standby the run
     completes untouched and another is started on the same two workers, until the armed one dies at
     the point (counted, not measured). The standby has been polling all along; the killed attempt is
     noticed only when its heartbeat timeout (the rule's 3 s) runs out: that wait is most of the figure.
   - the run record and DBOS: ``python -m durable_agents.runrecord loop`` / ``python -m durable_agents.dbosflow loop``
     armed with ``CRASH_AT`` dies at the first occurrence (turn 1 mid turn, turn 2's refund mid call); as soon as it
     is seen dead (polled every 20 ms) ``python -m durable_agents.runrecord resume`` / ``python -m
     durable_agents.dbosflow resume`` starts: the standby is that process's start-up (bench_engines.py's way).

   From the moment the killed process is seen dead to the engine's own completion time
   (WorkflowExecutionCompleted; the record's completion commit; DBOS's last step row), and to the killed
   step's next attempt starting (Temporal: its ActivityTaskStarted; the record: the attempt's commit;
   DBOS: the step row's start). The step in flight at the kill is read from the killed process's last
   started line, so the remaining work is known: right after each trial the bare loop runs the same
   task in this process, and the figure is also given less its time from that step to the end.

Not a test: it reports, it does not assert. Ratios are within this invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # its bare Temporal loop, when imported as bench.bench_loop

from bare_temporal_loop import BareLoop, BareLoopActivities, BareLoopInput  # noqa: E402
from dbos import DBOS  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from durable_agents.activities.loop import LoopActivities  # noqa: E402
from durable_agents.dbosflow import engine as dbos_engine  # noqa: E402
from durable_agents.dbosflow import loop as dbos_loop  # noqa: E402
from durable_agents.flowclient.connect import connect  # noqa: E402
from durable_agents.flowclient.loop import read_chain, start_loop  # noqa: E402
from durable_agents.flowclient.worker_options import TUNED_OPTIONS  # noqa: E402
from durable_agents.memory import DerivedWindow, MemoryPolicy  # noqa: E402
from durable_agents.providerclient import seed_orders  # noqa: E402
from durable_agents.runrecord.runner import Runner  # noqa: E402
from durable_agents.runrecord.store import RunRecord  # noqa: E402
from durable_agents.steps.flow import StepDeps  # noqa: E402
from durable_agents.steps.loop import (  # noqa: E402
    DEFAULT_WINDOW_MESSAGES,
    DEFAULT_WINDOW_TOKENS,
    LoopInputs,
    LoopPlan,
    ModelAnswer,
    TurnRequest,
    TurnResult,
    model_turn,
    parse_step,
    result_message,
    run_tool,
    system_message,
    task_message,
    tool_request,
    turn_message,
)
from durable_agents.steps.retry import rule_from_env  # noqa: E402
from durable_agents.steps.startedline import started_steps  # noqa: E402
from durable_agents.wiring import deps_from_env  # noqa: E402
from durable_agents.workflows.agent_loop import AgentLoop  # noqa: E402
from durable_agents.workflows.loop_state import MAX_HISTORY_BOUND  # noqa: E402
from lab import registry  # noqa: E402
from lab.engines import DbosDriver, RunRecordDriver, TemporalDriver  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

EMAIL = "ada@example.com"
# The bare loop, a lane of this bench's own (bare_loop: no engine, nothing recorded), then each engine's lane,
# named by its registration (lab.registry).
BARE = "bare"
BARE_TEMPORAL = "bare-tmp"  # the engine's floor: bench/bare_temporal_loop.py, the same steps, no lab logic
BARE_LOCAL = "bare-local"  # the same, its read-only calls as local activities: what that cut would save
TEMPORAL = registry.registration_of(TemporalDriver).name
RECORD = registry.registration_of(RunRecordDriver).name
DBOS_ENGINE = registry.registration_of(DbosDriver).name
DURABLE = (TEMPORAL, RECORD, DBOS_ENGINE)
ENGINES = (BARE, BARE_TEMPORAL, BARE_LOCAL, *DURABLE)
WITH_DEPS = (BARE, BARE_TEMPORAL, TEMPORAL, RECORD)
"""The lanes given dependencies of their own by ``InProcess`` (DBOS builds its own on launch)."""
POINTS = ("tool:issue_refund:after_effect", "turn:after_answer")
# The scripted model in the loop's own process, never slowed down, whatever this process's environment says.
STEP_ENV = {"LLM_BASE_URL": "", "LLM_OFFLINE_VARY": "0", "LAB_STEP_SECONDS": "0"}
_ORDER_NUMBERS = itertools.count(1_000_000)


def new_task(turns: int) -> tuple[str, dict[str, int]]:
    """A task of (turns - 2) / 2 orders never seen before, each with all of its total left to refund."""
    orders = {f"B-{next(_ORDER_NUMBERS)}": 1000 + 10 * i for i in range((turns - 2) // 2)}
    return "Please refund every one of these broken orders: " + ", ".join(orders) + ".", orders


def steps_of(turns: int) -> list[str]:
    """The steps the scripted model's run of ``turns`` turns takes, in order (every order refunded)."""
    k = (turns - 2) // 2
    out = []
    for n in range(1, turns + 1):
        out.append(f"turn-{n}")
        calls = 0 if n == turns else 2 if n % 2 == 0 and n <= 2 * k else 1
        out += [f"turn-{n}/call-{i}" for i in range(calls)]
    return out


# ------------------------------------------------------------------ the probe


class Probe:
    """When each step's I/O began, per run: the model asked (a turn), a request sent (a call)."""

    def __init__(self) -> None:
        self.marks: dict[str, list[tuple[str, float]]] = {}

    def mark(self, run_id: str, kind: str) -> None:
        self.marks.setdefault(run_id, []).append((kind, time.perf_counter()))


class ProbedModel:
    """The scripted model, noting when each turn is asked (``durable_agents.steps.ports.ToolModel``)."""

    def __init__(self, model: Any, probe: Probe) -> None:
        self.model, self.probe, self.name = model, probe, model.name

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> ModelAnswer:
        self.probe.mark((labels or {}).get("run", "-"), "turn")
        answer: ModelAnswer = await self.model.turn(messages, tools, labels=labels)
        return answer

    async def aclose(self) -> None:
        await self.model.aclose()


class ProbedProvider:
    """The provider client, noting when each tool's request is sent; everything else passes through."""

    def __init__(self, client: Any, probe: Probe) -> None:
        self._client, self._probe = client, probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def lookup_order(self, order_id: str, *, run_id: str | None = None) -> Any:
        self._probe.mark(run_id or "-", "call")
        return await self._client.lookup_order(order_id, run_id=run_id)

    async def issue_refund(self, **kwargs: Any) -> Any:
        self._probe.mark(kwargs["run_id"], "call")
        return await self._client.issue_refund(**kwargs)

    async def send_email(self, **kwargs: Any) -> Any:
        self._probe.mark(kwargs["run_id"], "call")
        return await self._client.send_email(**kwargs)

    async def create_ticket(self, **kwargs: Any) -> Any:
        self._probe.mark(kwargs["run_id"], "call")
        return await self._client.create_ticket(**kwargs)


def probed_deps(env: Mapping[str, str], probe: Probe) -> StepDeps:
    deps = deps_from_env(env)
    deps.provider = ProbedProvider(deps.provider, probe)
    deps.agent = ProbedModel(deps.agent, probe)
    return deps


@dataclass
class Timed:
    """One run: its steps' marks (relative to the call that started it) and its end."""

    engine: str
    marks: list[tuple[str, float]]
    end: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return sum(1 for kind, _ in self.marks if kind == "turn")

    @property
    def calls(self) -> int:
        return sum(1 for kind, _ in self.marks if kind == "call")

    def cycles(self) -> list[tuple[str, float]]:
        """Each step's time: from its I/O to the next step's (the last step's: to the run's end)."""
        times = [t for _, t in self.marks] + [self.end]
        return [(kind, times[i + 1] - t) for i, (kind, t) in enumerate(self.marks)]

    def per(self, kind: str) -> float:
        found = [c for k, c in self.cycles() if k == kind]
        return sum(found) / len(found)

    @property
    def start(self) -> float:
        return self.marks[0][1]

    def from_step(self, index: int) -> float:
        """Seconds from step ``index``'s I/O (0: the first turn) to the run's end."""
        return self.end - self.marks[index][1]


# ------------------------------------------------------------------ the engines, in this process


class InProcess:
    """The bare loop, Temporal (in-process worker), the run record and DBOS, each with probed steps."""

    def __init__(self, work: Path, provider_url: str, server: DevServer) -> None:
        self.work, self.server = work, server
        self.env = {"PROVIDER_URL": provider_url, "MEMORY_DB": str(work / "memory.db"), **STEP_ENV}
        self.provider_url = provider_url
        self.probe = Probe()
        self.deps = {e: probed_deps(self.env, self.probe) for e in WITH_DEPS}
        self.rule = rule_from_env({})

    async def __aenter__(self) -> InProcess:
        self.client = await connect({"TEMPORAL_ADDRESS": self.server.address, "TEMPORAL_NAMESPACE": "default"})
        self.queue = f"bench-loop-{uuid.uuid4().hex[:6]}"
        self.worker: Worker | None = Worker(
            self.client, task_queue=self.queue, workflows=[AgentLoop, BareLoop],
            activities=[*LoopActivities(self.deps[TEMPORAL]).all(),
                        *BareLoopActivities(self.deps[BARE_TEMPORAL]).all()],
            **TUNED_OPTIONS)
        await self.worker.__aenter__()
        db = self.work / "dbos-loop.db"
        dbos_deps = probed_deps(self.env, self.probe)
        dbos_engine.set_environment(lambda: dbos_deps, db, say=lambda line: None)
        dbos_engine.configure(db, version=dbos_loop.loop_app_version({}))
        await asyncio.to_thread(DBOS.launch)
        return self

    async def close_engines(self) -> None:
        """Stop the worker and DBOS (the bare loop runs on): part 3's engines are processes of their own."""
        if self.worker is not None:
            await self.worker.__aexit__(None, None, None)
            await dbos_engine.close_deps()
            await asyncio.to_thread(DBOS.destroy)
            self.worker = None
            # DBOS made its executor the loop's default and shut it down on destroy: threads need a live one.
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=8))

    async def __aexit__(self, *exc: object) -> None:
        await self.close_engines()
        for deps in self.deps.values():
            await deps.provider.aclose()

    async def run(self, engine: str, turns: int, *, history_bound: int = 1000) -> Timed:
        task, orders = new_task(turns)
        await asyncio.to_thread(seed_orders, self.provider_url, orders)
        run_id = f"loop-{engine}-{uuid.uuid4().hex[:10]}"
        max_turns = turns + 2
        began = time.perf_counter()
        if engine == BARE:
            answer = await bare_loop(self.deps[BARE], LoopInputs(run_id, task, EMAIL, max_turns=max_turns))
        elif engine in (BARE_TEMPORAL, BARE_LOCAL):
            answer = await self.client.execute_workflow(
                BareLoop.run, BareLoopInput(run_id, task, EMAIL, max_turns, local_reads=engine == BARE_LOCAL),
                id=run_id, task_queue=self.queue)
        elif engine == TEMPORAL:
            await start_loop(self.client, run_id, task, EMAIL, task_queue=self.queue, max_turns=max_turns,
                             history_bound=history_bound, rule=self.rule)
            result = await self.client.get_workflow_handle(run_id).result()
            answer = result["answer"] if isinstance(result, dict) else result.answer
        elif engine == RECORD:
            runner = Runner(self.work / "record-loop.db", self.deps[RECORD], say=lambda line: None, rule=self.rule)
            try:
                row = await runner.start_loop(run_id, task, EMAIL, max_turns=max_turns)
            finally:
                runner.close()
            if row.status != "completed":
                raise RuntimeError(f"record run {run_id} ended {row.status}: {row.error}")
            answer = LoopPlan.final_answer(row.results())
        elif engine == DBOS_ENGINE:
            handle = await dbos_loop.start_loop_run(run_id, dbos_loop.new_loop_inputs(
                run_id, task, EMAIL, uuid.uuid4().hex[:16], self.rule, max_turns=max_turns,
                window_tokens=DEFAULT_WINDOW_TOKENS, window_messages=DEFAULT_WINDOW_MESSAGES))
            answer = (await handle.get_result())["answer"]
        else:
            raise ValueError(f"no in-process loop lane {engine!r}: choose from {', '.join(ENGINES)}")
        end = time.perf_counter()
        if not answer or not answer.startswith("Done:"):
            raise RuntimeError(f"{engine} run {run_id} did not end with the script's answer: {answer!r}")
        marks = [(kind, t - began) for kind, t in self.probe.marks.pop(run_id)]
        timed = Timed(engine, marks, end - began)
        if timed.turns != turns:
            raise RuntimeError(f"{engine} run {run_id} took {timed.turns} turns, not {turns}")
        if engine == TEMPORAL:
            chain = await read_chain(self.client, run_id)
            timed.extra["events"] = [r.history_length for r in chain.runs]
            timed.extra["handovers"] = await self.handovers(run_id, [r.temporal_run_id for r in chain.runs])
        return timed

    async def handovers(self, run_id: str, runs: list[str]) -> list[tuple[float, float, float, float]]:
        """Per continue-as-new: (seconds from the old run's ContinuedAsNew event to the new run's first
        workflow task started; the first workflow task backoff the server gave the new run; that task's time
        on the worker, started to completed; the median of the new run's other workflow tasks). The server
        holds a new run's first task back until its predecessor has lived ``history.continueAsNewMinInterval``
        (1 s by default): a chain of short runs is throttled to about one run a second."""
        out = []
        closed_at = None
        for temporal_run_id in runs:
            events = (await self.client.get_workflow_handle(run_id, run_id=temporal_run_id).fetch_history()).events
            started = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]
            completed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
            tasks = [_seconds(c.event_time) - _seconds(s.event_time) for s, c in zip(started, completed, strict=False)]
            if closed_at is not None:
                backoff = events[0].workflow_execution_started_event_attributes.first_workflow_task_backoff
                out.append((_seconds(started[0].event_time) - closed_at, backoff.seconds + backoff.nanos / 1e9,
                            tasks[0], _med(tasks[1:])))
            closed_at = _seconds(events[-1].event_time)
        return out


def _seconds(stamp: Any) -> float:
    """A protobuf Timestamp as seconds since the epoch."""
    return float(stamp.seconds + stamp.nanos / 1e9)


async def bare_loop(deps: StepDeps, inputs: LoopInputs) -> str | None:
    """The loop with no engine: ``LoopPlan`` decides the steps, the two step functions run them, a dict keeps
    the results, nothing is recorded. The prompt is memory's window appended to as results come (as
    Temporal's workflow and DBOS's walk build it; ``LoopPlan.request`` would derive it again from every
    message each turn, as the run record does, and that shows as the record's overhead)."""
    window = DerivedWindow(MemoryPolicy(max_tokens=inputs.window_tokens, max_messages=inputs.window_messages))
    system_id, system = system_message()
    window.add(system_id, system, pin=True)
    window.add(*task_message(inputs))
    results: dict[str, Any] = {}
    ahead = [LoopPlan.first()]
    turn: TurnResult | None = None
    while ahead:
        name = ahead.pop(0)
        number, index = parse_step(name)
        if index is None:
            turn = await model_turn(TurnRequest(inputs.run_id, number, window.prompt(), inputs.max_turns,
                                                inputs.window_tokens), deps)
            results[name] = turn
            window.add(*turn_message(turn))
        else:
            assert turn is not None
            result = await run_tool(tool_request(inputs, number, index, turn.calls[index]), deps)
            results[name] = result
            window.add(*result_message(turn, result))
        ahead.extend(LoopPlan.after(name, results[name]))
    return LoopPlan.final_answer(results)


# ------------------------------------------------------------------ kills, with the replacement ready


@dataclass
class Kill:
    engine: str
    point: str
    step: str  # the step in flight when the process died
    total: float  # seconds from the death seen to the run done (engine's clock)
    to_step: float  # ... to the killed step's next attempt starting
    detail: dict[str, float] = field(default_factory=dict)
    bare_rest: float = 0.0  # the bare loop's time from that step to the end, measured right after the trial


async def _dead(proc: Proc, timeout: float, what: str) -> float:
    """Until ``proc`` has exited (polled every 20 ms): the wall-clock time it was seen dead."""
    deadline = time.monotonic() + timeout
    while proc.alive():
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} still running after {timeout:.0f} s:\n{proc.last_lines()}")
        await asyncio.sleep(0.02)
    return time.time()


def _in_flight(proc: Proc, point: str) -> str:
    if f"CRASH_AT={point}" not in proc.output():
        raise RuntimeError(f"{proc.name} did not die at {point}:\n{proc.last_lines()}")
    steps = started_steps(proc.output())
    if not steps:
        raise RuntimeError(f"{proc.name} died before any step:\n{proc.output()}")
    return steps[-1]


async def cli_kill(engine: str, point: str, turns: int, work: Path, provider_url: str) -> Kill:
    """``python -m durable_agents.runrecord|dbosflow loop`` killed at ``point``; ``resume`` started as soon as it is
    dead."""
    module = registry.engine(engine).cli
    db = work / f"{module}-kills.db"
    env = {"RUNRECORD_DB" if engine == RECORD else "DBOSFLOW_DB": str(db), "PROVIDER_URL": provider_url,
           "MEMORY_DB": str(work / f"{module}-kills-memory.db"), "PYTHONUNBUFFERED": "1", **STEP_ENV}
    task, orders = new_task(turns)
    await asyncio.to_thread(seed_orders, provider_url, orders)
    run_id = f"kill-{engine}-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", module]
    first = Proc(f"{module}-loop", [*argv, "loop", run_id, task, "--email", EMAIL, "--max-turns", str(turns + 2)],
                 env={**env, "CRASH_AT": point})
    try:
        died = await _dead(first, 60, f"{module} loop armed with {point}")
    finally:
        first.kill()
    if first.popen.returncode != -9:
        raise RuntimeError(f"{module} loop did not die at {point} (exit {first.popen.returncode}):\n{first.output()}")
    step = _in_flight(first, point)
    second = Proc(f"{module}-resume", [*argv, "resume", run_id], env={**env, "CRASH_AT": ""})
    try:
        await _dead(second, 120, f"{module} resume")
    finally:
        second.kill()
    if second.popen.returncode != 0:
        raise RuntimeError(f"{module} resume exited {second.popen.returncode}:\n{second.output()}")
    if engine == RECORD:
        with RunRecord(db) as record:
            run = record.load(run_id)
        if run.status != "completed":
            raise RuntimeError(f"record run {run_id} is {run.status}")
        row = next(s for s in run.steps if s.name == step)
        assert row.attempt_started_at is not None
        return Kill(engine, point, step, run.updated_at - died, row.attempt_started_at - died)
    con = sqlite3.connect(db)
    try:
        done_ms = con.execute("SELECT max(completed_at_epoch_ms) FROM operation_outputs WHERE workflow_uuid = ?",
                              (run_id,)).fetchone()[0]
        started_ms = con.execute("SELECT started_at_epoch_ms FROM operation_outputs WHERE workflow_uuid = ? AND "
                                 "function_name = ?", (run_id, step)).fetchone()[0]
        status = con.execute("SELECT status FROM workflow_status WHERE workflow_uuid = ?", (run_id,)).fetchone()[0]
    finally:
        con.close()
    if status != "SUCCESS":
        raise RuntimeError(f"DBOS run {run_id} is {status}")
    return Kill(engine, point, step, done_ms / 1000 - died, started_ms / 1000 - died)


async def temporal_kill(client: Any, server: DevServer, point: str, turns: int, work: Path,
                        provider_url: str) -> Kill:
    """Two worker.py processes on a fresh queue, one armed with ``point``; runs started once both poll.

    The worker that takes a run's first workflow task keeps the run (its cache makes the run's workflow
    tasks sticky to it, and the dev server hands it the activities the run schedules): when that is the
    standby, the run completes with the armed worker alive, and another run is started on the same two
    workers, until the armed one dies at the point; the standby, polling all along, finishes that run."""
    queue = f"kill-{uuid.uuid4().hex[:8]}"
    env = {"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default", "TASK_QUEUE": queue,
           "PROVIDER_URL": provider_url, "MEMORY_DB": str(work / f"{queue}-memory.db"), "PYTHONUNBUFFERED": "1",
           **STEP_ENV}
    argv = [sys.executable, "worker.py"]
    armed = Proc("worker-armed", argv, env={**env, "CRASH_AT": point})
    standby = Proc("worker-standby", argv, env={**env, "CRASH_AT": ""})
    try:
        await asyncio.gather(asyncio.to_thread(armed.wait_for_line, "worker ready", 60),
                             asyncio.to_thread(standby.wait_for_line, "worker ready", 60))
        runs_before = 0
        for _ in range(10):
            task, orders = new_task(turns)
            await asyncio.to_thread(seed_orders, provider_url, orders)
            run_id = f"kill-temporal-{uuid.uuid4().hex[:8]}"
            await start_loop(client, run_id, task, EMAIL, task_queue=queue, max_turns=turns + 2,
                             rule=rule_from_env({}))
            handle = client.get_workflow_handle(run_id)
            waiter = asyncio.ensure_future(handle.result())
            try:
                deadline = time.monotonic() + 60
                while armed.alive() and not waiter.done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                died = time.time()
                if armed.alive():
                    if not waiter.done():
                        raise RuntimeError(f"run {run_id}: neither done nor the armed worker dead in 60 s")
                    runs_before += 1
                    continue  # the standby had this run: another
                step = _in_flight(armed, point)
                await asyncio.wait_for(asyncio.shield(waiter), 120)
            finally:
                waiter.cancel()
            break
        else:
            raise RuntimeError(f"the armed worker never reached {point} in 10 runs")
        history = await handle.fetch_history()
    finally:
        armed.kill()
        standby.kill()
    scheduled: dict[int, str] = {}
    at: dict[tuple[str, str], float] = {}
    done = 0.0
    for ev in history.events:
        t = _seconds(ev.event_time)
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_id
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            at[(scheduled[ev.activity_task_started_event_attributes.scheduled_event_id], "started")] = t
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            at[(scheduled[ev.activity_task_timed_out_event_attributes.scheduled_event_id], "timed_out")] = t
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            done = t
    if not done:
        raise RuntimeError(f"run {run_id}: no WorkflowExecutionCompleted in its latest history")
    killed, again = f"{step}/1", f"{step}/2"
    noticed = at.get((killed, "timed_out"))
    if noticed is None or (again, "started") not in at:
        raise RuntimeError(f"run {run_id}: the killed attempt {killed} was not timed out and retried: {sorted(at)}")
    return Kill(TEMPORAL, point, step, done - died, at[(again, "started")] - died,
                {"noticed": noticed - died, "attempt_started": at[(killed, "started")] - died,
                 "runs_before": runs_before})


# ------------------------------------------------------------------ all of it


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": {e: [] for e in ENGINES}, "long": {}, "kills": []}
    base = Path(__file__).resolve().parent.parent / ".state"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-loop-") as tmp:
        work = Path(tmp)
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider = start_provider(work / "provider.db")
        try:
            async with InProcess(work, provider.url, server) as eng:
                for engine in ENGINES:  # warm-up: imports, connections, the first workflow
                    await eng.run(engine, args.turns)
                for r in range(args.runs):
                    for engine in ENGINES:
                        out["runs"][engine].append(await eng.run(engine, args.turns))
                    print(f"  round {r + 1}: " + ", ".join(
                        f"{e} {out['runs'][e][-1].end * 1000:.0f} ms" for e in ENGINES), flush=True)
                long_cases = {"bare": (BARE, 1000), "no CAN": (TEMPORAL, MAX_HISTORY_BOUND),
                              "CAN": (TEMPORAL, args.can_bound)}
                for r in range(args.long_runs):
                    for label, (engine, bound) in long_cases.items():
                        timed = await eng.run(engine, args.long_turns, history_bound=bound)
                        out["long"].setdefault(label, []).append(timed)
                        print(f"  long run {r + 1} {label:<7} {timed.end:6.2f} s, "
                              f"{timed.extra.get('events', '-')} events", flush=True)
                # Part 3 in processes of their own: the in-process worker and DBOS are stopped first; the bare
                # loop runs on, once after each trial, for the time the rest of the run takes it just then.
                await eng.close_engines()
                client = await connect({"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default"})
                out["redone"] = 0
                order = steps_of(args.turns)
                for trial in range(args.kills):
                    for point in POINTS:
                        for engine in DURABLE:
                            if engine == TEMPORAL:
                                kill = await temporal_kill(client, server, point, args.turns, work, provider.url)
                                out["redone"] += kill.detail.pop("runs_before")
                            else:
                                kill = await cli_kill(engine, point, args.turns, work, provider.url)
                            bare = await eng.run(BARE, args.turns)
                            kill.bare_rest = bare.from_step(order.index(kill.step))
                            out["kills"].append(kill)
                            print(f"  kill {trial + 1} {point:<31} {engine:<8} at {kill.step:<14} "
                                  f"{kill.total:5.2f} s to done, {kill.to_step:4.2f} s to the step again; "
                                  f"the bare loop's rest {kill.bare_rest:4.2f} s", flush=True)
        finally:
            provider.stop()
            server.stop()
    return out


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    from importlib.metadata import version

    import temporalio

    runs: dict[str, list[Timed]] = out["runs"]
    k = (args.turns - 2) // 2
    n_turns, n_calls = args.turns, 3 * k + 1
    print(f"\nmachine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}, "
          f"load average {os.getloadavg()[0]:.2f}; temporalio {temporalio.__version__}, dbos {version('dbos')}")
    print("model: the scripted model in the loop's own process (no model server, no delay), on every engine")

    def value(t: Timed, what: str) -> float:
        return t.end if what == "end" else t.start if what == "start" else t.per(what)

    def med(engine: str, what: str) -> float:
        return _med([value(t, what) for t in runs[engine]])

    def ratio(engine: str, what: str) -> float:
        """The median over rounds of the engine's figure over the bare loop's in the same round: the
        machine's load drifts from round to round, less so within one."""
        return _med([value(t, what) / value(b, what) for t, b in zip(runs[engine], runs[BARE], strict=True)])

    print(f"\n1. a task of k={k} orders: {n_turns} turns, {n_calls} tool calls; {args.runs} runs per engine, "
          "interleaved; ms: medians of per-run means; x bare: medians of the per-round ratios")
    print(f"  {'engine':<9} {'per turn':>8} {'overhead':>9} {'x bare':>7} {'per call':>9} {'overhead':>9} "
          f"{'x bare':>7} {'start':>6} {'end to end':>10} {'x bare':>7} {'per step':>8}")
    bare = {w: med(BARE, w) for w in ("turn", "call", "start", "end")}
    steps = n_turns + n_calls
    for engine in ENGINES:
        m = {w: med(engine, w) for w in ("turn", "call", "start", "end")}
        print(f"  {engine:<9} {m['turn'] * 1e3:>8.2f} {(m['turn'] - bare['turn']) * 1e3:>+9.2f} "
              f"{ratio(engine, 'turn'):>6.1f}x {m['call'] * 1e3:>9.2f} {(m['call'] - bare['call']) * 1e3:>+9.2f} "
              f"{ratio(engine, 'call'):>6.1f}x {m['start'] * 1e3:>6.1f} {m['end'] * 1e3:>10.1f} "
              f"{ratio(engine, 'end'):>6.2f}x {m['end'] / steps * 1e3:>8.2f}")
    print("  (a turn: the model asked to the first call's request sent; a call: its request sent to the next "
          "step's I/O; overhead: less the bare loop's; start: the call that starts the run to turn 1's I/O)")

    def over_floor(what: str, engine: str = TEMPORAL) -> float:
        """``engine`` over the engine's floor (``bare-tmp``), the median of per-round ratios."""
        return _med([value(t, what) / value(b, what)
                     for t, b in zip(runs[engine], runs[BARE_TEMPORAL], strict=True)])

    print(f"  the lab's loop on Temporal over the engine's floor ({BARE_TEMPORAL}: the same steps, no lab logic): "
          f"per turn {over_floor('turn'):.2f}x, per call {over_floor('call'):.2f}x, end to end "
          f"{over_floor('end'):.2f}x (medians of the per-round ratios)")
    print(f"  {BARE_LOCAL} (the floor, its read-only calls as local activities) over {BARE_TEMPORAL}: end to end "
          f"{over_floor('end', BARE_LOCAL):.2f}x, per turn {over_floor('turn', BARE_LOCAL):.2f}x")

    long: dict[str, list[Timed]] = out["long"]
    lk = (args.long_turns - 2) // 2
    print(f"\n2. Temporal's history: a task of {lk} orders, {args.long_turns} turns, {3 * lk + 1} calls; "
          f"{args.long_runs} runs per case, interleaved; history_bound {MAX_HISTORY_BOUND} (no CAN) against "
          f"{args.can_bound} (CAN)")
    print(f"  {'case':<8} {'runs':>5} {'events':>11} {'per turn':>9} {'most in one run':>15} {'ms/turn':>11} "
          f"{'x bare':>7} {'x no CAN':>8} {'end to end':>10}")
    def long_ratio(label: str, against: str) -> float:
        return _med([t.end / b.end for t, b in zip(long[label], long[against], strict=True)])

    for label, timed in long.items():
        temporal = label != "bare"
        events = [sum(t.extra["events"]) for t in timed] if temporal else [0]
        chains = [len(t.extra["events"]) for t in timed] if temporal else [0]
        most = [max(t.extra["events"]) for t in timed] if temporal else [0]
        cells = ((_fmt_range(chains), _fmt_range(events), f"{_med(events) / args.long_turns:.1f}", _fmt_range(most),
                  f"{long_ratio(label, 'no CAN'):.2f}x") if temporal else ("-", "-", "-", "-", "-"))
        per_turn = [t.end / t.turns * 1e3 for t in timed]
        print(f"  {label:<8} {cells[0]:>5} {cells[1]:>11} {cells[2]:>9} {cells[3]:>15} "
              f"{f'{min(per_turn):.1f}-{max(per_turn):.1f}':>11} {long_ratio(label, 'bare'):>6.1f}x {cells[4]:>8} "
              f"{_med([t.end for t in timed]):>9.2f}s")
    cans = [h for t in long["CAN"] for h in t.extra["handovers"]]
    if cans:
        per_can = _med([(t.end - n.end) / len(t.extra["handovers"])
                        for t, n in zip(long["CAN"], long["no CAN"], strict=True)])
        per_run = _med([len(t.extra["handovers"]) for t in long["CAN"]])
        hand, backoff = _med([c[0] for c in cans]), _med([c[1] for c in cans])
        print(f"  continue-as-new: {per_run:.0f} per run; the run took {per_can * 1e3:+.0f} ms per CAN against no CAN "
              f"(median over rounds). From a run's ContinuedAsNew to the next run's first workflow task started: "
              f"median {hand * 1e3:.0f} ms, of which the server's first-task backoff {backoff * 1e3:.0f} ms "
              f"(history.continueAsNewMinInterval: a run is held until its predecessor lived 1 s); less the backoff "
              f"{_med([c[0] - c[1] for c in cans]) * 1e3:.0f} ms. The new run's first workflow task on the worker "
              f"{_med([c[2] for c in cans]) * 1e3:.1f} ms, its others {_med([c[3] for c in cans]) * 1e3:.1f} ms")
    for label in ("no CAN", "CAN"):
        quarter = args.long_turns // 4
        early = _med([_turn_cycle(t, 1, quarter) for t in long[label]])
        late = _med([_turn_cycle(t, args.long_turns - quarter, args.long_turns - 1) for t in long[label]])
        print(f"  {label}: a round (a turn and its calls) in turns 1-{quarter} {early * 1e3:.1f} ms, in turns "
              f"{args.long_turns - quarter}-{args.long_turns - 1} {late * 1e3:.1f} ms ({late / early:.2f}x)")

    kills: list[Kill] = out["kills"]
    order = steps_of(args.turns)
    if not kills:
        return
    print(f"\n3. from the kill (the dead process seen gone) to the run done, the replacement ready: a task of "
          f"{n_turns} turns; {args.kills} trials per cell; medians, s. again: to the killed step's next attempt "
          "starting; rest: from there to done; bare rest: the bare loop's time from that step to the end, run "
          "right after each trial")
    print(f"  {'point':<31} {'engine':<9} {'in flight':<10} {'raw':>5} {'worst':>5} {'again':>5} {'rest':>5} "
          f"{'bare rest':>9} {'raw - bare rest':>15} {'x record':>8}")
    for point in POINTS:
        record = _med([x.total for x in kills if x.point == point and x.engine == RECORD])
        for engine in DURABLE:
            cell = [x for x in kills if x.point == point and x.engine == engine]
            where = ",".join(w.replace("turn-", "t").replace("/call-", "c")
                             for w in sorted({x.step for x in cell}, key=order.index))
            raw = _med([x.total for x in cell])
            print(f"  {point:<31} {engine:<9} {where:<10} {raw:>5.2f} {max(x.total for x in cell):>5.2f} "
                  f"{_med([x.to_step for x in cell]):>5.2f} {_med([x.total - x.to_step for x in cell]):>5.2f} "
                  f"{_med([x.bare_rest for x in cell]):>9.2f} {_med([x.total - x.bare_rest for x in cell]):>15.2f} "
                  f"{raw / record:>7.1f}x")
    on_temporal = [x for x in kills if x.engine == TEMPORAL]
    if on_temporal:
        heartbeat = rule_from_env({}).heartbeat_timeout_seconds()
        before = _med([-x.detail["attempt_started"] for x in on_temporal])
        noticed = _med([x.detail["noticed"] for x in on_temporal])
        handed = _med([x.to_step - x.detail["noticed"] for x in on_temporal])
        share = _med([x.detail["noticed"] / x.total for x in on_temporal])
        print(f"  Temporal: the killed attempt had started {before * 1e3:.0f} ms before the death was seen, and "
              f"timed out (heartbeat timeout {heartbeat:g} s) {noticed:.2f} s after it; the standby started the "
              f"step's next attempt {handed * 1e3:.0f} ms after that. Waiting for the timeout is {share * 100:.0f}% "
              f"of the raw figure. {out.get('redone', 0)} run(s) before those went to the standby whole (the armed "
              "worker never "
              "reached the point) and were not counted")


def _turn_cycle(t: Timed, first: int, last: int) -> float:
    """Mean seconds of a round (a turn and its calls), turns ``first`` to ``last``."""
    turn_at = [tt for kind, tt in t.marks if kind == "turn"] + [t.end]
    spans = [turn_at[n] - turn_at[n - 1] for n in range(first, last + 1)]
    return sum(spans) / len(spans)


def _fmt_range(values: list[float] | list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=22, help="turns of a run in parts 1 and 3 (even, >= 4)")
    parser.add_argument("--runs", type=int, default=8, help="runs per engine in part 1")
    parser.add_argument("--kills", type=int, default=3, help="trials per crash point and engine in part 3")
    parser.add_argument("--long-turns", type=int, default=102, help="turns of the long run in part 2 (even)")
    parser.add_argument("--long-runs", type=int, default=2, help="long runs per case in part 2")
    parser.add_argument("--can-bound", type=int, default=150, help="history_bound of the continue-as-new case")
    args = parser.parse_args()
    for name in ("turns", "long_turns"):
        value = getattr(args, name)
        if value < 4 or value % 2:
            parser.error(f"--{name.replace('_', '-')} must be even and at least 4 (2k + 2 turns for k orders)")
    out = asyncio.run(main_async(args))
    report(out, args)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())  # as bench_engines.py: DBOS's and the SDK's threads never hold the exit up
