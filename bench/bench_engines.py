"""Three durable engines side by side in one invocation: Temporal (as shipped),
DBOS Transact (SQLite, and PostgreSQL) and the hand-rolled run record, with a
bare SQLite commit as the floor.

    .venv/bin/python bench/bench_engines.py [--step-runs 200] [--rounds 3] [--latency-runs 20]
                                            [--batch 50] [--trials 3] [--no-postgres]

**DBOS on PostgreSQL** (``dbos-pg``, unless ``--no-postgres``): the same
measures with DBOS's system database on the project's own PostgreSQL
(``lab.postgres``: Debian's server, its defaults, ``fsync=on``,
``synchronous_commit=on``; data under the run's directory in .state/). DBOS
runs one instance per process, so its per-step, end-to-end and throughput
figures are measured after the interleaved ones, in a second launch of DBOS
in this process (not interleaved: compare with the drift in mind); its
resumes are interleaved with the others'.

Needs the dbos extra (``make install`` has it). What is measured, all in this
process and its children, on files in one temp directory under .state/:

- **per step** (the durable record of one step, no-op step functions):
  floor: a bare ``INSERT`` of the step's result, committed, in WAL with
  ``synchronous=FULL`` (the record's settings) and in a rollback journal
  with ``synchronous=FULL`` (DBOS's SQLite settings: it sets neither);
  record: ``RunRecord.complete_step``, the runner's one commit per step;
  DBOS: one ``DBOS.run_step_async`` of a no-op step inside a workflow, timed
  around the call (DBOS's name check and its ``operation_outputs`` insert);
  Temporal: a bare workflow of three no-op activities with worker.py's
  options, start to result / 3.
- **end to end**: the real flow (offline model, provider process, memory),
  one run at a time, start to result: Temporal (in-process worker with
  worker.py's options, dev server in memory with ``LAB_SERVER_CONFIG``),
  DBOS (``dbosflow``: launched once in this process), the record
  (``Runner.start``). Also each engine's no-op flow (per step x 3).
- **throughput**: ``--batch`` runs of the real flow started at once per
  engine, rounds interleaved; runs per second from the first start to the
  last result.
- **resume after SIGKILL, from the kill to the run done**: for each of the
  five crash points the engines share, a process armed with ``CRASH_AT``
  dies and the replacement is started as soon as it is seen dead: a new
  worker (Temporal, the lab's dev server), ``python -m durable_agents.runrecord resume``,
  ``python -m durable_agents.dbosflow resume`` (DBOS's recovery on launch). Done = the
  engine's own completion time (WorkflowExecutionCompleted; the record's
  completion commit; DBOS's last step row, since ``workflow_status.completed_at``
  is whole seconds on SQLite).

Every figure is also given as a ratio to the floor and to the record.
Not a test: it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bare_flows import BareN, noop  # noqa: E402
from bench_resume import POINTS  # noqa: E402
from bench_resume import one as temporal_resume
from bench_resume_record import record_one as record_resume  # noqa: E402
from bench_runrecord import NOOP_FLOW, StubProvider  # noqa: E402
from dbos import DBOS  # noqa: E402

from durable_agents.dbosflow import engine as dbos_engine  # noqa: E402
from durable_agents.dbosflow import sysdb  # noqa: E402
from durable_agents.dbosflow.sysdb import system_db  # noqa: E402
from durable_agents.runrecord.runner import Runner  # noqa: E402
from durable_agents.runrecord.store import Intent, NextAttempt, RunRecord, _dump  # noqa: E402
from durable_agents.steps.flow import StepDeps  # noqa: E402
from durable_agents.steps.keys import idempotency_key  # noqa: E402
from durable_agents.steps.models import DraftResult, EmailSent, OutcomeRecorded, to_jsonable  # noqa: E402
from durable_agents.steps.plan import FLOW as DEFAULT_FLOW  # noqa: E402
from durable_agents.steps.plan import STEP_NAMES  # noqa: E402
from durable_agents.steps.retry import RetryRule  # noqa: E402
from durable_agents.wiring import deps_from_env  # noqa: E402
from lab import registry  # noqa: E402
from lab.engines import DbosDriver, RunRecordDriver, TemporalDriver  # noqa: E402
from lab.postgres import Postgres  # noqa: E402
from lab.powercut_postgres import ENGINE as DBOS_PG  # noqa: E402
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc  # noqa: E402
from lab.provider_process import start_provider  # noqa: E402

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
# Each engine's lane here, named by its registration (lab.registry), and DBOS on PostgreSQL (dbos_on_postgres),
# the variant lab.powercut_postgres derives from DBOS's registration.
TEMPORAL = registry.registration_of(TemporalDriver).name
DBOS_ENGINE = registry.registration_of(DbosDriver).name
RECORD = registry.registration_of(RunRecordDriver).name
ENGINES = (TEMPORAL, DBOS_ENGINE, RECORD)
RESULTS = [
    to_jsonable(DraftResult(subject="Re: " + TASK, body="Hello,\n\n" + "x" * 300,
                            summary="Drafted a reply to: " + TASK, model="offline")),
    to_jsonable(EmailSent(message_id="msg_" + "a" * 24, to=EMAIL, idempotency_key="agentlab/r/s")),
    to_jsonable(OutcomeRecorded(ticket_id="tkt_" + "b" * 24, idempotency_key="agentlab/r/o")),
]


# ------------------------------------------------------------------ per step: the floor and the record


def bare_db(path: Path, journal: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS results (run_id TEXT, position INTEGER, result TEXT, "
                 "PRIMARY KEY (run_id, position))")
    return conn


def bare_step(conn: sqlite3.Connection, run_id: str) -> float:
    start = time.perf_counter()
    for pos in range(3):
        conn.execute("INSERT INTO results VALUES (?, ?, ?)", (run_id, pos, _dump(RESULTS[pos])))
    return (time.perf_counter() - start) / 3


def record_step(record: RunRecord, run_id: str) -> float:
    names = [s.name for s in DEFAULT_FLOW]
    record.create_run(run_id, "task", EMAIL, run_id, names, "bench:0:x", 30, NextAttempt(0, 1, None))
    start = time.perf_counter()
    for pos in range(3):
        nxt = nname = None
        if pos < 2:
            nname = names[pos + 1]
            key = idempotency_key(run_id, nname)
            nxt = NextAttempt(pos + 1, 1, Intent(key, {"run_id": run_id, "idempotency_key": key, "body": "x" * 300}))
        record.complete_step(run_id, pos, 1, RESULTS[pos], "bench:0:x", 30, effect=pos > 0, next_name=nname, nxt=nxt)
    return (time.perf_counter() - start) / 3


# ------------------------------------------------------------------ no-op flows
# The record's no-op flow and stub provider are bench_runrecord's, so both benches time the same steps.


DBOS_STEP_TIMES: list[float] = []


async def _dbos_noop(i: int) -> dict:
    return RESULTS[i]


@DBOS.workflow(name="bench_noop3")
async def dbos_noop3() -> int:
    for i in range(3):
        t = time.perf_counter()
        await DBOS.run_step_async({"name": DEFAULT_FLOW[i].name}, _dbos_noop, i)
        DBOS_STEP_TIMES.append(time.perf_counter() - t)
    return 3


# ------------------------------------------------------------------ the engines, in process


class Engines:
    def __init__(self, work: Path, url: str, server: DevServer, dbos_db: Path | str | None = None) -> None:
        self.work, self.url, self.server = work, url, server
        self.dbos_db = dbos_db or work / "dbosflow.db"  # a SQLite file, or a PostgreSQL URL
        self.env = {"PROVIDER_URL": url, "MEMORY_DB": str(work / "memory.db")}
        self.record_db = work / "record-flow.db"
        self.deps = deps_from_env(self.env)

    async def __aenter__(self):
        from temporalio.client import Client
        from temporalio.worker import Worker

        from durable_agents.activities import FlowActivities
        from durable_agents.flowclient.worker_options import TUNED_OPTIONS  # worker.py's options as shipped
        from durable_agents.workflows.agent_flow import AgentFlow

        self.client = await Client.connect(self.server.address)
        self.queue = f"bench-engines-{uuid.uuid4().hex[:6]}"
        self.worker = Worker(self.client, task_queue=self.queue, workflows=[AgentFlow, BareN],
                             activities=[*FlowActivities(deps_from_env(self.env)).all(), noop], **TUNED_OPTIONS)
        await self.worker.__aenter__()
        db = system_db(self.dbos_db)
        dbos_engine.set_environment(lambda: deps_from_env(self.env), db, say=lambda line: None)
        dbos_engine.configure(db)
        await asyncio.to_thread(DBOS.launch)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.worker.__aexit__(None, None, None)
        await dbos_engine.close_deps()
        await self.deps.provider.aclose()
        await asyncio.to_thread(DBOS.destroy)

    async def run(self, engine: str) -> None:
        run_id = f"b-{engine}-{uuid.uuid4().hex[:10]}"
        if engine == TEMPORAL:
            from durable_agents.flowclient.runs import start_run

            await start_run(self.client, run_id, TASK, EMAIL, queue=self.queue)
            await self.client.get_workflow_handle(run_id).result()
        elif engine == DBOS_ENGINE:
            handle = await dbos_engine.start_run(run_id, dbos_engine.new_inputs(
                run_id, TASK, EMAIL, run_id, uuid.uuid4().hex[:16], RetryRule()))
            await handle.get_result()
        else:
            runner = Runner(self.record_db, self.deps, say=lambda line: None)
            try:
                run = await runner.start(run_id, TASK, EMAIL)
            finally:
                runner.close()
            assert run.status == "completed", run.error

    async def noop(self, engine: str) -> float:
        start = time.perf_counter()
        if engine == TEMPORAL:
            await self.client.execute_workflow(BareN.run, 3, id=f"bare-{uuid.uuid4().hex}", task_queue=self.queue)
        elif engine == DBOS_ENGINE:
            handle = await DBOS.start_workflow_async(dbos_noop3)
            await handle.get_result()
        else:
            runner = Runner(self.work / "record-noop.db", StepDeps(provider=StubProvider(), llm=None),
                            flow=NOOP_FLOW, say=lambda line: None)
            try:
                await runner.start(f"n-{uuid.uuid4().hex[:12]}", TASK, EMAIL)
            finally:
                runner.close()
        return (time.perf_counter() - start) / 3


# ------------------------------------------------------------------ resume after SIGKILL: DBOS


async def dbos_resume(url: str, point: str, work: Path, db: Path | str | None = None) -> tuple[float, float]:
    """(seconds from the DBOS process's death to the run done, of which until the resumed step's row started);
    ``db`` a SQLite file (by default) or a PostgreSQL URL."""
    run_id = f"bench-dbos-{point.replace(':', '-')}-{uuid.uuid4().hex[:6]}"
    db = db or work / "dbos-resume.db"
    env = {"DBOSFLOW_DB": str(db), "MEMORY_DB": str(work / "dbos-memory.db"), "PROVIDER_URL": url,
           "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "durable_agents.dbosflow"]
    first = Proc("dbos-start", [*argv, "start", run_id, TASK, "--email", EMAIL], env={**env, "CRASH_AT": point})
    try:
        deadline = time.monotonic() + 60
        while first.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        died = time.time()
        first.kill()
    if first.popen.returncode != -9:
        raise RuntimeError(f"dbosflow did not die at {point}:\n{first.output()}")
    second = Proc("dbos-resume", [*argv, "resume", run_id], env={**env, "CRASH_AT": ""})
    try:
        deadline = time.monotonic() + 120
        while second.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        second.kill()
    if second.popen.returncode != 0:
        raise RuntimeError(f"dbosflow resume exited {second.popen.returncode}:\n{second.output()}")
    with sysdb.connect(db) as con:
        # workflow_status.completed_at is whole seconds on SQLite; the last step row's end is in milliseconds.
        done_ms = con.rows("SELECT max(completed_at_epoch_ms) FROM operation_outputs WHERE workflow_uuid = ?",
                           (run_id,))[0][0]
        step = next(s for s in STEP_NAMES if point.startswith(s))
        started_ms = con.rows("SELECT started_at_epoch_ms FROM operation_outputs WHERE workflow_uuid = ? "
                              "AND function_name = ?", (run_id, step))[0][0]
    return int(str(done_ms)) / 1000 - died, int(str(started_ms)) / 1000 - died


async def dbos_on_postgres(work: Path, url: str, server: DevServer, pg_url: str, args, out: dict) -> None:
    """The DBOS figures again, its system database on PostgreSQL: a second launch of DBOS in this process."""
    from concurrent.futures import ThreadPoolExecutor

    # DBOS made its thread pool this loop's default executor and shut it down with DBOS.destroy: a new one.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
    async with Engines(work, url, server, dbos_db=pg_url) as eng:
        await eng.run(DBOS_ENGINE)  # warm-up: the schema, connections, the first workflow
        await eng.noop(DBOS_ENGINE)
        DBOS_STEP_TIMES.clear()
        noop = [await eng.noop(DBOS_ENGINE) for _ in range(max(args.latency_runs, 20))]
        out["step"][DBOS_PG] = statistics.median(DBOS_STEP_TIMES)
        out["noop"][DBOS_PG] = statistics.median(noop)
        lat = []
        for _ in range(args.latency_runs):
            t = time.perf_counter()
            await eng.run(DBOS_ENGINE)
            lat.append(time.perf_counter() - t)
        out["latency"][DBOS_PG] = (statistics.median(lat), sorted(lat)[int(0.9 * (len(lat) - 1))])
        thr = []
        for r in range(args.rounds_throughput):
            t = time.perf_counter()
            await asyncio.gather(*(eng.run(DBOS_ENGINE) for _ in range(args.batch)))
            thr.append(args.batch / (time.perf_counter() - t))
            print(f"  throughput round {r + 1} {DBOS_PG:<9} {thr[-1]:6.1f} runs/s", flush=True)
        out["throughput"][DBOS_PG] = statistics.median(thr)


# ------------------------------------------------------------------ all of it


async def main_async(args) -> dict:
    out: dict = {"step": {}, "noop": {}, "latency": {}, "throughput": {}, "resume": {}}
    base = Path(__file__).resolve().parent.parent / ".state"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-engines-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # PostgreSQL's user reaches its data directory in here (lab.postgres)
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider = start_provider(work / "provider.db")
        url = provider.url
        pg = Postgres(work / "postgres").start() if args.postgres else None
        try:
            # Per step: floor (two journal modes) and the record, interleaved run by run.
            wal, rollback = bare_db(work / "bare-wal.db", "WAL"), bare_db(work / "bare-rollback.db", "DELETE")
            record = RunRecord(work / "record-step.db")
            cells: dict[str, list[float]] = {"floor (WAL)": [], "floor (rollback journal)": [], RECORD: []}
            for r in range(args.rounds):
                per: dict[str, list[float]] = {k: [] for k in cells}
                for i in range(args.step_runs):
                    per["floor (WAL)"].append(bare_step(wal, f"r{r}-{i}"))
                    per["floor (rollback journal)"].append(bare_step(rollback, f"r{r}-{i}"))
                    per[RECORD].append(record_step(record, f"r{r}-{i}"))
                for k in cells:
                    cells[k].append(statistics.median(per[k]))
            record.close()
            wal.close()
            rollback.close()
            async with Engines(work, url, server) as eng:
                for engine in ENGINES:  # warm-up: imports, connections, the first workflow
                    await eng.run(engine)
                    await eng.noop(engine)
                DBOS_STEP_TIMES.clear()
                noop: dict[str, list[float]] = {e: [] for e in ENGINES}
                for _ in range(max(args.latency_runs, 20)):
                    for engine in ENGINES:
                        noop[engine].append(await eng.noop(engine))
                cells[DBOS_ENGINE] = [statistics.median(DBOS_STEP_TIMES)]
                out["noop"] = {e: statistics.median(v) for e, v in noop.items()}
                lat: dict[str, list[float]] = {e: [] for e in ENGINES}
                for _ in range(args.latency_runs):
                    for engine in ENGINES:
                        t = time.perf_counter()
                        await eng.run(engine)
                        lat[engine].append(time.perf_counter() - t)
                out["latency"] = {e: (statistics.median(v), sorted(v)[int(0.9 * (len(v) - 1))]) for e, v in lat.items()}
                thr: dict[str, list[float]] = {e: [] for e in ENGINES}
                for r in range(args.rounds_throughput):
                    for engine in ENGINES:
                        t = time.perf_counter()
                        await asyncio.gather(*(eng.run(engine) for _ in range(args.batch)))
                        thr[engine].append(args.batch / (time.perf_counter() - t))
                        print(f"  throughput round {r + 1} {engine:<9} {thr[engine][-1]:6.1f} runs/s", flush=True)
                out["throughput"] = {e: statistics.median(v) for e, v in thr.items()}
            out["step"] = {k: statistics.median(v) for k, v in cells.items()}
            if pg is not None:
                await dbos_on_postgres(work, url, server, pg.url("bench_engines"), args, out)
            for trial in range(args.trials):
                for point in args.points:
                    for engine in [*ENGINES, *([DBOS_PG] if pg is not None else [])]:
                        if engine == TEMPORAL:
                            # worker.py as shipped (a cache, 100 ms sticky timeout): bench_resume's tuned+cache
                            from_ready, total = await temporal_resume(server, url, point, "tuned+cache", work)
                            part = total - from_ready
                        elif engine == DBOS_ENGINE:
                            total, part = await dbos_resume(url, point, work)
                        elif engine == DBOS_PG and pg is not None:
                            total, part = await dbos_resume(url, point, work, pg.url("bench_resume"))
                        else:
                            total, part = await record_resume(url, point, work)
                        out["resume"].setdefault(engine, []).append((total, part))
                        print(f"  resume trial {trial + 1} {point:<32} {engine:<9} {total:5.2f} s from the kill "
                              f"(replacement up and at the step: {part:4.2f} s)", flush=True)
        finally:
            provider.stop()
            server.stop()
            if pg is not None:
                pg.stop()
    return out


def report(out: dict, args) -> None:
    print(f"\nmachine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    from importlib.metadata import version

    import temporalio

    print(f"dbos {version('dbos')} (SQLite system database; {DBOS_PG}: PostgreSQL), temporalio "
          f"{temporalio.__version__}; files under .state/; dev server in memory with LAB_SERVER_CONFIG")
    step = out["step"]
    floor, rec = step["floor (WAL)"], step[RECORD]
    print(f"\nper durable step (no-op steps; medians of {args.rounds} rounds x {args.step_runs} runs x 3 steps; "
          f"DBOS: {max(args.latency_runs, 20)} workflows x 3 steps; Temporal: no-op workflows / 3)")
    print(f"  {'what':<44} {'us/step':>10} {'x floor':>8} {'x record':>9}")
    rows = [("floor: bare INSERT + commit, WAL, sync FULL", floor),
            ("floor: the same, rollback journal (DBOS's mode)", step["floor (rollback journal)"]),
            ("record: complete_step (one commit)", rec),
            ("DBOS: run_step_async in a workflow", step[DBOS_ENGINE]),
            *([("DBOS on PostgreSQL: run_step_async", step[DBOS_PG])] if DBOS_PG in step else []),
            ("record: runner end to end, no-op steps", out["noop"][RECORD]),
            ("DBOS: workflow end to end, no-op steps", out["noop"][DBOS_ENGINE]),
            *([("DBOS on PostgreSQL: the same", out["noop"][DBOS_PG])] if DBOS_PG in out["noop"] else []),
            ("Temporal: 3 no-op activities end to end", out["noop"][TEMPORAL])]
    for label, value in rows:
        print(f"  {label:<44} {value * 1e6:>10.1f} {value / floor:>7.1f}x {value / rec:>8.2f}x")
    print(f"\nthe real flow (offline model, provider, memory), {args.latency_runs} runs one at a time; "
          f"throughput: {args.rounds_throughput} rounds x {args.batch} runs at once")
    print(f"  {'engine':<10} {'latency med':>11} {'p90':>9} {'x record':>9} {'x floor':>9}   "
          f"{'runs/s':>7} {'x record':>9}")
    lat, thr = out["latency"], out["throughput"]
    shown = [*ENGINES, *([DBOS_PG] if DBOS_PG in lat else [])]
    for e in shown:
        print(f"  {e:<10} {lat[e][0] * 1000:>9.1f}ms {lat[e][1] * 1000:>7.1f}ms {lat[e][0] / lat[RECORD][0]:>8.2f}x "
              f"{lat[e][0] / (3 * floor):>8.0f}x   {thr[e]:>7.1f} {thr[e] / thr[RECORD]:>8.2f}x")
    print(f"\nresume after SIGKILL, from the kill to the run done ({args.trials} trials x {len(args.points)} points)")
    print(f"  {'engine':<10} {'median':>7} {'worst':>7} {'x record':>9}   replacement up and at the step: median")
    med_rec = statistics.median(t for t, _ in out["resume"][RECORD])
    for e in shown:
        totals = [t for t, _ in out["resume"][e]]
        parts = [p for _, p in out["resume"][e]]
        print(f"  {e:<10} {statistics.median(totals):>6.2f}s {max(totals):>6.2f}s "
              f"{statistics.median(totals) / med_rec:>8.2f}x   {statistics.median(parts):.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-runs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds-throughput", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--no-postgres", dest="postgres", action="store_false",
                        help="leave out DBOS on PostgreSQL (Debian's postgresql, started by the bench)")
    args = parser.parse_args()
    args.points = [p for p in args.points.split(",") if p]
    out = asyncio.run(main_async(args))
    report(out, args)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
