"""Chaos over the agent loop: many loop runs on each engine while the processes running them are SIGKILLed at
random moments, the model words every answer differently, and the provider fails and loses responses; then
checks, from the provider's store, the model stand-in's counts and each engine's status, that every run
completed, no effect was duplicated or lost, and no recorded turn was asked again.

    .venv/bin/python -m lab.loop_chaos [--engine temporal|runrecord|dbos|all] [--runs N] [--kills K]
                                       [--seed S] [--max-seconds T] [--vary | --no-vary]
    make chaos-loop

Each engine gets a session of its own (one after the other with ``all``): a provider on a fresh store (the
judge of "once"), the model stand-in as its own process (``durable_agents.testing.standin``: the scripted model behind
an OpenAI-compatible API, every answer ``--model-delay`` seconds late, counting every request by run and turn),
and the engine's processes, driven through ``lab.engines`` (``start_loop``, ``resume``, ``loop_status``):

1. a wave of ``--runs`` loop runs, each with orders of its own seeded at the provider and a task naming 1-3
   of them (so 4, 6 or 8 turns; every order's refund and its email are two calls of one turn). On Temporal
   the wave is started at once on one task queue; on the run record and DBOS each run is a process of its
   own (``python -m durable_agents.runrecord loop``, ``python -m durable_agents.dbosflow loop``), at most ``--parallel``
   at a time. While kills are still to land, another wave follows: on Temporal once every run of the last has closed (as
   ``lab.chaos``), on the others once fewer runs than ``--parallel`` are left to run;
2. the kill phase, until ``--kills`` SIGKILLs have landed on a process running a run, one every 0.5-2.5 s
   (random). On Temporal, as ``lab.chaos``: a random ready worker of the queue, replaced at once (worker A
   always, B with probability 0.6; B, the standby, comes when absent with probability 0.6, so part of the
   time two workers share the queue). On the run record and DBOS: a random run's process that has begun a
   step (each run's processes at most ``KILLS_PER_RUN`` times); once the kill has been observed, the run
   is resumed (``resume``: ``python -m durable_agents.runrecord resume``, ``python -m durable_agents.dbosflow resume``),
   and that process may be killed in turn. Before each kill, at random, the
   provider (``POST /admin/faults``) is told to answer the next 1-3 effect requests (the tool calls'
   refunds, emails, tickets) 503 before applying anything, or to apply the next 1-2 and lose the response
   (503 after the effect);
3. the drain: faults cleared (what never fired is not counted), on Temporal worker A back, until every run
   has stopped running (or ``--max-seconds``);
4. the checks (``check``; each can fail, and ``tests/test_loop_chaos.py`` shows that it does):

   - **0 failed**: every run completed, as its engine's ``loop_status`` says;
   - **0 duplicate**: every effect the provider applied for a run was applied under the key of a call the
     run recorded (a turn asked again would choose other call ids, so other keys); per (run, order) at most
     one refund, never more in all than the order's total; per run no more refunds, emails, tickets than its
     task asks (one refund and one email per order, one ticket);
   - **0 lost**: every recorded call with an effect has it applied at the provider under its key, with the
     id the run recorded; every completed run refunded each of its orders in full and sent its emails and
     its ticket;
   - **no recorded turn asked again**: a turn's count at the stand-in, read each time the turn is seen
     recorded (after every kill, and at the end), never grows afterwards; and every turn was asked at most
     ``1 + k`` times, k the kills that landed *during that turn*: kills at which the turn was the run's next
     step to be recorded (its run's previous step recorded, the turn not). On the run record and DBOS that
     is read from the killed run's record with its process dead (the resume waits for it); on Temporal, with
     other workers still running, a kill is counted for every open run's turns from the first unrecorded
     one before the kill to the next step after it, a bound that errs generous, while the first rule, the
     strict one, is the same on every engine.

A table follows, one row per engine: runs, turns and tool calls recorded, kills landed (and how many of them
landed during a model turn), provider faults that fired, failed, duplicate, lost, turns asked again within
the bound (each in flight at a kill: ``re-asked``), turns asked beyond it (``asked again``), seconds. The
exit code is 0 only if every check passes on every engine.

The model varies by default (``--no-vary`` for the deterministic stand-in): every answer's words carry a
number and every call id is random, as a real model's, so a turn asked again chooses other keys and a
duplicate the provider's idempotency could otherwise hide shows as an effect under a key no recorded call has.

Seeded (``--seed``: the runs' orders and tasks, the kill and fault choices, the waits; what is running at a
given moment still depends on the machine) and bounded: each engine's session ends by ``--max-seconds``
whatever happens, and every process it started is killed; a run still open then fails the first check.

On DBOS each run has a system database of its own: ``python -m durable_agents.dbosflow loop`` and ``resume`` launch
DBOS, whose recovery re-dispatches *every* pending run of the version in its database, live ones in another process
included (every process is DBOS's executor ``local``), so two processes on one database run the same run at
once and ask its turn twice with no kill at all. One database per run keeps "the process running a run" one
process, as the run record's lease and Temporal's task queue do for them.
``--dbos-on postgres`` puts those databases on PostgreSQL (a database per run on a server the command starts
and stops itself, ``lab.postgres``): the same checks on DBOS's real database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from durable_agents.providerclient import EffectRecord, ProviderClient, fetch_effects
from durable_agents.steps.controls import printable
from durable_agents.steps.engine_row import Engine
from durable_agents.steps.loop import EFFECT_OF_TOOL
from durable_agents.testing.standin import start_model_standin
from lab import registry
from lab.chaos_moves import (
    clear_faults,
    inject_faults,
    model_words,
    ready_workers,
    replaces,
    terminate_open,
    wants_standby,
)
from lab.engines import EngineDriver, LoopStatus, LoopTurn, TemporalDriver, driver_for, started_steps
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc, wait_until
from lab.provider_process import ProviderProcess, start_provider

KINDS = ("refund", "email", "ticket")
ITEMS = {"refund": ("/v1/refunds", "refunds", "refund_id"), "email": ("/v1/emails", "emails", "message_id"),
         "ticket": ("/v1/tickets", "tickets", "ticket_id")}
"""Each kind of effect: the provider's list of what it applied (``GET``), the list's name, the effect's id."""
TASKS = (
    "Order {0} arrived broken: please refund it.",
    "Orders {0} and {1} never arrived. Refund both, please.",
    "Refund my orders {0}, {1} and {2}: all three came damaged.",
)
KILLS_PER_RUN = 3
"""Run record and DBOS: the most kills one run's processes take, so that kills spread over the runs and no step
comes near the engines' limit of deaths (``durable_agents.steps.retry``: 10 per step, then the run fails as a poison
pill)."""
MOST_RUNS = 999  # a wave's runs: an order id is the engine's letter, the wave, the run's 3 digits, the order's 1
CHECKS = ("failed", "duplicate", "lost", "asked again")
CHECK_NAMES = {"failed": "every run completed", "duplicate": "no duplicate effect", "lost": "no lost effect",
               "asked again": "no recorded turn asked again (each turn asked at most 1 + the kills during it)"}


@dataclass
class LoopChaosConfig:
    engines: tuple[str, ...] = field(default_factory=lambda: registry.names(loop=True))  # each one's session
    runs: int = 20  # per wave
    kills: int = 10  # per engine, each landed on a process running a run
    seed: int = 1
    max_seconds: float = 300.0  # per engine's session
    vary: bool = True
    model_delay: float = 0.3  # seconds the stand-in takes per model turn: runs are in flight when kills land
    parallel: int = 6  # run record and DBOS: run processes at once
    kill_gap: tuple[float, float] = (0.5, 2.5)  # seconds between kills
    server: DevServer | None = None  # Temporal: a running dev server; None: one of the session's own
    dbos_database: Callable[[str], str] | None = None  # DBOS: a run's database URL (PostgreSQL); None: SQLite files
    workdir: Path | None = None  # None: a temporary directory
    say: Callable[[str], object] = print


# ---------------------------------------------------------------- what is checked, and the check


@dataclass(frozen=True)
class PlannedRun:
    """A loop run as chaos starts it: its task names ``orders`` (order id -> total in cents), seeded whole."""

    run_id: str
    task: str
    email: str
    orders: dict[str, int]


@dataclass
class RunFacts:
    """What the checks read of one run: its engine's status, the stand-in's count of each turn, the kills
    that landed during each turn, and each turn's count when it was first seen recorded."""

    run: PlannedRun
    status: LoopStatus | None = None
    asked: dict[int, int] = field(default_factory=dict)
    kills_during: Counter[int] = field(default_factory=Counter)
    asked_when_recorded: dict[int, int] = field(default_factory=dict)


@dataclass
class ProviderState:
    """The provider's store: its bookkeeping per key, and the effects it applied, by kind."""

    effects: list[EffectRecord]
    applied: dict[str, list[dict[str, Any]]]


@dataclass
class Findings:
    failed: list[str] = field(default_factory=list)
    duplicate: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    asked_again: list[str] = field(default_factory=list)

    def of(self, check: str) -> list[str]:
        return {"failed": self.failed, "duplicate": self.duplicate, "lost": self.lost,
                "asked again": self.asked_again}[check]

    @property
    def ok(self) -> bool:
        return not (self.failed or self.duplicate or self.lost or self.asked_again)

    def all(self) -> list[str]:
        return [f"{check}: {line}" for check in CHECKS for line in self.of(check)]


def _turns(status: LoopStatus | None) -> list[LoopTurn]:
    return [] if status is None else status["turns"]


def _recorded_calls(status: LoopStatus | None) -> Iterable[tuple[int, dict[str, Any]]]:
    for turn in _turns(status):
        for call in turn["calls"]:
            yield turn["turn"], dict(call)


def check(runs: Sequence[RunFacts], provider: ProviderState) -> Findings:
    """The four checks (the module docstring), from facts gathered elsewhere: a pure function, so that a
    test can feed it a provider state with a duplicated or a missing effect and see it fail."""
    found = Findings()
    recorded: dict[str, tuple[str, int, dict[str, Any]]] = {}  # key -> (run, turn, call), every call that applied
    refused: set[str] = set()  # the keys of calls recorded as refused: nothing applied
    for r in runs:
        rid, st = r.run.run_id, r.status
        if st is None:
            found.failed.append(f"run {rid}: its engine holds no such run")
        elif st["status"] != "completed":
            found.failed.append(f"run {rid} is {st['status']}: {st['error'] or 'it did not complete in time'}")
        for number, call in _recorded_calls(st):
            if call["key"] and call["status"] == "completed":
                if call["outcome"] == "ok":
                    recorded[call["key"]] = (rid, number, call)
                else:
                    refused.add(call["key"])
    _check_keys(found, {r.run.run_id for r in runs}, provider, recorded, refused)
    for r in runs:
        _check_run_effects(found, r, provider)
    _check_recorded_applied(found, provider, recorded)
    for r in runs:
        _check_asked(found, r)
    return found


def _check_keys(found: Findings, run_ids: set[str], provider: ProviderState,
                recorded: Mapping[str, object], refused: set[str]) -> None:
    """Duplicate: every applied effect under the key of a call its run recorded as applied, once."""
    for effect in provider.effects:
        if not effect.effects_applied:
            continue
        where = f"a {effect.kind} applied under key {effect.key}"
        if effect.effects_applied > 1:
            found.duplicate.append(f"run {effect.run_id}: {effect.effects_applied} {effect.kind}s applied under one "
                                   f"key {effect.key}")
        if effect.run_id not in run_ids:
            found.duplicate.append(f"{where}, for run {effect.run_id}, which chaos never started")
        elif effect.key in refused:
            found.duplicate.append(f"run {effect.run_id}: {where}, whose call the run recorded as refused")
        elif effect.key not in recorded:
            found.duplicate.append(f"run {effect.run_id}: {where}, which no call the run recorded holds (the call "
                                   "of a turn asked again?)")


def _check_run_effects(found: Findings, r: RunFacts, provider: ProviderState) -> None:
    """Duplicate: per (run, order) one refund, never beyond the order's total; no more effects than the task
    asks for. Lost (a completed run): each order refunded in full, each email and the ticket sent."""
    rid = r.run.run_id
    completed = r.status is not None and r.status["status"] == "completed"
    refunds: defaultdict[str, list[int]] = defaultdict(list)
    for refund in provider.applied.get("refund", []):
        if refund.get("run_id") == rid:
            refunds[str(refund.get("order_id"))].append(int(refund.get("amount") or 0))
    for order, amounts in refunds.items():
        total = r.run.orders.get(order)
        if len(amounts) > 1:
            found.duplicate.append(f"run {rid}: order {order} refunded {len(amounts)} times ({amounts})")
        if total is None or sum(amounts) > total:
            found.duplicate.append(f"run {rid}: order {order} refunded {sum(amounts)} in all, beyond its total {total}")
    if completed:
        for order, total in r.run.orders.items():
            if sum(refunds.get(order, [])) < total:  # beyond it is a duplicate, above
                found.lost.append(f"completed run {rid}: order {order} refunded {sum(refunds.get(order, []))} "
                                  f"of its {total}")
    wanted = {"refund": len(r.run.orders), "email": len(r.run.orders), "ticket": 1}
    applied = Counter(kind for kind in KINDS for item in provider.applied.get(kind, []) if item.get("run_id") == rid)
    for kind, n in wanted.items():
        if applied[kind] > n:
            found.duplicate.append(f"run {rid}: {applied[kind]} {kind}s applied; its task asks for {n}")
        elif applied[kind] < n and completed:
            found.lost.append(f"completed run {rid}: {applied[kind]} {kind}s applied; its task asks for {n}")


def _check_recorded_applied(found: Findings, provider: ProviderState,
                            recorded: Mapping[str, tuple[str, int, dict[str, Any]]]) -> None:
    """Lost: every call recorded as applied has its effect at the provider, with the id the run recorded."""
    by_key = {effect.key: effect for effect in provider.effects}
    items = {kind: {item.get("idempotency_key"): item for item in provider.applied.get(kind, [])} for kind in KINDS}
    for key, (rid, number, call) in recorded.items():
        kind = EFFECT_OF_TOOL.get(call["name"], "?")
        where = f"run {rid} turn {number} call {call['index']} ({call['name']}) recorded {kind} {call['effect_id']}"
        effect = by_key.get(key)
        if effect is None or not effect.effects_applied:
            found.lost.append(f"{where}; the provider applied nothing under its key {key}")
            continue
        item = items.get(kind, {}).get(key)
        held = None if item is None else item.get(ITEMS[kind][2])
        if held != call["effect_id"]:
            found.lost.append(f"{where}; the provider holds {held} under its key")


def _check_asked(found: Findings, r: RunFacts) -> None:
    """No recorded turn asked again: each turn's count at most 1 + the kills during it, and never grown since it
    was seen recorded; every recorded turn seen by the stand-in (else the witness is not the model)."""
    rid = r.run.run_id
    for turn in _turns(r.status):
        if turn["status"] == "completed" and not r.asked.get(turn["turn"]):
            found.asked_again.append(f"run {rid}: turn {turn['turn']} is recorded, but the stand-in never saw it "
                                     "asked (is the model the stand-in?)")
    for number, n in sorted(r.asked.items()):
        bound = 1 + r.kills_during[number]
        if n > bound:
            found.asked_again.append(f"run {rid}: turn {number} asked {n} times; at most {bound} (1 + "
                                     f"{r.kills_during[number]} kill(s) that landed during it)")
    for number, then in sorted(r.asked_when_recorded.items()):
        if r.asked.get(number, 0) > then:
            found.asked_again.append(f"run {rid}: turn {number} asked {r.asked[number]} times, {then} when it was "
                                     "seen recorded: asked again after its record")


def frontier(status: LoopStatus | None) -> tuple[int, bool] | None:
    """The run's next step to be recorded: (turn, True) for a turn, (turn, False) for a call of that turn;
    None once the run has its final answer (or has failed)."""
    if status is None:
        return 1, True
    if status["status"] != "running":
        return None
    last = 0
    for turn in status["turns"]:
        last = turn["turn"]
        if turn["status"] != "completed":
            return last, True
        if turn["final"]:
            return None
        if any(call["status"] != "completed" for call in turn["calls"]):
            return last, False
    return last + 1, True


def turns_during(before: LoopStatus | None, after: LoopStatus | None) -> range:
    """The turns a kill between two reads of one run may have landed during: from the first unrecorded turn
    before it to the turn of the next step after it (one read, with the run's process dead: both the same)."""
    start, end = frontier(before), frontier(after)
    if start is None:
        return range(0)
    low = start[0] if start[1] else start[0] + 1
    high = end[0] if end is not None else max((t["turn"] for t in _turns(after)), default=0)
    return range(low, high + 1)


# ---------------------------------------------------------------- one engine's session


@dataclass
class EngineReport:
    engine: str
    config: LoopChaosConfig
    runs: list[RunFacts] = field(default_factory=list)
    waves: int = 0
    kills: int = 0
    kills_during_turn: int = 0
    processes: int = 0
    faults_503: int = 0
    faults_lost: int = 0
    seconds: float = 0.0
    effects: int = 0
    findings: Findings = field(default_factory=Findings)
    error: str | None = None  # the session itself broke (a process would not start): a failure of its own

    @property
    def ok(self) -> bool:
        return self.error is None and self.findings.ok

    @property
    def turns(self) -> int:
        return sum(1 for r in self.runs for t in _turns(r.status) if t["status"] == "completed")

    @property
    def calls(self) -> int:
        return sum(1 for r in self.runs for _, c in _recorded_calls(r.status) if c["status"] == "completed")

    @property
    def reasked(self) -> int:
        """Turns asked more than once (each within its bound when the check passes)."""
        return sum(1 for r in self.runs for n in r.asked.values() if n > 1)


class Session:
    """One engine's chaos: the provider and the stand-in are up; ``play`` runs waves, kills, the drain. An
    engine's registration names its session (``Engine.loop_session``), made with the engine's row."""

    def __init__(self, registration: Engine, config: LoopChaosConfig, report: EngineReport, work: Path,
                 provider: ProviderProcess, standin_url: str, began: float) -> None:
        self.registration, self.engine = registration, registration.name
        self.config, self.report, self.work = config, report, work
        self.provider_url, self.standin_url = provider.url, standin_url
        self.rng = random.Random(f"{config.seed}/{self.engine}")
        self.began = began
        self.deadline = began + config.max_seconds
        self.nonce = uuid.uuid4().hex[:6]  # run ids unique on a reused dev server; the orders are the store's own
        self.facts: dict[str, RunFacts] = {}
        self.env = {"PROVIDER_URL": provider.url, "LLM_BASE_URL": standin_url, "LLM_MODEL": "scripted",
                    "MEMORY_DB": str(work / "memory.db"), "PYTHONUNBUFFERED": "1"}
        self.http = httpx.AsyncClient(timeout=10)

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def say(self, line: str) -> None:
        self.config.say(printable(f"  {time.monotonic() - self.began:6.1f} s  {self.engine}: {line}"))

    def plan_wave(self) -> list[PlannedRun]:
        """``--runs`` runs, each with 1-3 orders of its own (ids unique in this provider's store)."""
        wave = self.report.waves = self.report.waves + 1
        letter = self.registration.letter
        planned = []
        for i in range(self.config.runs):
            n = self.rng.randint(1, 3)
            orders = {f"{letter}-{wave}{i:03d}{j}": self.rng.randrange(500, 20_000, 5) for j in range(1, n + 1)}
            run = PlannedRun(f"loopchaos-{self.engine}-{self.config.seed}-{self.nonce}-w{wave}-{i:03d}",
                             TASKS[n - 1].format(*orders), f"customer{i}@example.com", orders)
            self.facts[run.run_id] = RunFacts(run)
            planned.append(run)
        return planned

    async def seed(self, planned: Sequence[PlannedRun]) -> None:
        async with ProviderClient(self.provider_url) as pc:
            for run in planned:
                for order, total in run.orders.items():
                    await pc.seed_order(order, total)

    async def counts(self) -> dict[str, dict[int, int]]:
        """The stand-in's count of every run's turns (``GET /v1/counts``)."""
        answer = (await self.http.get(f"{self.standin_url}/counts")).json()
        return {run: {int(t): n for t, n in found["turns"].items() if t.isdigit()}
                for run, found in answer["runs"].items()}

    def note_recorded(self, run_id: str, status: LoopStatus | None, counts: Mapping[str, dict[int, int]]) -> None:
        """Each turn ``status`` shows recorded, with its count now (read after the status) if first seen."""
        facts = self.facts[run_id]
        for turn in _turns(status):
            if turn["status"] == "completed" and turn["turn"] not in facts.asked_when_recorded:
                facts.asked_when_recorded[turn["turn"]] = counts.get(run_id, {}).get(turn["turn"], 0)

    async def play(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        await self.http.aclose()

    async def final_statuses(self, read: Callable[[str], Any], at_once: int) -> None:
        gate = asyncio.Semaphore(at_once)

        async def one(run_id: str) -> None:
            async with gate:
                try:
                    self.facts[run_id].status = await read(run_id)
                except Exception as err:  # noqa: BLE001 - a status that cannot be read fails the run's check
                    self.facts[run_id].status = {"run_id": run_id, "status": "failed", "turns": [], "answer": None,
                                                 "error": f"its status could not be read: {err}"[:300]}

        await asyncio.gather(*(one(r) for r in self.facts))


class TemporalSession(Session):
    """Workers on one task queue of a dev server (``TemporalDriver``), killed and replaced as ``lab.chaos``
    does: A always replaced, B the standby. The server is ``config.server``, else one of the session's own."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        server = self.config.server
        self.own_server = None if server is not None else DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        try:
            driver = driver_for(self.engine, self.env, server=server or self.own_server,
                                queue=f"loopchaos-{self.config.seed}-{self.nonce}")
        except BaseException:
            if self.own_server is not None:
                self.own_server.stop()
            raise
        assert isinstance(driver, TemporalDriver)  # a worker's queue, its slots: this session's own moves
        self.driver = driver
        self.slots: dict[str, Proc] = {}
        self.spawning: list[asyncio.Task[Proc]] = []
        self.open: set[str] = set()

    async def spawn(self, slot: str) -> None:
        name = f"worker-{slot}{len(self.spawning) + 1}"
        self.spawning.append(asyncio.create_task(self.driver.start_worker(name=name)))
        await asyncio.sleep(0)  # the driver spawns the process before it waits for its ready line
        self.slots[slot] = next(p for p in reversed(self.driver.procs) if p.name == name)

    def ready(self) -> dict[str, Proc]:
        return ready_workers(self.slots)

    async def statuses(self, run_ids: Iterable[str]) -> dict[str, LoopStatus | None]:
        ids = sorted(run_ids)
        found = await asyncio.gather(*(self.driver.loop_status(r) for r in ids))
        return dict(zip(ids, found, strict=True))

    async def observe_open(self) -> dict[str, LoopStatus | None]:
        """The open runs' statuses, then the stand-in's counts: the turns seen recorded noted; closed runs
        leave ``open``."""
        found = await self.statuses(self.open)
        counts = await self.counts()
        for run_id, status in found.items():
            self.note_recorded(run_id, status, counts)
            if status is not None and status["status"] != "running":
                self.open.discard(run_id)
        return found

    async def start_wave(self) -> None:
        planned = self.plan_wave()
        await self.seed(planned)
        await asyncio.gather(*(self.driver.submit_loop(r.run_id, r.task, r.email) for r in planned))
        self.open.update(r.run_id for r in planned)
        self.say(f"wave {self.report.waves}: {len(planned)} loop runs started at once on {self.driver.queue}")

    async def play(self) -> None:
        config, report = self.config, self.report
        await self.spawn("A")
        await wait_until(lambda: self.ready().get("A"), 60, "loop chaos: worker A to be ready")
        await self.start_wave()
        async with ProviderClient(self.provider_url) as pc:
            while report.kills < config.kills and time.monotonic() < self.deadline:
                await wait_until(self.ready, self.left(), "loop chaos: a ready worker")
                await asyncio.sleep(self.rng.uniform(*config.kill_gap))
                await inject_faults(pc, self.rng, report)
                if wants_standby(self.slots, self.rng):
                    await self.spawn("B")
                ready = self.ready()
                if ready:
                    await self.kill_one(ready)
            await clear_faults(pc, report)
        if "A" not in self.slots or not self.slots["A"].alive():
            await self.spawn("A")

        async def all_closed() -> bool:
            await self.observe_open()
            return not self.open

        try:
            await wait_until(all_closed, self.left(), "loop chaos: every run to stop running", interval=0.5)
        except TimeoutError:
            pass  # the checks say which, run by run
        await self.final_statuses(self.driver.loop_status, at_once=8)
        counts = await self.counts()
        for run_id, facts in self.facts.items():
            self.note_recorded(run_id, facts.status, counts)
            facts.asked = counts.get(run_id, {})
        await terminate_open(await self.driver.client(), self.open, "loop chaos: --max-seconds reached")

    async def kill_one(self, ready: dict[str, Proc]) -> None:
        report = self.report
        slot = self.rng.choice(sorted(ready))
        before = await self.observe_open()
        if not self.open:  # everything finished before enough kills landed mid-run
            await self.start_wave()
            before = await self.observe_open()
        ready[slot].kill()
        report.kills += 1
        after = await self.observe_open()
        during = 0
        for run_id in before:
            turns = turns_during(before[run_id], after.get(run_id, before[run_id]))
            self.facts[run_id].kills_during.update(turns)
            during += bool(turns)
        report.kills_during_turn += bool(during)
        self.say(f"SIGKILL worker {slot} (pid {ready[slot].pid}): kill {report.kills}/{self.config.kills}, "
                 f"{len(ready)} worker(s) ready, {len(before)} runs open, {during} of them in a model turn")
        if replaces(slot, self.rng):
            await self.spawn(slot)
        else:
            del self.slots[slot]

    async def close(self) -> None:
        try:
            self.driver.close()
            await asyncio.gather(*self.spawning, return_exceptions=True)
            self.report.processes = sum(1 for p in self.driver.procs if p.argv[1:2] == ["worker.py"])
            await super().close()
        finally:
            if self.own_server is not None:  # the session's own server outlives nothing of it
                self.own_server.stop()


class ProcessSession(Session):
    """An engine whose CLI runs one run in one process (the run record, DBOS): a process per run, at most
    ``--parallel`` at once; a killed one is resumed once the kill has been observed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.drivers: dict[str, EngineDriver] = {}
        self.current: dict[str, Proc] = {}  # run id -> the process running it now
        self.held: dict[str, asyncio.Event] = {}  # run id -> set once its kill was observed
        self.killed: Counter[str] = Counter()  # run id -> kills landed on its processes
        self.tasks: list[asyncio.Task[None]] = []
        self.gate = asyncio.Semaphore(self.config.parallel)

    def driver_of(self, run_id: str) -> EngineDriver:
        """The driver of the run's process: one for every run, on one record file of the session's."""
        if "all" not in self.drivers:
            self.drivers["all"] = driver_for(self.engine, self.env)
        return self.drivers["all"]

    def start_wave(self) -> None:
        planned = self.plan_wave()
        self.tasks += [asyncio.create_task(self.drive(r), name=r.run_id) for r in planned]
        self.say(f"wave {self.report.waves}: {len(planned)} loop runs, a process each, {self.config.parallel} "
                 "at a time")

    async def drive(self, run: PlannedRun) -> None:
        """Start the run's process; each time it dies by SIGKILL, wait for the kill to be observed, then
        ``resume``, until a process ends otherwise (its exit code; the status says the rest)."""
        await self.seed([run])
        driver = self.driver_of(run.run_id)
        async with self.gate:
            proc = await driver.start_loop(run.run_id, run.task, run.email)
            self.current[run.run_id] = proc
            code = await driver.exit_code(proc, self.left())
            resumes = 0
            while code == -signal.SIGKILL:
                if run.run_id in self.held:
                    await self.held[run.run_id].wait()
                resumes += 1
                name = f"{self.engine}-resume{resumes}-{run.run_id}"
                settling = asyncio.create_task(driver.resume(run.run_id, name=name, timeout=self.left()))
                await asyncio.sleep(0)  # the driver spawns the process before it waits for it
                self.current[run.run_id] = next(p for p in reversed(driver.procs) if p.name == name)
                settled = await settling
                code = settled.code if settled.code is not None else 0
            self.current.pop(run.run_id, None)

    def candidates(self) -> list[str]:
        """Runs whose process is alive and has begun a step (past its start-up: mid-run), killed fewer than
        ``KILLS_PER_RUN`` times."""
        return sorted(r for r, p in self.current.items()
                      if p.alive() and started_steps(p) and (r not in self.held or self.held[r].is_set())
                      and self.killed[r] < KILLS_PER_RUN)

    async def play(self) -> None:
        config, report = self.config, self.report
        self.start_wave()
        async with ProviderClient(self.provider_url) as pc:
            while report.kills < config.kills and time.monotonic() < self.deadline:
                await asyncio.sleep(self.rng.uniform(*config.kill_gap))
                await inject_faults(pc, self.rng, report)
                if sum(not t.done() for t in self.tasks) < config.parallel:
                    self.start_wave()  # the pool would run short of runs to kill: the next wave joins it
                runs = self.candidates()
                if runs:
                    await self.kill_one(self.rng.choice(runs))
            await clear_faults(pc, report)
        try:
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), self.left())
        except TimeoutError:
            pass  # the checks say which, run by run
        for driver in {id(d): d for d in self.drivers.values()}.values():
            driver.close()  # --max-seconds reached: whatever still runs is killed, and its run not completed
        await self.final_statuses(lambda r: self.driver_of(r).loop_status(r), at_once=3)
        counts = await self.counts()
        for run_id, facts in self.facts.items():
            facts.asked = counts.get(run_id, {})

    async def kill_one(self, run_id: str) -> None:
        report, proc = self.report, self.current[run_id]
        self.held[run_id] = asyncio.Event()
        try:
            proc.kill()
            if proc.popen.returncode != -signal.SIGKILL:
                return  # it ended on its own just before
            # The process is dead and the resume waits: the record holds what the process left, and the turn
            # in flight (if any) is the next step to be recorded.
            status = await self.driver_of(run_id).loop_status(run_id)
            self.note_recorded(run_id, status, await self.counts())
            at = frontier(status)
            if at is None:  # its run had its answer recorded: the process was on its way out, not mid-run
                self.say(f"SIGKILL {proc.name} (pid {proc.pid}) after its run's last step: not counted")
                return
            report.kills += 1
            self.killed[run_id] += 1
            turns = turns_during(status, status)
            self.facts[run_id].kills_during.update(turns)
            report.kills_during_turn += bool(turns)
            where = f"in turn {at[0]}" if at[1] else f"in a tool call of turn {at[0]}"
            self.say(f"SIGKILL {proc.name} (pid {proc.pid}) {where}: kill {report.kills}/{self.config.kills}")
        finally:
            self.held[run_id].set()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        drivers = {id(d): d for d in self.drivers.values()}.values()
        for driver in drivers:
            driver.close()
        self.report.processes = sum(len(d.procs) for d in drivers)
        await super().close()


class RunRecordSession(ProcessSession):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.env["RUNRECORD_DB"] = str(self.work / "runrecord.db")


class DbosSession(ProcessSession):
    def driver_of(self, run_id: str) -> EngineDriver:
        """A database per run (the module docstring: DBOS's launch recovers every pending run in its database)."""
        if run_id not in self.drivers:
            (self.work / "dbos").mkdir(exist_ok=True)
            db = (self.config.dbos_database(run_id) if self.config.dbos_database is not None
                  else str(self.work / "dbos" / f"{run_id}.db"))
            self.drivers[run_id] = driver_for(self.engine, {**self.env, "DBOSFLOW_DB": db})
        return self.drivers[run_id]


async def provider_state(url: str) -> ProviderState:
    """The provider's bookkeeping per key and every effect it applied, from its own store."""
    effects = await asyncio.to_thread(fetch_effects, url)
    applied: dict[str, list[dict[str, Any]]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for kind, (path, table, _) in ITEMS.items():
            applied[kind] = list((await http.get(path)).json()[table])
    return ProviderState(effects, applied)


async def run_engine(engine: str, config: LoopChaosConfig) -> EngineReport:
    """One engine's session (the module docstring), checked; every process it started is stopped.
    ``registry.UnknownEngine`` for an engine that is not registered or runs no loop, before anything starts."""
    make: type[Session] = registry.session_class(engine)
    report = EngineReport(engine, config)
    began = time.monotonic()
    tmp = tempfile.TemporaryDirectory(prefix=f"loop-chaos-{engine}-", dir=config.workdir)
    work = Path(tmp.name)
    provider = None
    standin = None
    session: Session | None = None
    try:
        provider = start_provider(work / "provider.db")
        standin, standin_url = start_model_standin(vary=config.vary, delay=config.model_delay)
        session = make(registry.engine(engine), config, report, work, provider, standin_url, began)
        session.say(f"seed {config.seed}, {config.runs} runs a wave, {config.kills} kills, "
                    f"{model_words(config.vary)} ({config.model_delay:g} s a turn)")
        try:
            await session.play()
        finally:
            await session.close()
        report.runs = list(session.facts.values())
        state = await provider_state(provider.url)
        report.effects = sum(e.effects_applied for e in state.effects)
        report.findings = check(report.runs, state)
    except Exception as err:  # noqa: BLE001 - the session broke: say so in the report, stop what it started
        report.error = f"{type(err).__name__}: {err}"[:2000]
        if session is not None:
            report.runs = list(session.facts.values())
    finally:
        report.seconds = time.monotonic() - began
        if standin is not None:
            standin.kill()
        if provider is not None:
            provider.kill()
        tmp.cleanup()
    return report


async def run_loop_chaos(config: LoopChaosConfig) -> list[EngineReport]:
    """Each engine of ``config.engines`` in turn."""
    return [await run_engine(engine, config) for engine in config.engines]


# ---------------------------------------------------------------- the summary


COLUMNS = ("engine", "runs", "turns", "tool calls", "kills (in a turn)", "faults (503/lost)", "failed", "duplicate",
           "lost", "re-asked", "asked again", "seconds")


def table(reports: Sequence[EngineReport]) -> list[str]:
    rows = [COLUMNS]
    for r in reports:
        f = r.findings
        rows.append((r.engine, str(len(r.runs)), str(r.turns), str(r.calls), f"{r.kills} ({r.kills_during_turn})",
                     f"{r.faults_503 + r.faults_lost} ({r.faults_503}/{r.faults_lost})", str(len(f.failed)),
                     str(len(f.duplicate)), str(len(f.lost)), str(r.reasked), str(len(f.asked_again)),
                     f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return lines


def summary(reports: Sequence[EngineReport]) -> str:
    config = reports[0].config if reports else LoopChaosConfig()
    lines = [f"loop chaos: seed {config.seed}, {config.runs} runs a wave, {config.kills} kills per engine, "
             f"{model_words(config.vary)} ({config.model_delay:g} s a turn), {os.cpu_count()} cores",
             *table(reports)]
    for r in reports:
        if r.error:
            lines.append(f"  FAIL  {r.engine}: the session broke: {r.error}")
        for check_name in CHECKS:
            found = r.findings.of(check_name)
            lines.append(f"  {'FAIL' if found else 'PASS'}  {r.engine}: {CHECK_NAMES[check_name]}")
            lines += [f"          {line}" for line in found[:10]]
            if len(found) > 10:
                lines.append(f"          ... and {len(found) - 10} more")
    return "\n".join(printable(line) for line in lines)  # failures quote run data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.loop_chaos", description=__doc__.splitlines()[0])
    looping = registry.names(loop=True)
    parser.add_argument("--engine", choices=[*looping, "all"], default="all", help="default all, one after another")
    parser.add_argument("--runs", type=int, default=20, help="loop runs a wave (default 20)")
    parser.add_argument("--kills", type=int, default=10,
                        help="SIGKILLs of a process running a run, per engine (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="the bound on each engine's session")
    parser.add_argument("--vary", action=argparse.BooleanOptionalAction, default=True,
                        help="a model that words every answer differently, with random call ids (default; "
                             "--no-vary: the deterministic stand-in)")
    parser.add_argument("--model-delay", type=float, default=0.3, help="seconds the stand-in takes per turn")
    parser.add_argument("--parallel", type=int, default=6, help="run record and DBOS: run processes at once")
    parser.add_argument("--dbos-on", choices=("sqlite", "postgres"), default="sqlite",
                        help="DBOS's system databases: SQLite files (default), or PostgreSQL, Debian's server started "
                             "and stopped by this command (lab.postgres)")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= MOST_RUNS or args.kills < 0 or args.max_seconds <= 0 or args.parallel < 1 or not (
            0 <= args.model_delay <= 60):
        parser.error(f"give --runs 1-{MOST_RUNS}, --kills >= 0, --max-seconds > 0, --parallel >= 1 and "
                     "--model-delay 0-60 (seconds)")
    engines = looping if args.engine == "all" else (args.engine,)
    config = LoopChaosConfig(engines=engines, runs=args.runs, kills=args.kills, seed=args.seed,
                             max_seconds=args.max_seconds, vary=args.vary, model_delay=args.model_delay,
                             parallel=args.parallel)
    if args.dbos_on == "postgres" and any(registry.engine(e).on_postgres for e in engines):
        return _on_postgres(config)
    reports = asyncio.run(run_loop_chaos(config))
    print(summary(reports), flush=True)
    return 0 if all(r.ok for r in reports) else 1


def _on_postgres(config: LoopChaosConfig) -> int:
    """The session with DBOS's databases on PostgreSQL: a server of this command's own (``lab.postgres``, a
    fresh data directory from ``scratch_dir``, removed at the end), a database per run, as the SQLite files
    are."""
    import dataclasses
    import shutil

    from lab.postgres import Postgres, database_name, scratch_dir

    scratch = scratch_dir("loop-chaos-postgres-")
    try:
        with Postgres(scratch / "data") as server:
            config = dataclasses.replace(config, dbos_database=lambda run_id: server.url(database_name("lc", run_id)))
            reports = asyncio.run(run_loop_chaos(config))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(summary(reports), flush=True)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    os.environ.pop("CRASH_AT", None)  # the drivers arm nothing; one inherited would arm every process
    exit_now(main())
