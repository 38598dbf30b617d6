"""Power cuts on every engine: what survives when writes never synced are lost.

    .venv/bin/python -m lab.powercut_matrix                      # everything (make powercut)
    .venv/bin/python -m lab.powercut_matrix --engines runrecord --points email --dirs strict

One case = one engine, one placement, one cut point, one directory rule, one
sync level, on a fresh ``lab.powercut`` mount (root, ``/dev/fuse``, fuse3):

1. The provider starts (its store on the mount or off it, by placement), the
   engine's processes start with their files on the mount, and a warm-up run
   completes; then the whole tree is synced, so the set-up is not what a cut
   loses.
2. The case's run starts with ``CRASH_AT`` at the cut point; the crash point
   stops the engine's process there (so nothing keeps writing). What was
   acknowledged by then is noted: the start, every step the engine reported
   completed (its ``completed`` lines; Temporal: its history), every effect the
   provider answered 200 for, and, at the memory point, the exchange memory
   committed.
3. The power cut (``PowerCut.cut``): the engine's processes, and the provider
   when it shares the machine, are SIGKILLed and reaped, the mount is
   unmounted, everything unsynced is dropped, the mount comes back.
4. Power back: the provider restarts on its store and port; its effects are
   compared with those it had answered for. The run is looked up, then
   resumed (a fresh worker, ``runrecord resume``, ``dbosflow resume``) and
   followed to its end.

Placements: ``worker`` (only the worker's machine loses power: the provider,
the external API, keeps its store off the mount and keeps running) and
``laptop`` (everything on one machine loses power). Cut points: ``start``
(right after the start is acknowledged), ``email`` (the provider applied the
email, the engine has not recorded it), ``between`` (step 2 recorded, step 3
not begun), ``memory`` (the run is done and memory has committed its
exchange, still open). Sync levels: the run record's ``FULL`` (its default)
and ``NORMAL``; the dev server's SQLite at its default (``FULL``, rollback
journal) and ``EXTRA`` (``--sqlite-pragma synchronous=EXTRA``); DBOS's SQLite
system database at its default. The provider's store is always ``FULL``;
memory always its default ``NORMAL``.

The outcome of a case: did the run complete, how many times each effect was
applied, and which acknowledged writes were lost. Only the project's own
stores are promised anything, and only at their defaults: the run record at
``FULL`` and the provider lose nothing acknowledged and every run completes
with each effect once; memory may lose its last exchange. ``--check`` (and
the tests) hold those; the engines we do not own are measured and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flowclient.connect import connect
from flowclient.runs import start_run
from flowclient.status import TemporalRunNotFound, run_status
from lab.powercut import CutReport, PowerCut
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc, start_worker, wait_until
from lab.provider_process import ProviderProcess, start_provider
from memory import open_store
from providerclient import fetch_effects
from steps.flow import exchange_message_ids
from steps.keys import idempotency_key
from steps.plan import EFFECT_STEPS, STEP_NAMES

ENGINES = ("runrecord", "temporal", "dbos")
PLACEMENTS = ("worker", "laptop")
POINTS = ("start", "email", "between", "memory")
DIR_RULES = ("lenient", "strict")
SYNC_LEVELS = {"runrecord": ("FULL", "NORMAL"), "temporal": ("FULL", "EXTRA"), "dbos": ("default",)}
DEFAULT_SYNC = {"runrecord": "FULL", "temporal": "FULL", "dbos": "default"}

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
RUN_TIMEOUT = 90.0
_COMPLETED = re.compile(r"\b(\w+): (?:completed|adopted) \(attempt \d+\)")


def crash_at(engine: str, point: str) -> str:
    """The crash point that stops the engine's process at a cut point ("" for Temporal's start: no
    worker runs, and the cut follows the server's answer to the start at once)."""
    return {
        "start": {"runrecord": "runrecord:draft:after_start", "temporal": "", "dbos": "draft:before"}[engine],
        "email": "send_confirmation:after_effect",
        "between": f"{engine}:send_confirmation:after_record",
        "memory": "memory:after_append",
    }[point]


@dataclass(frozen=True)
class Case:
    engine: str
    placement: str
    point: str
    dirs: str
    sync: str

    @property
    def own_default(self) -> bool:
        """The run record at its default level: the configuration the lab promises things for."""
        return self.engine == "runrecord" and self.sync == DEFAULT_SYNC["runrecord"]

    def label(self) -> str:
        return f"{self.engine}/{self.placement}/{self.point}/{self.dirs}/{self.sync}"


@dataclass
class Outcome:
    case: Case
    completed: bool = False
    final_status: str = "?"
    applied: dict[str, int] = field(default_factory=dict)  # step -> effects applied at the end
    lost: list[str] = field(default_factory=list)  # acknowledged writes the cut lost
    executed_again: list[str] = field(default_factory=list)  # steps acknowledged completed that ran again
    cut: CutReport | None = None
    seconds: float = 0.0
    error: str | None = None

    def effects_once(self) -> bool:
        return all(self.applied.get(s) == 1 for s in EFFECT_STEPS)

    def broken(self) -> list[str]:
        """What breaks the lab's promise for its own stores (empty when kept, or when nothing is promised)."""
        if self.error:
            return [self.error]
        problems = [f"the provider lost {x}" for x in self.lost if x.startswith("the provider's")]
        if self.case.own_default:
            problems += [x for x in self.lost if not x.startswith("memory")]
            if not self.completed:
                problems.append(f"the run ended {self.final_status}")
            if not self.effects_once():
                problems.append(f"effects applied {self.applied}")
        return problems

    def row(self) -> dict[str, str]:
        applied = ", ".join(str(self.applied.get(s, 0)) for s in EFFECT_STEPS)
        return {
            "engine": self.case.engine, "placement": self.case.placement, "cut point": self.case.point,
            "dirs": self.case.dirs, "sync": self.case.sync,
            "completed": "yes" if self.completed else f"no ({self.final_status})",
            "effects (email, ticket)": applied,
            "acknowledged writes lost": "; ".join(self.lost) or "none",
            "the cut dropped": (f"{self.cut.lost_files} files' unsynced data, {self.cut.entries} entries"
                                if self.cut else "-"),
            "check": ("BROKEN: " + "; ".join(self.broken())) if self.broken() else
                     ("kept" if self.case.own_default else "measured"),
        }


# ---------------------------------------------------------------- one case


class _Case:
    """The processes and files of one case; everything started is killed at the end."""

    def __init__(self, case: Case, work: Path) -> None:
        self.case, self.work = case, work
        self.disk = PowerCut(work / "disk", work / "mnt", dirs=case.dirs)
        self.procs: list[Proc] = []
        self.provider: ProviderProcess | None = None
        self.run_id = f"cut-{case.engine[:4]}-{uuid.uuid4().hex[:8]}"
        self.out = Outcome(case)

    @property
    def mnt(self) -> Path:
        return self.disk.path

    @property
    def memory_db(self) -> Path:
        return self.mnt / "memory.db"

    def env(self) -> dict[str, str]:
        assert self.provider is not None
        return {"MEMORY_DB": str(self.memory_db), "PROVIDER_URL": self.provider.url, "PYTHONUNBUFFERED": "1",
                "RUNRECORD_DB": str(self.mnt / "runrecord.db"), "DBOSFLOW_DB": str(self.mnt / "dbosflow.db"),
                "RUNRECORD_LEASE_SECONDS": "2", "CRASH_AT": ""}

    def proc(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, env={**self.env(), **(env or {})})
        self.procs.append(proc)
        return proc

    def effects(self) -> dict[str, int]:
        assert self.provider is not None
        found = {e.key: e.effects_applied for e in fetch_effects(self.provider.url, run_id=self.run_id)}
        return {s: found.get(idempotency_key(self.run_id, s), 0) for s in EFFECT_STEPS}

    def memory_has_exchange(self) -> bool:
        """Opened as the engines open it (a reader must not skip SQLite's WAL recovery), then closed."""
        store = open_store(self.memory_db)
        try:
            return set(exchange_message_ids(self.run_id)) <= {m.id for m in store.window(self.run_id)}
        finally:
            store.close()

    async def run(self) -> Outcome:
        began = time.monotonic()
        try:
            self.disk.mount()
            placed = self.mnt if self.case.placement == "laptop" else self.work
            self.provider = start_provider(placed / "provider.db")
            engine = _engine(self)
            await engine.warm_up()
            self.disk.sync_tree()
            acknowledged = await engine.until_cut(crash_at(self.case.engine, self.case.point))
            applied_before = self.effects()
            memory_said = self.case.point == "memory" and acknowledged.memory
            victims: list[Any] = [*engine.victims()]
            if self.case.placement == "laptop":
                victims.append(self.provider)
            self.out.cut = self.disk.cut(*victims)
            if self.case.placement == "laptop":
                self.provider.start()
            applied_after = self.effects()
            self.out.lost += [f"the provider's {s} (answered 200)" for s in EFFECT_STEPS
                              if applied_before[s] and not applied_after[s]]
            if memory_said and not self.memory_has_exchange():
                self.out.lost.append("memory's last exchange")
            await engine.after_cut(acknowledged)
            self.out.applied = self.effects()
        except Exception as exc:  # a case that cannot run is reported, never hidden
            self.out.error = f"{type(exc).__name__}: {exc}"
        finally:
            for proc in self.procs:
                proc.kill()
            if self.provider is not None:
                self.provider.kill()
            self.disk.close()
            self.out.seconds = time.monotonic() - began
        return self.out


class _Engine(Protocol):
    async def warm_up(self) -> None: ...
    async def until_cut(self, point: str) -> _Acknowledged: ...
    def victims(self) -> Iterable[Proc]: ...
    async def after_cut(self, ack: _Acknowledged) -> None: ...


@dataclass
class _Acknowledged:
    start: bool = False
    steps: list[str] = field(default_factory=list)  # completed, as the engine reported
    memory: bool = False


def _completed_steps(text: str) -> list[str]:
    return [s for s in STEP_NAMES if s in set(_COMPLETED.findall(text))]


def _executions(text: str, step: str) -> int:
    return text.count(f"step {step} started:")


def _wait_exit(proc: Proc, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while proc.alive():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} still running after {timeout:.0f} s:\n{proc.output()[-2000:]}")
        time.sleep(0.02)
    return proc.popen.returncode


class _CliEngine:
    """The run record and DBOS: one CLI process per start or resume, the same output lines."""

    module = ""

    def __init__(self, c: _Case) -> None:
        self.c = c
        self.first: Proc | None = None

    def cli(self, name: str, *args: str, crash: str = "") -> Proc:
        env = {"CRASH_AT": crash}
        if self.c.case.engine == "runrecord":
            env["RUNRECORD_SYNCHRONOUS"] = self.c.case.sync
        return self.c.proc(name, [sys.executable, "-m", self.module, *args], env)

    async def warm_up(self) -> None:
        warm = self.cli("warm-up", "start", f"warm-{self.c.run_id}", TASK, "--email", EMAIL)
        if _wait_exit(warm, RUN_TIMEOUT) != 0:
            raise RuntimeError(f"the warm-up run failed:\n{warm.output()[-2000:]}")

    async def until_cut(self, point: str) -> _Acknowledged:
        self.first = self.cli("first", "start", self.c.run_id, TASK, "--email", EMAIL, crash=point)
        _wait_exit(self.first, RUN_TIMEOUT)
        text = self.first.output()
        if f"CRASH_AT={point}" not in text:
            raise RuntimeError(f"the run did not reach {point}:\n{text[-2000:]}")
        return _Acknowledged(start=True, steps=_completed_steps(text), memory=point == "memory:after_append")

    def victims(self) -> Iterable[Proc]:
        return [self.first] if self.first is not None else []

    def status(self) -> dict[str, Any] | None:
        proc = self.cli("status", "status", self.c.run_id, "--json")
        _wait_exit(proc, 60)
        text = proc.output()
        if "no run" in text and '"steps"' not in text:
            return None
        if "{" not in text:
            raise RuntimeError(f"status of {self.c.run_id} printed no JSON: {text[-2000:]}")
        found: dict[str, Any] = json.loads(text[text.index("{"):])
        if "steps" in found:
            return found
        raise RuntimeError(f"status of {self.c.run_id} failed: {text[-2000:]}")

    async def after_cut(self, ack: _Acknowledged) -> None:
        out = self.c.out
        if self.status() is None:
            out.lost.append("the run (its start was acknowledged)")
            out.final_status = "lost"
            return
        resumed = self.cli("resume", "resume", self.c.run_id)
        _wait_exit(resumed, RUN_TIMEOUT)
        text = resumed.output()
        again = [s for s in ack.steps if _executions(text, s)]
        out.executed_again = again
        out.lost += [f"{s}'s completion" for s in again]
        status = self.status()
        out.final_status = status["status"] if status else "lost"
        out.completed = out.final_status == "completed"


class _RunRecord(_CliEngine):
    module = "runrecord"


class _Dbos(_CliEngine):
    module = "dbosflow"


class _Temporal:
    """The dev server (its SQLite history on the mount) and worker processes."""

    def __init__(self, c: _Case) -> None:
        self.c = c
        self.db = c.mnt / "temporal.db"
        self.pragmas = {} if c.case.sync == "FULL" else {"synchronous": c.case.sync}
        self.server = self._server()
        self.queue = f"tq-{uuid.uuid4().hex[:10]}"
        self.worker: Proc | None = None

    def _server(self, port: int | None = None) -> DevServer:
        server = DevServer(db_file=self.db, port=port, dynamic_config=LAB_SERVER_CONFIG,
                           sqlite_pragmas=self.pragmas).start()
        assert server.proc is not None
        self.c.procs.append(server.proc)
        return server

    def _worker(self, name: str, crash: str = "") -> Proc:
        worker = start_worker(self.server.address, self.c.env()["PROVIDER_URL"], self.queue,
                              {**self.c.env(), "CRASH_AT": crash}, name=name)
        self.c.procs.append(worker)
        return worker

    async def _client(self) -> Any:
        return await connect({"TEMPORAL_ADDRESS": self.server.address, "TEMPORAL_NAMESPACE": "default"})

    async def _closed(self, client: Any, run_id: str) -> dict[str, Any]:
        async def closed() -> dict[str, Any] | None:
            status = await run_status(client, run_id)
            return status if status["status"] != "running" else None
        found: dict[str, Any] = await wait_until(closed, RUN_TIMEOUT, f"run {run_id} to close", interval=0.2)
        return found

    async def warm_up(self) -> None:
        warm = self._worker("warm-up")
        client = await self._client()
        await start_run(client, f"warm-{self.c.run_id}", TASK, EMAIL, queue=self.queue)
        status = await self._closed(client, f"warm-{self.c.run_id}")
        if status["status"] != "completed":
            raise RuntimeError(f"the warm-up run ended {status['status']}:\n{warm.output()[-2000:]}")
        warm.stop()

    async def until_cut(self, point: str) -> _Acknowledged:
        client = await self._client()
        if not point:  # right after the acknowledged start: the server's answer, then the cut at once
            created, _ = await start_run(client, self.c.run_id, TASK, EMAIL, queue=self.queue)
            return _Acknowledged(start=created)
        self.worker = self._worker("worker1", crash=point)
        created, _ = await start_run(client, self.c.run_id, TASK, EMAIL, queue=self.queue)
        worker = self.worker
        await wait_until(lambda: not worker.alive(), RUN_TIMEOUT, f"the worker to reach {point}")
        if f"CRASH_AT={point}" not in worker.output():
            raise RuntimeError(f"the worker did not reach {point}:\n{worker.output()[-2000:]}")
        history = await run_status(client, self.c.run_id)
        steps = [s["name"] for s in history["steps"] if s["status"] in ("completed", "adopted")]
        return _Acknowledged(start=created, steps=steps, memory=point == "memory:after_append")

    def victims(self) -> Iterable[Proc]:
        return [p for p in (self.worker, self.server.proc) if p is not None]

    async def after_cut(self, ack: _Acknowledged) -> None:
        out = self.c.out
        self.server = self._server(port=self.server.port)
        client = await self._client()
        try:
            await run_status(client, self.c.run_id)
        except TemporalRunNotFound:  # the history has no such run
            out.lost.append("the run (its start was acknowledged)")
            out.final_status = "lost"
            return
        second = self._worker("worker2")
        status = await self._closed(client, self.c.run_id)
        again = [s for s in ack.steps if _executions(second.output(), s)]
        out.executed_again = again
        out.lost += [f"{s}'s completion" for s in again]
        out.final_status = status["status"]
        out.completed = out.final_status == "completed"


def _engine(c: _Case) -> _Engine:
    if c.case.engine == "temporal":
        return _Temporal(c)
    return _Dbos(c) if c.case.engine == "dbos" else _RunRecord(c)


async def run_case(case: Case, work: Path) -> Outcome:
    """Run one case in ``work`` (made if missing; the mount is unmounted whatever happens)."""
    work.mkdir(parents=True, exist_ok=True)
    return await _Case(case, work).run()


def cases(engines: Iterable[str] = ENGINES, placements: Iterable[str] = PLACEMENTS, points: Iterable[str] = POINTS,
          dirs: Iterable[str] = DIR_RULES, syncs: Iterable[str] | None = None) -> list[Case]:
    chosen = []
    for engine in engines:
        for sync in SYNC_LEVELS[engine]:
            if syncs is not None and sync not in syncs:
                continue
            chosen += [Case(engine, p, point, d, sync) for p in placements for point in points for d in dirs]
    return chosen


# ---------------------------------------------------------------- the table


COLUMNS = ("engine", "placement", "cut point", "dirs", "sync", "completed", "effects (email, ticket)",
           "acknowledged writes lost", "the cut dropped", "check")


def markdown(outcomes: list[Outcome]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(o.row()[c] for c in COLUMNS) + " |" for o in outcomes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--dirs", default=",".join(DIR_RULES))
    parser.add_argument("--sync", default=None, help="only these sync levels (e.g. FULL,EXTRA)")
    parser.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    parser.add_argument("--state-dir", default=None, help="where the mounts go (default: a temporary directory)")
    args = parser.parse_args(argv)

    def pick(value: str, allowed: tuple[str, ...]) -> list[str]:
        chosen = [v for v in value.split(",") if v]
        unknown = [v for v in chosen if v not in allowed]
        if unknown:
            parser.error(f"unknown {unknown}: choose from {', '.join(allowed)}")
        return chosen

    chosen = cases(pick(args.engines, ENGINES), pick(args.placements, PLACEMENTS), pick(args.points, POINTS),
                   pick(args.dirs, DIR_RULES), args.sync.split(",") if args.sync else None)
    base = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="powercut-"))
    outcomes = []
    print(f"{len(chosen)} cases; mounts under {base}", file=sys.stderr, flush=True)
    try:
        for n, case in enumerate(chosen, 1):
            outcome = asyncio.run(run_case(case, base / f"case{n}"))
            outcomes.append(outcome)
            row = outcome.row()
            print(f"[{n}/{len(chosen)}] {case.label()}: {row['completed']}; effects {row['effects (email, ticket)']}; "
                  f"lost: {row['acknowledged writes lost']}; {row['check']} ({outcome.seconds:.1f} s)",
                  file=sys.stderr, flush=True)
            if args.json:
                print(json.dumps({**asdict(outcome), "row": row}), flush=True)
    finally:
        if not args.state_dir:
            shutil.rmtree(base, ignore_errors=True)
    if not args.json:
        print(markdown(outcomes))
    broken = [o for o in outcomes if o.broken()]
    if broken:
        print(f"{len(broken)} case(s) broke a promise of the lab's own stores: "
              + "; ".join(f"{o.case.label()}: {'; '.join(o.broken())}" for o in broken), file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
