"""Cost per durable step of the run record against a bare SQLite insert-and-commit.

    .venv/bin/python bench/bench_runrecord.py [--runs 300] [--rounds 5] [--temporal] [--dir DIR]

What is measured, all in this one invocation, on files in one directory with
the same settings (WAL, synchronous=FULL):

- record step: ``RunRecord.complete_step``, the exact call the runner makes
  when a step succeeds: the result, the intent's outcome (effect steps), the
  advance, the next step's first attempt and intent, the lease renewal, in
  one transaction. Averaged over the three steps of each run (draft has no
  intent; the two effect steps do).
- bare insert: ``INSERT`` of the same result JSON into a one-table database,
  committed (autocommit), once per step.
- runner end to end: the real ``Runner`` (asyncio, lease, heartbeat thread,
  run creation, reads) driving a flow whose steps and provider are no-op
  stubs, so the figure is the record's machinery and nothing else; per step
  = per run / 3. Run creation is one extra commit per run.
- optionally (``--temporal``) a bare 3-activity workflow of no-op activities
  (``bench/bare_flows.py``) on a dev server (in memory, the lab's
  configuration) with an in-process worker on the SDK's default options:
  per step = workflow start to result / 3.

The record and the bare inserts are interleaved run by run, so both see the
same disk. Medians over rounds. Goal: record step within 1.5x of the bare
insert. Not a test: it reports, it does not assert.
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

from durable_agents.runrecord.runner import Runner  # noqa: E402
from durable_agents.runrecord.store import Intent, NextAttempt, RunRecord, _dump  # noqa: E402
from durable_agents.steps.flow import StepDeps  # noqa: E402
from durable_agents.steps.keys import idempotency_key  # noqa: E402
from durable_agents.steps.models import DraftResult, EmailSent, OutcomeRecorded, to_jsonable  # noqa: E402
from durable_agents.steps.plan import FLOW as DEFAULT_FLOW  # noqa: E402
from durable_agents.steps.plan import FlowStep  # noqa: E402

RESULTS = [
    to_jsonable(DraftResult(subject="Re: Confirm the refund for order 1234", body="Hello,\n\n" + "x" * 300,
                            summary="Drafted a reply to: Confirm the refund for order 1234", model="offline")),
    to_jsonable(EmailSent(message_id="msg_" + "a" * 24, to="ada@example.com", idempotency_key="agentlab/r/s")),
    to_jsonable(OutcomeRecorded(ticket_id="tkt_" + "b" * 24, idempotency_key="agentlab/r/o")),
]


def bare_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS results (run_id TEXT, position INTEGER, result TEXT, "
                 "PRIMARY KEY (run_id, position))")
    return conn


def one_record_run(record: RunRecord, run_id: str) -> float:
    """Create a run (not timed), then time the three complete_step commits."""
    names = [s.name for s in DEFAULT_FLOW]
    holder = "bench:0:x"
    record.create_run(run_id, "task", "ada@example.com", run_id, names, holder, 30, NextAttempt(0, 1, None))
    start = time.perf_counter()
    for pos in range(3):
        nxt = nname = None
        if pos < 2:
            nname = names[pos + 1]
            key = idempotency_key(run_id, nname)
            nxt = NextAttempt(pos + 1, 1, Intent(key, {"run_id": run_id, "idempotency_key": key, "body": "x" * 300}))
        record.complete_step(run_id, pos, 1, RESULTS[pos], holder, 30, effect=pos > 0, next_name=nname, nxt=nxt)
    return (time.perf_counter() - start) / 3


def one_bare_run(conn: sqlite3.Connection, run_id: str) -> float:
    start = time.perf_counter()
    for pos in range(3):
        conn.execute("INSERT INTO results VALUES (?, ?, ?)", (run_id, pos, _dump(RESULTS[pos])))
    return (time.perf_counter() - start) / 3


# ---------------------------------------------------------------- no-op flow for the runner


class StubProvider:
    async def aclose(self) -> None:
        pass


async def _noop_draft(req, deps):
    return DraftResult(subject="s", body="b", summary="sum", model="stub")


async def _noop_effect(req, deps):
    return EmailSent(message_id="msg_stub", to="ada@example.com", idempotency_key=req.idempotency_key)


async def _noop_effect2(req, deps):
    return OutcomeRecorded(ticket_id="tkt_stub", idempotency_key=req.idempotency_key)


NOOP_FLOW = (
    FlowStep("draft", _noop_draft, DEFAULT_FLOW[0].request),
    FlowStep("send_confirmation", _noop_effect, DEFAULT_FLOW[1].request, kind=DEFAULT_FLOW[1].kind),
    FlowStep("record_outcome", _noop_effect2, DEFAULT_FLOW[2].request, kind=DEFAULT_FLOW[2].kind),
)


async def runner_runs(path: Path, n: int) -> float:
    runner = Runner(path, StepDeps(provider=StubProvider(), llm=None), flow=NOOP_FLOW, say=lambda line: None)
    times = []
    try:
        for _ in range(n):
            run_id = f"e2e-{uuid.uuid4().hex[:12]}"
            start = time.perf_counter()
            await runner.start(run_id, "Confirm the refund", "ada@example.com")
            times.append((time.perf_counter() - start) / 3)
    finally:
        runner.close()
    return statistics.median(times)


# ---------------------------------------------------------------- Temporal, optional


from bare_flows import BareN, noop  # noqa: E402  (bench/bare_flows.py)


async def temporal_per_step(n: int) -> float:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from lab.processes import LAB_SERVER_CONFIG, DevServer

    server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
    try:
        client = await Client.connect(server.address)
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        # The SDK's default worker options (a workflow cache): the leanest Temporal path.
        async with Worker(client, task_queue=queue, workflows=[BareN], activities=[noop]):
            times = []
            for _ in range(n):
                start = time.perf_counter()
                await client.execute_workflow(BareN.run, 3, id=f"bare-{uuid.uuid4().hex}", task_queue=queue)
                times.append((time.perf_counter() - start) / 3)
        return statistics.median(times)
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs (3 steps each) per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--temporal", action="store_true", help="also time a bare 3-activity workflow")
    parser.add_argument("--temporal-runs", type=int, default=30)
    parser.add_argument("--dir", default=None, help="where the SQLite files go (default: a temp dir under .state)")
    args = parser.parse_args()

    base = Path(args.dir) if args.dir else Path(__file__).resolve().parent.parent / ".state"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-runrecord-") as tmp:
        tmp = Path(tmp)
        record = RunRecord(tmp / "record.db")
        bare = bare_db(tmp / "bare.db")
        rec_rounds, bare_rounds, e2e_rounds = [], [], []
        for r in range(args.rounds):
            rec_t, bare_t = [], []
            for i in range(args.runs):
                run_id = f"r{r}-{i}"
                rec_t.append(one_record_run(record, run_id))
                bare_t.append(one_bare_run(bare, run_id))
            rec_rounds.append(statistics.median(rec_t))
            bare_rounds.append(statistics.median(bare_t))
            e2e_rounds.append(asyncio.run(runner_runs(tmp / "e2e.db", max(20, args.runs // 5))))
        record.close()
        bare.close()
    rec, bare_us, e2e = (statistics.median(x) * 1e6 for x in (rec_rounds, bare_rounds, e2e_rounds))
    print(f"machine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}")
    print(f"files under {base} (WAL, synchronous=FULL); {args.rounds} rounds x {args.runs} runs x 3 steps; medians")
    print(f"  bare insert + commit         {bare_us:8.1f} us/step")
    print(f"  record step (complete_step)  {rec:8.1f} us/step   ratio {rec / bare_us:.2f}x   (goal <= 1.5x)")
    print(f"  runner end to end, no-op     {e2e:8.1f} us/step   ratio {e2e / bare_us:.2f}x   "
          "(Runner.start: create + 3 steps, lease, heartbeat, asyncio)")
    if args.temporal:
        t = asyncio.run(temporal_per_step(args.temporal_runs)) * 1e6
        print(f"  temporal bare 3-activity wf  {t:8.1f} us/step   ratio {t / bare_us:.1f}x   "
              f"(dev server in memory, in-process worker, {args.temporal_runs} workflows)")
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
