"""Chaos: many concurrent runs on Temporal while workers are SIGKILLed at
random moments and the provider fails and loses responses; then check that
no effect was duplicated or lost.

    .venv/bin/python -m lab.chaos [--runs 50] [--kills 10] [--seed 1] [--max-seconds 300] [--vary]
    make chaos

What it does, all seeded (``--seed``) and bounded (``--max-seconds``; it stops
by itself and kills every process it started):

1. starts a dev server (in memory; or uses ``--temporal-address``), a provider
   on a temporary store, and worker A, then starts ``--runs`` runs at once (a
   wave; when a wave has closed before the kills are done, another starts);
2. the kill phase: 0.5-2.5 s (random) after some worker is ready it
   SIGKILLs a random ready worker and starts its replacement at once, until
   ``--kills`` kills have landed while runs were in flight. A second worker B on the same task queue comes
   and goes (started with probability 0.6 when absent, replaced after a kill
   with probability 0.6), so part of the time two workers share the queue. At random it tells
   the provider (``POST /admin/faults``) to answer the next 1-3 effect requests
   with 503, or to apply the next 1-2 and then lose the response (503);
3. the drain: faults cleared, one worker left, until every run is closed;
4. the checks, from Temporal's history and the provider's own store: every
   run completed (a worker's death is not the step's fault, and a provider
   fault is ridden out: none may fail); no duplicate effect (per run at most
   one effect of each effect step, the email and the ticket, each under the
   run's own key: ``durable_agents.steps.plan.KIND_OF_STEP``); no lost effect (every
   completed run has each effect applied, with the ids its history recorded,
   adopted ones included, and every id an applied request cites, the ticket's
   email, is one the run recorded).

``--vary`` gives the workers a model that words every answer differently
(``LLM_OFFLINE_VARY=1``): a draft run again after a kill differs from the
first, as with a real model.

Steps are paced (``--pace``, LAB_STEP_SECONDS, default 1 s) so that runs are
in flight when the kills land. The exit code is 0 only if every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from temporalio.client import Client

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.status import run_status
from durable_agents.providerclient import ProviderClient, fetch_effects
from durable_agents.steps.controls import printable
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.plan import KIND_OF_STEP, STEP_NAMES
from durable_agents.steps.runstate import RunEntry, result_fields
from durable_agents.steps.settle import made_ids
from lab.chaos_moves import (
    clear_faults,
    inject_faults,
    model_words,
    ready_workers,
    replaces,
    terminate_open,
    wants_standby,
)
from lab.processes import LAB_SERVER_CONFIG, REPO, DevServer, Proc, wait_until
from lab.provider_process import start_provider

TASKS = [
    "Confirm the refund for order {n}",
    "Tell the customer their replacement for order {n} has shipped",
    "Confirm the address change on account {n}",
]


@dataclass
class ChaosConfig:
    runs: int = 50
    kills: int = 10
    seed: int = 1
    max_seconds: float = 300.0
    pace: float = 1.0
    temporal_address: str | None = None  # None: start a dev server of our own
    workdir: Path | None = None  # None: a temporary directory
    echo: bool = False
    vary: bool = False  # LLM_OFFLINE_VARY=1 for the workers
    say: Callable[[str], object] = print


@dataclass
class ChaosReport:
    config: ChaosConfig
    task_queue: str = ""
    duration: float = 0.0
    kill_phase: float = 0.0
    runs: dict[str, RunEntry] = field(default_factory=dict)  # run id -> final status
    waves: int = 0
    kills: int = 0
    kills_with_two_workers: int = 0
    kills_with_runs_in_flight: int = 0
    workers_started: int = 0
    faults_503: int = 0
    faults_lost: int = 0
    retries: Counter = field(default_factory=Counter)
    crashes: Counter = field(default_factory=Counter)
    adopted: int = 0
    requests: int = 0
    effects_applied: int = 0
    applied: Counter = field(default_factory=Counter)  # kind of effect -> how many the provider applied
    failures: list[str] = field(default_factory=list)  # check failures, human readable

    @property
    def ok(self) -> bool:
        return not self.failures

    def by_status(self) -> Counter:
        return Counter(s["status"] for s in self.runs.values())

    def summary(self) -> str:
        c = self.config
        st = self.by_status()
        reasons = Counter(s["error"] for s in self.runs.values() if s["status"] == "failed")
        lines = [
            f"chaos: seed {c.seed}, task queue {self.task_queue}, {os.cpu_count()} cores, pace {c.pace:g} s/step, "
            f"{model_words(c.vary)}",
            f"  duration     {self.duration:.1f} s (kill phase {self.kill_phase:.1f} s, "
            f"drain {self.duration - self.kill_phase:.1f} s)",
            f"  runs         {len(self.runs)} in {self.waves} wave(s) of {c.runs} started at once: "
            f"{st['completed']} completed, {st['failed']} failed, "
            f"{st['running']} still open",
            *(f"    failed: {n} x {reason}" for reason, n in reasons.items()),
            f"  kills        {self.kills} SIGKILLs of a ready worker ({self.kills_with_two_workers} while two workers "
            f"shared the queue, {self.kills_with_runs_in_flight} with runs in flight); {self.workers_started} worker "
            "processes started",
            f"  faults       {self.faults_503} requests answered 503, "
            f"{self.faults_lost} applied with the response lost",
            f"  retries      {sum(self.retries.values())} attempts beyond the first ("
            + ", ".join(f"{s} {self.retries[s]}" for s in STEP_NAMES) + f"), {sum(self.crashes.values())} of them "
            f"after a worker died; {self.adopted} step(s) adopted an effect their run had applied",
            f"  provider     {self.requests} effect requests, {self.effects_applied} effects applied ("
            + ", ".join(f"{n} {kind}s" for kind, n in self.applied.items()) + ")",
        ]
        checks = ["every run completed", "no duplicate effect", "no lost effect"]
        failed_checks = {f.split(":", 1)[0] for f in self.failures}
        for name in checks:
            lines.append(f"  {'FAIL' if name in failed_checks else 'PASS'}  {name}")
        for failure in self.failures[:20]:
            lines.append(f"    {failure}")
        return "\n".join(printable(line) for line in lines)  # failure reasons are run data


class _Workers:
    """Worker processes in named slots; every one ever started is reaped at the end."""

    def __init__(self, address: str, provider_url: str, queue: str, env: dict[str, str], echo: bool) -> None:
        self.env = {
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": "default",
            "TASK_QUEUE": queue,
            "PROVIDER_URL": provider_url,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.echo = echo
        self.slots: dict[str, Proc] = {}
        self.all: list[Proc] = []

    def spawn(self, slot: str) -> Proc:
        proc = Proc(f"worker-{slot}{len(self.all) + 1}", [sys.executable, "worker.py"], env=self.env,
                    cwd=REPO, echo=self.echo)
        self.slots[slot] = proc
        self.all.append(proc)
        return proc

    def ready(self) -> dict[str, Proc]:
        return ready_workers(self.slots)

    def reap(self) -> None:
        for proc in self.all:
            proc.kill()


async def _wait(check, timeout: float, what: str, interval: float = 0.1):
    return await wait_until(check, timeout, f"chaos: {what}", interval)


class _Chaos:
    """One chaos session against a running server, provider and worker A: its
    waves of runs, the kill phase, the drain. Every random choice is drawn from
    ``rng``, seeded by ``--seed``."""

    def __init__(self, config: ChaosConfig, report: ChaosReport, client: Client, workers: _Workers,
                 began: float) -> None:
        self.config, self.report, self.client, self.workers = config, report, client, workers
        self.say = config.say
        self.rng = random.Random(config.seed)
        self.began = began
        self.deadline = began + config.max_seconds
        self.run_ids: list[str] = []
        self.open_runs: set[str] = set()

    def _left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    async def start_wave(self) -> None:
        """``--runs`` runs started at once, each with its own task and address."""
        from durable_agents.flowclient.runs import start_run  # the starter's own start: id policies, timeouts

        config, report = self.config, self.report
        wave = report.waves = report.waves + 1
        ids = [f"chaos-{config.seed}-w{wave}-{i:03d}-{uuid.uuid4().hex[:6]}" for i in range(config.runs)]
        await asyncio.gather(*(
            start_run(self.client, rid, TASKS[i % len(TASKS)].format(n=1000 * wave + i), f"user{i}@example.com",
                      queue=report.task_queue)
            for i, rid in enumerate(ids)
        ))
        self.run_ids.extend(ids)
        self.open_runs.update(ids)
        self.say(f"  {time.monotonic() - self.began:6.1f} s  wave {wave}: {config.runs} runs started at once "
                 f"on {report.task_queue}")

    async def refresh_open(self) -> None:
        for rid in list(self.open_runs):
            desc = await self.client.get_workflow_handle(rid).describe()
            if desc.status is not None and desc.status.name != "RUNNING":
                self.open_runs.discard(rid)

    async def kill_phase(self, pc: ProviderClient) -> None:
        """Kill a ready worker every 0.5-2.5 s, with provider faults on the way, until
        ``--kills`` kills have landed while runs were in flight (or the deadline)."""
        report, workers = self.report, self.workers
        while report.kills_with_runs_in_flight < self.config.kills and time.monotonic() < self.deadline:
            # A worker lives at least this long after some worker is ready: kills
            # faster than a step can finish would only prove the retry bound.
            await _wait(workers.ready, self._left(), "a ready worker")
            await asyncio.sleep(self.rng.uniform(0.5, 2.5))
            await inject_faults(pc, self.rng, report)
            if wants_standby(workers.slots, self.rng):
                workers.spawn("B")
            ready = workers.ready()
            if ready:
                await self.kill_one(ready)
        report.kill_phase = time.monotonic() - self.began

    async def kill_one(self, ready: dict[str, Proc]) -> None:
        """SIGKILL one of the ready workers; replace it at once (worker A always, B mostly)."""
        report, workers = self.report, self.workers
        slot = self.rng.choice(sorted(ready))
        await self.refresh_open()
        if not self.open_runs:  # everything finished before enough kills landed mid-run
            await self.start_wave()
        report.kills_with_two_workers += len(ready) >= 2
        report.kills_with_runs_in_flight += bool(self.open_runs)
        ready[slot].kill()
        report.kills += 1
        self.say(f"  {time.monotonic() - self.began:6.1f} s  SIGKILL worker {slot} (pid {ready[slot].pid}): "
                 f"kill {report.kills_with_runs_in_flight}/{self.config.kills} mid-run, {len(ready)} worker(s) "
                 f"ready, {len(self.open_runs)} runs open")
        if replaces(slot, self.rng):
            workers.spawn(slot)
        else:
            del workers.slots[slot]

    async def drain(self) -> None:
        """Worker A back if it is gone, then wait for every run to close (or the deadline)."""
        if "A" not in self.workers.slots or not self.workers.slots["A"].alive():
            self.workers.spawn("A")

        async def all_closed():
            await self.refresh_open()
            return not self.open_runs

        try:
            await _wait(all_closed, self._left(), "every run to close", interval=0.5)
        except TimeoutError:
            pass  # reported by the checks, run by run

    async def collect(self) -> None:
        """Every run's final status; what is still open is ended (bounded), and the checks say so."""
        for rid in self.run_ids:
            self.report.runs[rid] = await run_status(self.client, rid)
        await terminate_open(self.client, self.open_runs, "chaos: --max-seconds reached")


async def run_chaos(config: ChaosConfig) -> ChaosReport:
    """Start what the session needs, play it (waves, kill phase, drain), check it,
    and stop every process it started, whatever happens."""
    report = ChaosReport(config=config, task_queue=f"chaos-{config.seed}-{uuid.uuid4().hex[:8]}")
    began = time.monotonic()
    tmp = tempfile.TemporaryDirectory(prefix="chaos-", dir=config.workdir)
    work = Path(tmp.name)
    server = None
    provider = None
    workers = None
    try:
        if config.temporal_address is None:
            server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
            address = server.address
        else:
            address = config.temporal_address
        provider = start_provider(work / "provider.db")
        url = provider.url
        workers = _Workers(address, url, report.task_queue,
                           {"MEMORY_DB": str(work / "memory.db"), "LAB_STEP_SECONDS": str(config.pace),
                            "LLM_OFFLINE_VARY": "1" if config.vary else "0"}, config.echo)
        client = await connect({**os.environ, "TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": "default"})
        workers.spawn("A")
        await _wait(lambda: workers.ready().get("A"), 60, "worker A to be ready")

        chaos = _Chaos(config, report, client, workers, began)
        config.say(f"chaos: seed {config.seed}; {config.kills} SIGKILLs of a worker while runs are in flight")
        await chaos.start_wave()
        async with ProviderClient(url) as pc:
            await chaos.kill_phase(pc)
            await clear_faults(pc, report)
        await chaos.drain()
        await chaos.collect()
        _check(report, url)
        report.workers_started = len(workers.all)
    finally:
        report.duration = time.monotonic() - began
        if workers is not None:
            workers.reap()
        if provider is not None:
            provider.kill()
        if server is not None:
            server.stop()
        tmp.cleanup()
    return report


def _check(report: ChaosReport, url: str) -> None:
    """Checks that can fail. (The provider's UNIQUE constraint already makes two
    effects under one key impossible; what a bug could do is send under another
    key, or lose one: that is what is counted here.)"""
    fail = report.failures.append
    for rid, s in report.runs.items():
        for entry in s["steps"]:
            report.retries[entry["name"]] += max(0, entry["attempts"] - 1)
            report.crashes[entry["name"]] += entry.get("crashes") or 0
            report.adopted += entry["status"] == "adopted"
        if s["status"] != "completed":
            fail(f"every run completed: {rid} is {s['status']}: {s.get('error') or s.get('detail')}")

    effects = fetch_effects(url)
    report.requests = sum(e.requests for e in effects)
    report.effects_applied = sum(e.effects_applied for e in effects)
    by_key = {e.key: e for e in effects}

    for step, kind in KIND_OF_STEP.items():
        report.applied[kind] += sum(e.effects_applied for e in effects if e.kind == kind)
        mine = [e for e in effects if e.kind == kind and e.effects_applied]
        for run, n in Counter(effect.run_id for effect in mine).items():
            if n > 1:
                fail(f"no duplicate effect: run {run} has {n} {kind}s")
        for effect in mine:
            if effect.run_id is None or effect.key != idempotency_key(effect.run_id, step):
                fail(f"no duplicate effect: a {kind} of run {effect.run_id} went out under key {effect.key}")
            if effect.run_id not in report.runs:
                fail(f"no duplicate effect: a {kind} for unknown run {effect.run_id}")

    import httpx

    with httpx.Client(base_url=url, timeout=10) as http:
        for rid, s in report.runs.items():
            if s["status"] != "completed":
                continue
            results = {entry["name"]: result_fields(entry) for entry in s["steps"]}
            recorded_ids = {v for fields in results.values() for k, v in fields.items()
                            if k.endswith("_id") and isinstance(v, str)}
            for step, kind in KIND_OF_STEP.items():
                key = idempotency_key(rid, step)
                found = by_key.get(key)
                if found is None or found.effects_applied != 1:
                    fail(f"no lost effect: completed run {rid} has {step} applied "
                         f"{0 if found is None else found.effects_applied} times")
                    continue
                held = http.get(f"/v1/requests/{quote(key, safe='')}").json()
                made = made_ids(held.get("response") or {}, held.get("request") or {})
                for name, value in made.items():
                    if results.get(step, {}).get(name) != value:
                        fail(f"no lost effect: run {rid} recorded {kind} {name} {results.get(step, {}).get(name)}, "
                             f"the provider holds {value}")
                for name, value in (held.get("request") or {}).items():
                    if name.endswith("_id") and name != "run_id" and value not in recorded_ids:
                        fail(f"no lost effect: run {rid}'s {kind} cites {name} {value}, which the run never "
                             "recorded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs started at once (default 50)")
    parser.add_argument("--kills", type=int, default=10,
                        help="SIGKILLs of a worker while runs are in flight (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="hard bound on the whole thing")
    parser.add_argument("--pace", type=float, default=1.0, help="LAB_STEP_SECONDS for the workers")
    parser.add_argument("--temporal-address", default=None, help="use this server instead of starting a dev server")
    parser.add_argument("--echo", action="store_true", help="show the workers' output")
    parser.add_argument("--vary", action="store_true",
                        help="a model that words every answer differently (LLM_OFFLINE_VARY=1)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.kills < 0 or args.max_seconds <= 0 or args.pace < 0:
        parser.error("--runs >= 1, --kills >= 0, --max-seconds > 0 and --pace >= 0")
    config = ChaosConfig(runs=args.runs, kills=args.kills, seed=args.seed, max_seconds=args.max_seconds,
                         pace=args.pace, temporal_address=args.temporal_address, echo=args.echo, vary=args.vary)
    report = asyncio.run(run_chaos(config))
    print(report.summary(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
