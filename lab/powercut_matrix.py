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
exchange, still open). Sync levels, the lab's default first: the run
record's ``FULL`` and ``NORMAL`` (``RUNRECORD_SYNCHRONOUS``); the dev server's
SQLite at ``EXTRA`` (``lab.processes.FILE_PRAGMAS``) and at SQLite's default,
``FULL`` (rollback journal; ``--sqlite-pragma synchronous=...``); DBOS's SQLite
system database at ``EXTRA`` (``durable_agents.dbosflow.engine``'s) and at DBOS's own,
``FULL`` (``DBOSFLOW_SYNCHRONOUS``). Memory runs at its default ``FULL``
(``MEMORY_SYNCHRONOUS``), and at ``NORMAL`` in four more cases (the run
record at its default, the memory point, both placements and rules), which
show what that level loses. The provider's store is always ``FULL``. DBOS on
PostgreSQL (engine ``dbos-pg``: the server's data directory on the cut,
``lab.powercut_postgres``) at PostgreSQL's defaults (``fsync=on``,
``synchronous_commit=on``, the lab's), ``synchronous_commit=off`` and ``fsync=off``.

The outcome of a case: did the run complete, how many times each effect was
applied, and which acknowledged writes were lost. What the lab starts by
default is promised: the engine's store at the lab's level (the run record at
``FULL``, the dev server and DBOS at ``EXTRA``, PostgreSQL at its defaults), memory at ``FULL`` and the
provider lose nothing acknowledged, and every run completes with each effect
once ("kept", or "BROKEN", which fails the command). The other levels are
measured and reported ("measured").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from durable_agents.memory import open_store
from durable_agents.providerclient import fetch_effects
from durable_agents.steps.engine_row import Engine
from durable_agents.steps.flow import exchange_message_ids
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.plan import EFFECT_STEPS, STEP_NAMES
from durable_agents.steps.runstate import DONE_STEP_STATES
from lab import powercut_postgres, registry
from lab.engines import EngineDriver, TemporalDriver, driver_for, started_steps
from lab.postgres import scratch_dir
from lab.powercut import CutReport, PowerCut
from lab.powercut_postgres import OnTheCut
from lab.processes import LAB_SERVER_CONFIG, DevServer
from lab.provider_process import ProviderProcess, start_provider

PLACEMENTS = ("worker", "laptop")
POINTS = ("start", "email", "between", "memory")
DIR_RULES = ("lenient", "strict")
ON_POSTGRES = powercut_postgres.ENGINE  # DBOS on PostgreSQL: a variant of its engine's, made there


def engine_names() -> tuple[str, ...]:
    """Every registered engine (``lab.registry``), then the variant on PostgreSQL."""
    return (*registry.names(), ON_POSTGRES)


def engine_of(engine: str) -> Engine:
    """The registration of ``engine``, or of the engine a variant is of."""
    return powercut_postgres.OF if engine == ON_POSTGRES else registry.engine(engine)


def sync_levels(engine: str) -> tuple[str, ...]:
    """The levels of the engine's store the matrix cuts at, the lab's own first (its registration's;
    PostgreSQL's: ``lab.powercut_postgres.LEVELS``)."""
    return tuple(powercut_postgres.LEVELS) if engine == ON_POSTGRES else engine_of(engine).sync_levels


def default_sync(engine: str) -> str:
    """The lab's own level for the engine's store: what ``make powercut`` holds to its promise."""
    return sync_levels(engine)[0]


MEMORY_LEVELS = ("FULL", "NORMAL")
DEFAULT_MEMORY = "FULL"

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
RUN_TIMEOUT = 90.0
_COMPLETED = re.compile(r"\b(\w+): (?:completed|adopted) \(attempt \d+\)")


def crash_at(engine: str, point: str) -> str:
    """The crash point that stops the engine's process at a cut point ("" for Temporal's start: no
    worker runs, and the cut follows the server's answer to the start at once)."""
    of = engine_of(engine)  # a variant's points are its engine's, whatever its database
    return {
        "start": of.cut_start,
        "email": "send_confirmation:after_effect",
        "between": f"{of.name}:send_confirmation:after_record",
        "memory": "memory:after_append",
    }[point]


@dataclass(frozen=True)
class Case:
    engine: str
    placement: str
    point: str
    dirs: str
    sync: str
    memory: str = DEFAULT_MEMORY

    @property
    def own_default(self) -> bool:
        """The engine's store at the lab's level (``DEFAULT_SYNC``): the configuration the lab promises
        things for (memory's part of the promise: ``memory_promised``)."""
        return self.sync == default_sync(self.engine)

    @property
    def memory_promised(self) -> bool:
        return self.own_default and self.memory == DEFAULT_MEMORY

    def label(self) -> str:
        memory = "" if self.memory == DEFAULT_MEMORY else f"/memory {self.memory}"
        return f"{self.engine}/{self.placement}/{self.point}/{self.dirs}/{self.sync}{memory}"


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
        problems = []
        for x in self.lost:
            if x.startswith("the provider's"):  # the provider is promised at every level of the engines
                problems.append(f"the provider lost {x}")
            elif x.startswith("memory"):
                if self.case.memory_promised:
                    problems.append(x)
            elif self.case.own_default:
                problems.append(x)
        if self.case.own_default:
            if not self.completed:
                problems.append(f"the run ended {self.final_status}")
            if not self.effects_once():
                problems.append(f"effects applied {self.applied}")
        return problems

    def row(self) -> dict[str, str]:
        applied = ", ".join(str(self.applied.get(s, 0)) for s in EFFECT_STEPS)
        return {
            "engine": self.case.engine, "placement": self.case.placement, "cut point": self.case.point,
            "dirs": self.case.dirs, "sync": self.case.sync, "memory": self.case.memory,
            "completed": "yes" if self.completed else f"no ({self.final_status})",
            "effects (email, ticket)": applied,
            "acknowledged writes lost": "; ".join(self.lost) or "none",
            "the cut dropped": (f"{self.cut.lost_files} files' unsynced data, {self.cut.entries} entries"
                                if self.cut else "-"),
            "check": ("BROKEN: " + "; ".join(self.broken())) if self.broken() else
                     ("kept" if self.case.memory_promised else
                      "kept; memory measured" if self.case.own_default else "measured"),
        }


# ---------------------------------------------------------------- one case


@dataclass
class _Acknowledged:
    steps: list[str] = field(default_factory=list)  # completed, as the engine reported
    memory: bool = False


def _completed_steps(text: str) -> list[str]:
    return [s for s in STEP_NAMES if s in set(_COMPLETED.findall(text))]


class _Case:
    """The processes and files of one case, the engine driven by its driver (``lab.engines``); everything
    started is killed at the end."""

    def __init__(self, case: Case, work: Path) -> None:
        self.case, self.work = case, work
        # DBOS on PostgreSQL: the server's data on the cut, its user let into the mount (lab.powercut_postgres).
        self.postgres = (OnTheCut(work / "disk" / "pgdata", work / "mnt" / "pgdata", work / "pgsock", case.sync)
                         if case.engine == ON_POSTGRES else None)
        self.disk = PowerCut(work / "disk", work / "mnt", dirs=case.dirs, allow_other=self.postgres is not None)
        self.provider: ProviderProcess | None = None
        self.driver: EngineDriver | None = None
        self.servers: list[DevServer] = []  # Temporal's: the first, and the one started after the cut
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
        env = {"MEMORY_DB": str(self.memory_db), "PROVIDER_URL": self.provider.url,
               "RUNRECORD_DB": str(self.mnt / "runrecord.db"), "DBOSFLOW_DB": str(self.mnt / "dbosflow.db"),
               "RUNRECORD_LEASE_SECONDS": "2", "MEMORY_SYNCHRONOUS": self.case.memory}
        level_env = engine_of(self.case.engine).sync_env if self.postgres is None else None
        if level_env is not None:
            env[level_env] = self.case.sync
        return env

    def temporal_server(self, port: int | None = None) -> DevServer:
        """The dev server, its SQLite history on the mount at the case's sync level; ``port``: the one it had
        before the cut, where its clients look for it."""
        server = DevServer(db_file=self.mnt / "temporal.db", port=port, dynamic_config=LAB_SERVER_CONFIG,
                           sqlite_pragmas={"synchronous": self.case.sync})
        self.servers.append(server)
        return server.start()

    def make_driver(self) -> EngineDriver:
        if self.postgres is not None:
            return self.postgres.driver(self.env(), timeout=RUN_TIMEOUT)
        if engine_of(self.case.engine).needs_server:  # its store is the server's: the level is the server's
            return driver_for(self.case.engine, self.env(), server=self.temporal_server(), timeout=RUN_TIMEOUT,
                              poll=0.2)
        return driver_for(self.case.engine, self.env(), timeout=RUN_TIMEOUT)

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
            if self.postgres is not None:
                self.postgres.prepare()  # on the disk, before the mount
            self.disk.mount()
            placed = self.mnt if self.case.placement == "laptop" else self.work
            self.provider = start_provider(placed / "provider.db")
            driver = self.driver = self.make_driver()
            await self.warm_up(driver)
            self.disk.sync_tree()
            acknowledged = await self.until_cut(driver, crash_at(self.case.engine, self.case.point))
            applied_before = self.effects()
            memory_said = self.case.point == "memory" and acknowledged.memory
            victims: list[Any] = driver.processes()
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
            await self.after_cut(driver, acknowledged)
            self.out.applied = self.effects()
        except Exception as exc:  # a case that cannot run is reported, never hidden
            self.out.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.driver is not None:
                self.driver.close()
            for server in self.servers:
                server.kill()
            if self.provider is not None:
                self.provider.kill()
            if self.postgres is not None:
                self.postgres.kill()
            self.disk.close()
            self.out.seconds = time.monotonic() - began
        return self.out

    async def warm_up(self, driver: EngineDriver) -> None:
        """A run to its end first, so that what the set-up wrote (schemas, the server's first writes) is
        synced with the tree before the case's run, and is not what the cut loses."""
        warm = f"warm-{self.run_id}"
        proc = await driver.start(warm, TASK, EMAIL, name="warm-up")
        settled = await driver.settle(warm, proc, read_status=False)
        if not settled.completed:
            ended = settled.status["status"] if settled.status else f"with exit {settled.code}"
            raise RuntimeError(f"the warm-up run ended {ended}:\n{proc.output()[-2000:]}")
        proc.stop()  # a Temporal worker serves on: stopped, so that the case's armed worker takes the case's run

    async def until_cut(self, driver: EngineDriver, point: str) -> _Acknowledged:
        """The case's run, until its process dies at ``point``; what the engine had acknowledged by then."""
        if isinstance(driver, TemporalDriver) and not point:
            # Right after the acknowledged start: the server's answer, then the cut at once (no worker runs).
            await driver.submit(self.run_id, TASK, EMAIL)
            return _Acknowledged()
        first = await driver.start(self.run_id, TASK, EMAIL, crash_at=point, name="first")
        await driver.exit_code(first)
        text = first.output()
        if f"CRASH_AT={point}" not in text:
            raise RuntimeError(f"the {first.name} process did not reach {point}:\n{text[-2000:]}")
        if isinstance(driver, TemporalDriver):  # acknowledged: what the history holds, as `starter.py status` says
            status = await driver.status(self.run_id)
            steps = [s["name"] for s in status["steps"] if s["status"] in DONE_STEP_STATES] if status else []
        else:  # what the process told its user; reading its files now would sync them before the cut
            steps = _completed_steps(text)
        return _Acknowledged(steps=steps, memory=point == "memory:after_append")

    async def after_cut(self, driver: EngineDriver, ack: _Acknowledged) -> None:
        """Power back: the run looked up, then resumed and followed to its end."""
        out = self.out
        down = self.postgres.power_back() if self.postgres is not None else None
        if down is not None:  # an outcome, not the harness's error: what the server held is gone
            out.lost.append(f"everything on PostgreSQL: the server did not start ({down})")
            out.final_status = "did not start"
            return
        if isinstance(driver, TemporalDriver):  # the server again, on its files and its port
            driver.server = self.temporal_server(port=driver.server.port)
        if await driver.status(self.run_id) is None:
            out.lost.append("the run (its start was acknowledged)")
            out.final_status = "lost"
            return
        resumed = await driver.resume(self.run_id, name="resume")
        again = [s for s in ack.steps if s in started_steps(resumed.proc)]
        out.executed_again = again
        out.lost += [f"{s}'s completion" for s in again]
        out.final_status = resumed.status["status"] if resumed.status else "lost"
        out.completed = out.final_status == "completed"


async def run_case(case: Case, work: Path) -> Outcome:
    """Run one case in ``work`` (made if missing; the mount is unmounted whatever happens)."""
    work.mkdir(parents=True, exist_ok=True)
    return await _Case(case, work).run()


def cases(engines: Iterable[str] | None = None, placements: Iterable[str] = PLACEMENTS, points: Iterable[str] = POINTS,
          dirs: Iterable[str] = DIR_RULES, syncs: Iterable[str] | None = None,
          memory: Iterable[str] = MEMORY_LEVELS) -> list[Case]:
    """Every engine (by default every one there is, ``engine_names``) at each of its levels with memory at its
    default; then, for memory's other levels, the first engine of those that runs without a server (the run
    record), at its default, cut at the memory point (what memory loses does not depend on the engine)."""
    engines = list(engine_names() if engines is None else engines)
    placements, points, dirs = list(placements), list(points), list(dirs)
    chosen = []
    for engine in engines:
        for sync in sync_levels(engine):
            if syncs is not None and sync not in syncs:
                continue
            chosen += [Case(engine, p, point, d, sync) for p in placements for point in points for d in dirs]
    serverless = [e for e in engines if e != ON_POSTGRES and not engine_of(e).needs_server]
    if serverless and "memory" in points and (syncs is None or default_sync(serverless[0]) in syncs):
        on, level_of_on = serverless[0], default_sync(serverless[0])
        chosen += [Case(on, p, "memory", d, level_of_on, level) for level in memory if level != DEFAULT_MEMORY
                   for p in placements for d in dirs]
    return chosen


# ---------------------------------------------------------------- the table


COLUMNS = ("engine", "placement", "cut point", "dirs", "sync", "memory", "completed", "effects (email, ticket)",
           "acknowledged writes lost", "the cut dropped", "check")


def markdown(outcomes: list[Outcome]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(o.row()[c] for c in COLUMNS) + " |" for o in outcomes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(engine_names()))
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--dirs", default=",".join(DIR_RULES))
    parser.add_argument("--sync", default=None, help="only these sync levels (e.g. FULL,EXTRA)")
    parser.add_argument("--memory", default=",".join(MEMORY_LEVELS),
                        help=f"memory's levels (default {','.join(MEMORY_LEVELS)}: {DEFAULT_MEMORY} everywhere, and "
                             "the others in the run record's memory-point cases)")
    parser.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    parser.add_argument("--state-dir", default=None, help="where the mounts go (default: a temporary directory)")
    args = parser.parse_args(argv)

    def pick(value: str, allowed: tuple[str, ...]) -> list[str]:
        chosen = [v for v in value.split(",") if v]
        unknown = [v for v in chosen if v not in allowed]
        if unknown:
            parser.error(f"unknown {unknown}: choose from {', '.join(allowed)}")
        return chosen

    chosen = cases(pick(args.engines, engine_names()), pick(args.placements, PLACEMENTS), pick(args.points, POINTS),
                   pick(args.dirs, DIR_RULES), args.sync.split(",") if args.sync else None,
                   pick(args.memory, MEMORY_LEVELS))
    # PostgreSQL's user walks down to its data directory on the mount (lab.powercut_postgres).
    base = Path(args.state_dir) if args.state_dir else scratch_dir("powercut-")
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
