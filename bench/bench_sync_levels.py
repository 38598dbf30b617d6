"""What each synchronous level costs the lab's SQLite stores: the run record per
step, memory per exchange, and a rollback-journal commit (the dev server's and
DBOS's journal) at EXTRA against FULL.

    .venv/bin/python bench/bench_sync_levels.py [--runs 300] [--rounds 5] [--dir DIR]

All in this one invocation, on files in one directory, interleaved run by run
so every lane sees the same disk:

- record step at FULL: ``RunRecord.complete_step``, the runner's commit when a
  step succeeds (bench_runrecord.py's ``one_record_run``), the WAL fsynced at
  every commit: what the record runs with; the same at NORMAL
  (``RunRecord(..., synchronous="NORMAL")``): the WAL is synced only at
  checkpoints (SQLite's automatic one every 1,000 WAL pages happens inside the
  timed commits, so the mean carries it); the baseline: a bare ``INSERT`` of
  the same result, committed at FULL, as in bench_runrecord.py;
- memory exchange at FULL (memory's default) and at NORMAL: the two appends the
  flow makes after a run (``durable_agents.steps.flow.remember_exchange``: the task and the
  reply, one transaction each) on a ``durable_agents.memory.SQLiteStore`` kept open, as the
  workers keep it; a conversation per run, so the window stays realistic;
- rollback-journal commit (``journal_mode=DELETE``) at FULL and at EXTRA: one
  ``INSERT`` committed, as the file-backed dev server and DBOS's system
  database commit; EXTRA adds an ``fsync`` of the directory after the
  journal's deletion (docs/powercut.md).

Medians and means over the rounds' per-step (per-exchange, per-commit)
figures. What a lower level saves is what a power cut can take
(docs/powercut.md): not a test, it reports.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runrecord import bare_db, one_bare_run, one_record_run  # noqa: E402

from durable_agents.memory import MemoryPolicy, Message, SQLiteStore  # noqa: E402
from durable_agents.runrecord.store import RunRecord  # noqa: E402
from durable_agents.wiring.memory import DEFAULT_MEMORY_MAX_MESSAGES, DEFAULT_MEMORY_MAX_TOKENS  # noqa: E402

TASK = "Confirm the refund for order 1234"
REPLY = "Hello,\n\nYour refund for order 1234 is confirmed and on its way.\n\nBest regards"


def one_exchange(store: SQLiteStore, run_id: str) -> float:
    """The flow's exchange: the task and the reply, appended one transaction each (remember_exchange)."""
    conversation = f"conv-{run_id}"
    start = time.perf_counter()
    store.append(conversation, Message(id=f"{run_id}:task", role="user", content=TASK))
    store.append(conversation, Message(id=f"{run_id}:reply", role="assistant", content=REPLY))
    return time.perf_counter() - start


def rollback_db(path: Path, level: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute(f"PRAGMA synchronous={level}")
    conn.execute("CREATE TABLE IF NOT EXISTS results (run_id TEXT PRIMARY KEY, result TEXT)")
    return conn


def one_rollback_commit(conn: sqlite3.Connection, run_id: str) -> float:
    start = time.perf_counter()
    conn.execute("INSERT INTO results VALUES (?, ?)", (run_id, "x" * 300))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs (3 steps, one exchange, one commit) per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the SQLite files go (default: a temp dir under .state)")
    args = parser.parse_args()

    base = Path(args.dir) if args.dir else Path(__file__).resolve().parent.parent / ".state"
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    policy = MemoryPolicy(max_tokens=DEFAULT_MEMORY_MAX_TOKENS, max_messages=DEFAULT_MEMORY_MAX_MESSAGES)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-sync-") as tmp:
        work = Path(tmp)
        full = RunRecord(work / "full.db", synchronous="FULL")
        normal = RunRecord(work / "normal.db", synchronous="NORMAL")
        bare = bare_db(work / "bare.db")
        memory_full = SQLiteStore(work / "memory-full.db", policy, synchronous="FULL")
        memory_normal = SQLiteStore(work / "memory-normal.db", policy, synchronous="NORMAL")
        rollback_full = rollback_db(work / "rollback-full.db", "FULL")
        rollback_extra = rollback_db(work / "rollback-extra.db", "EXTRA")
        lanes: dict[str, Callable[[str], float]] = {
            "full": lambda run: one_record_run(full, f"f{run}"),
            "normal": lambda run: one_record_run(normal, f"n{run}"),
            "bare": lambda run: one_bare_run(bare, f"b{run}"),
            "memory full": lambda run: one_exchange(memory_full, run),
            "memory normal": lambda run: one_exchange(memory_normal, run),
            "rollback full": lambda run: one_rollback_commit(rollback_full, run),
            "rollback extra": lambda run: one_rollback_commit(rollback_extra, run),
        }
        medians: dict[str, list[float]] = {k: [] for k in lanes}
        means: dict[str, list[float]] = {k: [] for k in lanes}
        for r in range(args.rounds):
            per: dict[str, list[float]] = {k: [] for k in lanes}
            for i in range(args.runs):
                for key, lane in lanes.items():
                    per[key].append(lane(f"{r}-{i}"))
            for key, values in per.items():
                medians[key].append(statistics.median(values))
                means[key].append(statistics.fmean(values))
        for closable in (full, normal, bare, memory_full, memory_normal, rollback_full, rollback_extra):
            closable.close()
    med = {k: statistics.median(v) * 1e6 for k, v in medians.items()}
    avg = {k: statistics.median(v) * 1e6 for k, v in means.items()}
    print(f"machine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"files under {base}; {args.rounds} rounds x {args.runs} runs, every lane interleaved run by run; "
          f"{time.monotonic() - started:.0f} s")
    print("the run record, per step (WAL)       median        mean")
    print(f"  bare insert + commit, FULL       {med['bare']:8.1f} us  {avg['bare']:8.1f} us   (baseline)")
    print(f"  record step, synchronous=FULL    {med['full']:8.1f} us  {avg['full']:8.1f} us   "
          f"{med['full'] / med['bare']:.2f}x the baseline")
    print(f"  record step, synchronous=NORMAL  {med['normal']:8.1f} us  {avg['normal']:8.1f} us   "
          f"{med['normal'] / med['bare']:.2f}x the baseline")
    print(f"  FULL / NORMAL                    {med['full'] / med['normal']:8.2f}x     "
          f"{avg['full'] / avg['normal']:8.2f}x   (what the fsync per commit costs)")
    print("memory, per exchange (two appends, WAL)")
    print(f"  synchronous=FULL (the default)   {med['memory full']:8.1f} us  {avg['memory full']:8.1f} us")
    print(f"  synchronous=NORMAL               {med['memory normal']:8.1f} us  {avg['memory normal']:8.1f} us")
    print(f"  FULL - NORMAL                    {med['memory full'] - med['memory normal']:+8.1f} us  "
          f"{avg['memory full'] - avg['memory normal']:+8.1f} us   "
          f"({med['memory full'] / med['memory normal']:.2f}x; what the two fsyncs cost)")
    print("a rollback-journal commit (the dev server's and DBOS's journal)")
    print(f"  synchronous=FULL                 {med['rollback full']:8.1f} us  {avg['rollback full']:8.1f} us")
    print(f"  synchronous=EXTRA                {med['rollback extra']:8.1f} us  {avg['rollback extra']:8.1f} us")
    print(f"  EXTRA - FULL                     {med['rollback extra'] - med['rollback full']:+8.1f} us  "
          f"{avg['rollback extra'] - avg['rollback full']:+8.1f} us   "
          f"({med['rollback extra'] / med['rollback full']:.2f}x; the directory's fsync)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
