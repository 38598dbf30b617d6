"""The agent loop killed right after a refund and resumed, on every engine that runs it: one table, one page.

    make loop-scenario   (or: python -m lesson.loop_scenario [--html PATH] [--state-dir DIR] [--json])

Starts what it needs (a Temporal dev server in memory on free ports, one
provider process with its own store, one model stand-in process,
``durable_agents.testing.standin``, which counts every request by run and turn) and plays
the same task on each engine through its driver (``lab.engines``:
``start_loop``, ``killed``, ``resume``, ``loop_status``), each engine in
processes of its own and under a run id of its own:

- the task names two orders, seeded at the provider for that run: six turns
  (a lookup; the refund and its email, two calls in one turn; the second
  lookup; its refund and email; the ticket; the final answer);
- the process running the loop (a Temporal worker, ``python -m durable_agents.runrecord
  loop``, ``python -m durable_agents.dbosflow loop``) is armed with
  ``CRASH_AT=tool:issue_refund:after_effect``: it dies by SIGKILL right
  after the provider applied the first refund, before the call's result is
  recorded;
- a fresh process resumes the run (a new worker; ``python -m durable_agents.runrecord
  resume``; ``python -m durable_agents.dbosflow resume``): the recorded turns come back from
  the record, the model is not asked them again, and the refund call runs
  again under the same key: its tool's lookup asks the provider what it holds
  under the key and takes the applied refund's answer, sending nothing again.

Then one table, per engine: the turns and tool calls the record holds (and
the executions of those calls), what the stand-in was asked (a turn asked
again would show here), what the provider applied for how many requests,
and the seconds from the kill to the final answer recorded. With ``--html
PATH`` it also draws the runs as one page (``lesson.loop_page``): a lane
per engine, its turns and calls on its own time axis, the kill, the restart,
what was read back from the record and what ran again.

Where each number and time comes from: the turns and calls from the
engines' records (``loop_status``; the bars' times from the run record's rows,
``python -m durable_agents.dbosflow steps --json`` and Temporal's history through
``durable_agents.flowclient.loop.read_chain``); what was asked from the stand-in's counts;
what was applied from the provider's store; the kill (when the dead process
was reaped), the restart and the moment a restarted process said what it had
read, observed by this module, as ``lesson.scenario`` observes them.

Expected, on every engine: the run completed with 6 turns and 7 tool calls;
the stand-in asked each turn once (none asked again); the provider applied 2
refunds, 2 emails and 1 ticket, each once and each key requested once (the
interrupted refund's looked up by its retry); the restarted process began at ``turn-2/call-0`` and ran
none of the steps recorded before the kill. Exit code 0 if every engine's row
is the expected one, 1 if not, 2 if the scenario could not be played (a
process did not start or die as planned). The DBOS row needs the optional
extra (``pip install -e '.[dbos]'``); without it the row is left out, saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from durable_agents.dbosflow.sides import DbosSide
from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.runrecord.sides import RecordSide
from durable_agents.steps.loop import call_step, parse_step
from durable_agents.steps.runstate import unix
from durable_agents.steps.startedline import parse_started
from durable_agents.testing.standin import start_model_standin, turns_asked
from lab import registry
from lab.engines import (
    DbosDriver,
    EngineDriver,
    RunRecordDriver,
    TemporalDriver,
    loop_status_of,
    started_steps,
)
from lab.processes import BaseProc, DevServer, Proc
from lab.provider_process import ProviderProcess, start_provider
from lesson.effects import effect_entries
from lesson.lanes import Watched
from lesson.loop_observed import (
    EMAIL,
    LABELS,
    MAX_TURNS,
    MODEL_DELAY,
    NAMES,
    POINT,
    PROCESS_TIMEOUT,
    Attempt,
    LoopObserved,
    render,
)
from lesson.scenario import (
    DBOS_LEFT_OUT,
    HAVE_DBOS,
    ScenarioError,
    dev_server_meanwhile,
    html_writable,
    knew_at,
    play_and_show,
    progress,
    resume_to_the_end,
    state_and_stamp,
)
from timeline import OBSERVED, RECORD

if TYPE_CHECKING:
    from temporalio.client import Client

    from durable_agents.flowclient.loop import LoopChain

# ---------------------------------------------------------------- the engines' records, as bars


def _utc(value: datetime | None) -> float | None:
    """A history time (naive UTC, as the SDK gives it) as Unix seconds."""
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _process(at: float, seen: Watched) -> int:
    return 1 if seen.restarted_at is None or at < seen.restarted_at else 2


def record_attempts(side: RecordSide, seen: Watched) -> list[Attempt]:
    """The run record's bars (``durable_agents.runrecord.compare.record_side``): a step row's started_at to
    completed_at; a call with an effect, one bar per intent (its attempt), from its intent recorded to its answer; an
    intent whose process died ends at the kill (observed)."""
    out = []
    for step in side["steps"]:
        intents = step["intents"]
        if not intents:
            start, end = unix(step["started_at"]), unix(step["completed_at"])
            if start is not None:
                out.append(Attempt(step["name"], start, end or start, RECORD, RECORD, _process(start, seen)))
            continue
        for intent in intents:
            start, settled = unix(intent["recorded_at"]), unix(intent["settled_at"])
            if start is None:
                continue
            if intent["state"] == "answered" and settled is not None:
                out.append(Attempt(step["name"], start, settled, RECORD, RECORD, _process(start, seen)))
            elif seen.killed_at is not None and seen.killed_at >= start:  # in doubt when its process died
                out.append(Attempt(step["name"], start, seen.killed_at, RECORD, OBSERVED, 1, killed=True))
    return out


def dbos_attempts(side: DbosSide, seen: Watched, first: Proc) -> list[Attempt]:
    """DBOS's bars (``python -m durable_agents.dbosflow steps --json``): each ``operation_outputs`` row, started to
    completed, in the process of its dispatch. DBOS writes nothing when a step starts, so the attempt killed in process
    1 has no row: it is drawn from that process's ``step ... started`` line to the kill (both observed)."""
    out = []
    for row in side["rows"]:
        start, end = unix(row["started_at"]), unix(row["completed_at"])
        if start is not None:
            out.append(Attempt(row["name"], start, end or start, RECORD, RECORD,
                               1 if (row.get("dispatch") or 1) == 1 else 2))
    in_first = {a.step for a in out if a.process == 1}
    for at, line in first.stamped():
        began = parse_started(line)
        if began is not None and began.step not in in_first and seen.killed_at is not None:
            out.append(Attempt(began.step, at, seen.killed_at, OBSERVED, OBSERVED, 1, killed=True))
    return out


def temporal_attempts(chain: LoopChain, seen: Watched) -> list[Attempt]:
    """Temporal's bars (``durable_agents.flowclient.loop.read_chain``): each activity execution of every run of the
    chain, from its ActivityTaskStarted to its close. The one killed ends at the kill (observed); the server closed it
    later, at its heartbeat timeout (``waited_until``, record)."""
    out = []
    for run in chain.runs:
        for step, traces in run.attempts.items():
            for trace in traces:
                start, closed = _utc(trace.started_time), _utc(trace.closed_time)
                if start is None:
                    continue
                killed = seen.killed_at
                if trace.crashed and killed is not None and start <= killed <= (closed or killed):
                    out.append(Attempt(step, start, killed, RECORD, OBSERVED, 1, killed=True, waited_until=closed))
                else:
                    out.append(Attempt(step, start, closed or start, RECORD, RECORD, _process(start, seen)))
    return out


async def temporal_replay(client: Client, run_id: str) -> tuple[float, float] | None:
    """The first workflow task a worker new to the run started (it replayed the history), from history: its
    start and its close."""
    from temporalio.api.enums.v1 import EventType

    from durable_agents.flowclient.status import read_history

    _, history = await read_history(client, run_id)
    first: str | None = None
    replay: tuple[int, float] | None = None
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            identity = ev.workflow_task_started_event_attributes.identity
            at = _utc(ev.event_time.ToDatetime()) or 0.0
            if first is None:
                first = identity
            elif identity != first and replay is None:
                replay = (ev.event_id, at)
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and replay is not None:
            if ev.workflow_task_completed_event_attributes.started_event_id == replay[0]:
                return replay[1], _utc(ev.event_time.ToDatetime()) or replay[1]
    return (replay[1], replay[1]) if replay else None


# ---------------------------------------------------------------- playing it


def applied_by_kind(provider_url: str, run_id: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for effect in fetch_effects(provider_url, run_id=run_id):
        out[effect.kind] = out.get(effect.kind, 0) + effect.effects_applied
    return out


class LoopScenario:
    """The scenario on the given processes (``play_on``: a test's dev server, provider and stand-in) or on
    processes of its own (``play``)."""

    def __init__(self, state: Path, say: Callable[[str], None], stamp: str, *,
                 model_delay: float = MODEL_DELAY) -> None:
        self.state = state
        self.say = say
        self.stamp = stamp
        self.model_delay = model_delay
        self.base = random.randrange(10_000, 99_000, 2)  # the orders' numbers: new ones for every play

    def run_id(self, engine: str) -> str:
        return f"loop-scenario-{engine}-{self.stamp}"

    def orders(self, engine: str) -> dict[str, int]:
        letter = registry.engine(engine).letter
        return {f"{letter}-{self.base}": 2500, f"{letter}-{self.base + 1}": 4000}

    async def one(self, driver: EngineDriver, provider_url: str, standin_url: str) -> LoopObserved:
        """One engine: the run, the kill right after the first refund, the resume, and what every witness says."""
        engine = driver.name
        orders = self.orders(engine)
        first_order, second_order = orders
        task = f"Order {first_order} arrived broken and so did {second_order}: please refund both."
        obs = LoopObserved(engine, self.run_id(engine), task, orders)
        seed_orders(provider_url, orders)
        names = NAMES[engine]
        self.say(f"{LABELS[engine]}: run {obs.run_id}, {names[0]} armed with CRASH_AT={POINT}")
        first = await driver.start_loop(obs.run_id, task, EMAIL, crash_at=POINT, max_turns=MAX_TURNS)
        await driver.killed(first)
        killed_at = time.time()
        obs.at_kill = await driver.loop_status(obs.run_id)
        obs.applied_at_kill = applied_by_kind(provider_url, obs.run_id)
        self.say(f"  {names[0]} killed right after the refund was applied; the record holds: "
                 f"{', '.join(obs.recorded_at_kill) or 'nothing'}; starting {names[1]}")
        resumed = await resume_to_the_end(driver, obs.run_id)
        second = resumed.proc
        seen = obs.watched
        seen.names, seen.killed_in = names, POINT
        seen.began_at, seen.killed_at, seen.restarted_at = first.started_at, killed_at, second.started_at
        seen.ended_at, seen.refused_restarts = time.time(), resumed.refused
        if resumed.status is not None and not isinstance(driver, TemporalDriver):
            obs.final = loop_status_of(resumed.status)  # the CLI's status --json, read as the resume ended
        else:
            obs.final = await driver.loop_status(obs.run_id)
        obs.first_started, obs.second_started = started_steps(first), started_steps(second)
        await self.read_record(driver, obs, first, second)
        obs.asked = turns_asked(standin_url, obs.run_id)
        obs.provider = effect_entries(fetch_effects(provider_url, run_id=obs.run_id))
        took = obs.kill_to_completed
        self.say(f"  {obs.final['status'] if obs.final else 'not found'}"
                 + (f", {took:.1f} s after the kill" if took is not None else ""))
        return obs

    async def read_record(self, driver: EngineDriver, obs: LoopObserved, first: Proc, second: Proc) -> None:
        """The bars and the provider's replays from the engine's own record (read while its server runs)."""
        seen = obs.watched
        if isinstance(driver, TemporalDriver):
            from durable_agents.flowclient.loop import read_chain

            client = await driver.client()
            chain = await read_chain(client, obs.run_id)
            obs.attempts = temporal_attempts(chain, seen)
            obs.replayed = {call_step(t, i): bool(r.get("replayed")) for run in chain.runs
                            for (t, i), r in run.results.items()}
            replay = await temporal_replay(client, obs.run_id)
            obs.knew = (replay[0], replay[1], RECORD) if replay else None
            return
        if isinstance(driver, RunRecordDriver):
            from durable_agents.runrecord.compare import record_side
            from durable_agents.runrecord.store import RunRecord

            with RunRecord(Path(driver.env["RUNRECORD_DB"])) as record:
                side = record_side(record, obs.run_id)
            obs.attempts = record_attempts(side, seen)
            results = {s["name"]: s["result"] for s in side["steps"]}
        else:
            assert isinstance(driver, DbosDriver)
            dbos = await driver.steps(obs.run_id)
            if dbos is None:
                raise ScenarioError(f"DBOS holds no run {obs.run_id}")
            obs.attempts = dbos_attempts(dbos, seen, first)
            results = {s["name"]: s["result"] for s in dbos["steps"]}
        obs.replayed = {name: bool(result.get("replayed")) for name, result in results.items()
                        if isinstance(result, dict) and parse_step(name)[1] is not None}
        at = knew_at(second, driver.knew)
        obs.knew = (at, at, OBSERVED) if at is not None else None

    async def play_on(self, server: DevServer, provider_url: str, standin_url: str) -> list[LoopObserved]:
        """Every engine in turn, on ``server``, the provider and the stand-in given."""
        env = {"PROVIDER_URL": provider_url, "LLM_BASE_URL": standin_url, "LLM_MODEL": "scripted",
               "MEMORY_DB": str(self.state / "memory.db"), "RUNRECORD_DB": str(self.state / "runrecord.db"),
               "DBOSFLOW_DB": str(self.state / "dbosflow.db"), "PYTHONUNBUFFERED": "1"}
        drivers: list[EngineDriver] = [
            TemporalDriver(server, env, queue=f"loop-scenario-{self.stamp}", timeout=PROCESS_TIMEOUT),
            RunRecordDriver(env, timeout=PROCESS_TIMEOUT)]
        if HAVE_DBOS:
            drivers.append(DbosDriver(env, timeout=PROCESS_TIMEOUT))
        else:
            self.say(DBOS_LEFT_OUT)
        try:
            return [await self.one(driver, provider_url, standin_url) for driver in drivers]
        finally:
            for driver in reversed(drivers):
                driver.close()  # workers and runners: nothing to hand back

    def play(self) -> list[LoopObserved]:
        return asyncio.run(self._play())

    async def _play(self) -> list[LoopObserved]:
        provider: ProviderProcess | None = None
        standin: BaseProc | None = None
        self.say("starting a Temporal dev server (in memory), the provider (counts effects per idempotency key) "
                 "and the model stand-in (counts every turn it is asked)")
        async with dev_server_meanwhile() as server_started:  # a few seconds: meanwhile, the rest
            try:
                provider = start_provider(self.state / "provider.db")
                standin, standin_url = start_model_standin(delay=self.model_delay)
                return await self.play_on(await server_started(), provider.url, standin_url)
            finally:
                if standin is not None:
                    standin.kill()
                if provider is not None:
                    provider.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lesson.loop_scenario",
        description="The agent loop killed right after a refund and resumed, on every engine; one table.")
    parser.add_argument("--html", type=Path, default=None, metavar="PATH",
                        help="also draw the runs as one page: a lane per engine, written to PATH")
    parser.add_argument("--json", action="store_true", help="print the observations as JSON (progress to stderr)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep the provider's, records' and memory's files here (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    say = progress(out)

    if not html_writable(args.html):  # before the work, not after
        return 2
    state, stamp = state_and_stamp(args.state_dir, "loop-scenario-")

    def page(results: list[LoopObserved]) -> str:
        from lesson.loop_page import loop_page

        return loop_page(results)

    return play_and_show(lambda: LoopScenario(state, say, stamp).play(), state=state,
                         keep_state=args.state_dir is not None, as_json=args.json, out=out, render=render,
                         html=args.html, page=page)


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
