"""The kill matrix, the tool a user runs on their own agent (docs/your-agent.md, "Kill-test your agent"), pointed
at each lane's variant and at the lab's own loop on Temporal: its point matrix at the faults' crash points
(``POINTS``: ``KillMatrix.run``, ``LaneEngine.run_at``) and its random mode (``KillMatrix.run_random``), so the
duplicates this part reports come from that tool.

The point matrix: per subject, an unkilled run, then a run per point, its worker armed with the point and
SIGKILLed there, a replacement worker finishing it; each judged as below. Random mode:

per subject, one ``KillMatrix`` and its ``run_random(runs=, kills=, seed=)``: an unkilled run of the task, then
``runs`` runs while ``kills`` SIGKILLs land on a worker with a run open, at moments drawn (seeded) over the time
a run of the task takes (each kill's wait drawn once the last kill's replacement worker is up); each run judged
against the unkilled one, each by the same rules:

- the task is ``peers.faults.new_task()``'s: one order, its total left to refund, seeded at the provider for the
  run (the matrix's task function, called once per run before it starts): 4 turns, 1 refund, 1 email,
  1 ticket;
- effects, by the probe: the provider's applied effects of the run per kind (``peers.subjects.effects_of``),
  each equal to the unkilled run's (more: applied again; fewer: lost). The lab's loop is also asked by key
  (its settle); a lane cannot be (a ``ForeignEngine`` has no settle), so the probe is the judge of both;
- turns, at one model stand-in that words each answer differently and gives each call a random id
  (``--vary``, as random mode's own stand-in does), counted per run; a turn a kill found recorded is never
  asked after it (for a lane, recorded = its model activity completed in the run's history:
  ``MODEL_ACTIVITIES``), and none is asked more than once per kill of its run more than once.

How each subject's runs are run under the kills differs in one way, the engine's: the lab's loop is the
matrix's own ``temporal`` engine (every run on one task queue served by one worker: a kill catches every run
open on it, and a new worker replaces it); a lane is ``LaneEngine`` (a ``ForeignEngine``): each run on a task
queue of its own with a worker of its own (``LAB_PEER_RUN``: a lane's worker counts its model requests under one
run), a kill lands on one run's worker, and a replacement worker is started on that run's queue. A run past
its deadline is terminated and its row says so.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.testing import ForeignEngine, KillMatrix, Report
from lab.processes import REPO, Proc
from peers.faults import RUN_TIMEOUT, new_task
from peers.lane import CRASH_POINTS
from peers.subjects import EMAIL, LAB_POINTS, Context, LaneSubject, effects_of

T = TypeVar("T")

LAB_AGENT = "durable_agents.steps.refund_agent:REFUND_AGENT"
MODEL_ACTIVITIES = ("__model_request", "invoke_model_activity")
"""How a lane's model request is named in its run's history: pydantic-ai's ``<agent>__model_request``, the
Agents SDK's ``invoke_model_activity``. A turn is recorded once its model activity has completed."""

_WORDS = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "canceled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
}


def task_for(provider_url: str) -> Callable[[str], str]:
    """The matrix's task function: a task naming an order of the run's own, seeded at the provider first."""

    def task(run_id: str) -> str:
        text, orders = new_task()
        seed_orders(provider_url, orders)
        return text

    task.__name__ = "new_task"
    return task


def probe_for(provider_url: str) -> Callable[[str], dict[str, int]]:
    """The matrix's probe: the provider's applied effects of the run, per kind (refunds past the order's total
    are refused, not applied: ``refused_refunds`` counts those)."""

    def probe(run_id: str) -> dict[str, int]:
        return {kind: found["applied"] for kind, found in effects_of(fetch_effects(provider_url, run_id)).items()}

    return probe


def refused_refunds(provider_url: str, run_id: str) -> int:
    return effects_of(fetch_effects(provider_url, run_id))["refund"]["refused"]


@dataclass
class _Run:
    run_id: str
    task: str
    subject: LaneSubject
    worker: Proc | None = None  # the one serving the run's queue now (None while a replacement starts)
    began: float | None = None  # when its start call returned
    ended: float | None = None
    outcome: str = ""
    job: asyncio.Future[None] | None = None
    replacing: asyncio.Future[None] | None = None
    workers: list[Proc] = field(default_factory=list)


class LaneEngine(ForeignEngine):
    """One lane's variant (``peers.lane.Lane``) as a ``ForeignEngine`` of the kill matrix: the module docstring
    says how its runs go. ``loop``: the event loop ``ctx.client`` lives on (the matrix calls this engine from a
    thread of its own; its Temporal calls are run on that loop); ``llm_url``: the stand-in the workers ask."""

    def __init__(self, ctx: Context, lane: ModuleType, variant: str, *, loop: asyncio.AbstractEventLoop,
                 llm_url: str, timeout: float = RUN_TIMEOUT) -> None:
        if variant not in lane.VARIANTS:
            raise ValueError(f"{lane.NAME} has the variants {', '.join(lane.VARIANTS)}, not {variant!r}")
        self.ctx, self.lane, self.variant, self.loop = ctx, lane, variant, loop
        self.llm_url, self.timeout = llm_url, timeout
        self.name = f"{lane.NAME.split()[0]}, {variant}"
        self.label = f"{lane.NAME}, {variant}"
        self.terminated: list[str] = []

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=self.timeout * 4)

    def chaos(self, tasks: Mapping[str, str], kills: int, rng: random.Random, wait: tuple[float, float],
              on_kill: Callable[[str, float], None], parallel: int) -> None:
        self._on_loop(self._chaos(dict(tasks), kills, rng, wait, on_kill, parallel))

    async def _chaos(self, tasks: dict[str, str], kills: int, rng: random.Random, wait: tuple[float, float],
                     on_kill: Callable[[str, float], None], parallel: int) -> None:
        runs = {rid: _Run(rid, task, LaneSubject(self.ctx, self.lane, self.variant)) for rid, task in tasks.items()}
        pending, live = list(runs), {}
        began = time.monotonic()
        next_kill: float | None = None
        replacing: asyncio.Future[None] | None = None  # the last kill's replacement worker, while it starts
        landed = 0
        try:
            while pending or live:
                while pending and len(live) < parallel:
                    run = runs[pending.pop(0)]
                    live[run.run_id] = run
                    run.job = asyncio.ensure_future(self._one(run))
                for rid, run in list(live.items()):
                    if run.replacing is not None and run.replacing.done():
                        run.replacing.result()  # a replacement worker that did not start: raised here
                    if run.job is not None and run.job.done():
                        run.job.result()  # a worker that did not start, a start refused: raised here
                        del live[rid]
                        for proc in run.workers:
                            await asyncio.to_thread(proc.kill)  # its run has ended: nothing left to serve
                # Open to a kill: started, not ended, its worker up (not one being replaced).
                open_runs = sorted(rid for rid, run in live.items() if run.began is not None and run.ended is None
                                   and run.worker is not None and run.worker.alive())
                # The clock of the next kill starts once a run is open and the last kill's replacement is up, as
                # the matrix's own Temporal engine waits for its new worker: a kill the moment a replacement is
                # ready would hold its run at the same turn, kill after kill.
                if next_kill is None and open_runs and (replacing is None or replacing.done()):
                    next_kill = time.monotonic() + rng.uniform(*wait)
                if landed < kills and open_runs and next_kill is not None and time.monotonic() >= next_kill:
                    run = runs[rng.choice(open_runs)]
                    assert run.worker is not None
                    victim, run.worker = run.worker, None
                    await asyncio.to_thread(victim.kill)
                    landed += 1
                    await asyncio.to_thread(on_kill, run.run_id, time.monotonic() - began)
                    run.replacing = replacing = asyncio.ensure_future(self._worker(run, f"w{landed}"))
                    next_kill = None
                await asyncio.sleep(0.05)
        finally:
            for run in runs.values():
                for fut in (run.job, run.replacing):
                    if fut is not None and not fut.done():
                        fut.cancel()
                for proc in run.workers:
                    await asyncio.to_thread(proc.kill)
                if run.began is not None and run.ended is None:  # stopped early (an error): leave no run open
                    try:
                        await self.ctx.client.get_workflow_handle(run.run_id).terminate("random kills stopped early")
                    except RPCError:
                        pass  # it ended meanwhile

    async def _worker(self, run: _Run, tag: str) -> None:
        proc = await run.subject.start_worker(run.run_id, crash_at="", llm_url=self.llm_url,
                                              name=f"random-{run.run_id}-{tag}")
        run.workers.append(proc)
        run.worker = proc

    async def _one(self, run: _Run) -> None:
        """One run: its worker up, the run started on its queue, its result awaited (terminated past the
        deadline: ``Subject.result``)."""
        await self._worker(run, "w0")
        await run.subject.start_run(run.run_id, run.task)
        run.began = time.monotonic()
        run.outcome, _ = await run.subject.result(run.run_id, self.timeout)
        run.ended = time.monotonic()
        if run.outcome.startswith("not done"):
            self.terminated.append(run.run_id)
            print(f"  random kills / {self.label}: run {run.run_id} {run.outcome}", file=sys.stderr, flush=True)
        if self.active_seconds is None:  # the first run is the matrix's unkilled one: the scale of its waits
            self.active_seconds = max(0.2, run.ended - run.began)

    def run_at(self, run_id: str, task: str, crash_at: str) -> bool:
        """The point matrix: the run on a queue of its own, its worker armed with ``crash_at`` (the lane's crash
        point, ``peers.lane.CRASH_POINTS``), SIGKILLed there by it; a replacement worker, unarmed, on the same
        queue; the run followed to its end (terminated past the deadline). True if the armed worker died there."""
        return self._on_loop(self._run_at(run_id, task, crash_at))

    async def _run_at(self, run_id: str, task: str, crash_at: str) -> bool:
        run = _Run(run_id, task, LaneSubject(self.ctx, self.lane, self.variant))
        armed = await run.subject.start_worker(run_id, crash_at=crash_at, llm_url=self.llm_url,
                                               name=f"points-{run_id}-armed")
        run.workers.append(armed)
        try:
            await run.subject.start_run(run_id, task)
            result = asyncio.ensure_future(run.subject.result(run_id, self.timeout))
            while armed.alive() and not result.done():
                await asyncio.sleep(0.02)
            killed = not armed.alive() and armed.popen.returncode == -9
            if killed:
                await self._worker(run, "standby")
            outcome, _ = await result
            if outcome.startswith("not done"):
                self.terminated.append(run_id)
            return killed
        finally:
            for proc in run.workers:
                await asyncio.to_thread(proc.kill)

    def status(self, run_id: str) -> str:
        async def described() -> str:
            try:
                found = await self.ctx.client.get_workflow_handle(run_id).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return ""
                raise
            return _WORDS.get(found.status, str(found.status)) if found.status is not None else ""

        return self._on_loop(described())

    def recorded_turns(self, run_id: str) -> set[str] | None:
        async def completed_model_requests() -> int:
            try:
                history = await self.ctx.client.get_workflow_handle(run_id).fetch_history()
            except RPCError:
                return -1
            scheduled: dict[int, str] = {}
            done = 0
            for event in history.events:
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    name = scheduled.get(event.activity_task_completed_event_attributes.scheduled_event_id, "")
                    done += name.endswith(MODEL_ACTIVITIES)
            return done

        done = self._on_loop(completed_model_requests())
        return None if done < 0 else {str(turn) for turn in range(1, done + 1)}


POINTS = tuple(f"{point}@1" for point in CRASH_POINTS)
"""The point matrix's points for a lane: the faults' crash points (``peers.lane.CRASH_POINTS``), each at its first
reach; the lab's loop is killed at the same places by its own names (``LAB_POINTS``)."""


def lab_matrix(ctx: Context, *, standin_url: str | None = None, points: bool = False) -> KillMatrix:
    """The lab's own loop on Temporal under the same tool: the matrix's ``temporal`` engine with the refund agent,
    its turns counted at the matrix's own varied stand-in (``count_turns``), the same task, probe and provider;
    ``points``: at ``POINTS`` (by the lab's names), for the point matrix."""
    named = [LAB_POINTS.get(p.partition("@")[0], p.partition("@")[0]) + "@1" for p in POINTS] if points else None
    return KillMatrix(LAB_AGENT, task_for(ctx.provider_url), params={"email": EMAIL}, engines=("temporal",),
                      env={"PROVIDER_URL": ctx.provider_url}, cwd=REPO, temporal_address=ctx.server.address,
                      probe=probe_for(ctx.provider_url), count_turns=True, timeout=RUN_TIMEOUT,
                      standin_url=standin_url, points=named)


def lane_matrix(ctx: Context, engine: LaneEngine, standin_url: str, *, points: bool = False) -> KillMatrix:
    """A lane's variant under the tool: the agent string is only the report's label; ``points``: at ``POINTS``,
    for the point matrix (``KillMatrix.run``: ``LaneEngine.run_at``)."""
    return KillMatrix(engine.label, task_for(ctx.provider_url), engines=[engine], probe=probe_for(ctx.provider_url),
                      standin_url=standin_url, timeout=RUN_TIMEOUT, points=list(POINTS) if points else None)


def summary(label: str, report: Report, provider_url: str) -> str:
    """One line per subject: runs that applied an effect again, lost one, passed; what the unkilled run applied,
    and the refunds the provider refused (a second refund past the order's total: the cap, not the tool,
    kept it from being applied)."""
    (name,) = report.reference
    ref = report.reference[name]
    twice = [r for r in report.rows if any("an effect applied again" in why for why in r.reasons)]
    lost = [r for r in report.rows if any("an effect lost" in why for why in r.reasons)]
    passed = [r for r in report.rows if r.verdict == "passed"]
    other = [r for r in report.rows if r.verdict != "passed" and r not in twice and r not in lost]
    refused = sum(refused_refunds(provider_url, r.run_id) for r in report.rows)
    unkilled = ", ".join(f"{kind} {n}" for kind, n in (ref.get("probe") or {}).items()) or "-"
    parts = [f"applied twice: {len(twice)}", f"lost: {len(lost)}", f"passed: {len(passed)}"]
    if other:
        parts.append(f"failed otherwise or not judged: {len(other)}")
    killed = (f"{ref['kills_landed']} kill(s) landed" if "kills_landed" in ref
              else f"killed at {len(report.rows)} point(s)")
    return (f"{label}: {' / '.join(parts)} of {len(report.rows)} run(s); {killed}; the unkilled run applied "
            f"{unkilled}; refunds refused by the provider's cap: {refused}")
