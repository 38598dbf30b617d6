"""What synchronous=FULL costs the run record per step, against NORMAL.

    .venv/bin/python bench/bench_sync_levels.py [--runs 300] [--rounds 5] [--dir DIR]

All in this one invocation, on files in one directory (WAL on each):

- record step at FULL: ``RunRecord.complete_step``, the runner's commit when a
  step succeeds (bench_runrecord.py's ``one_record_run``), the WAL fsynced at
  every commit: what the record runs with;
- the same at NORMAL (``RunRecord(..., synchronous="NORMAL")``): the WAL is
  synced only at checkpoints (SQLite's automatic one every 1,000 WAL pages
  happens inside the timed commits, so the mean carries it);
- the baseline: a bare ``INSERT`` of the same result, committed at FULL, as in
  bench_runrecord.py.

The three are interleaved run by run, so they see the same disk. Medians and
means over the rounds' per-step figures. What NORMAL saves is what a power cut
can take (tests/test_power_cut.py, docs/runrecord.md): not a test, it reports.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runrecord import bare_db, one_bare_run, one_record_run  # noqa: E402

from runrecord.store import RunRecord  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs (3 steps each) per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the SQLite files go (default: a temp dir under .state)")
    args = parser.parse_args()

    base = Path(args.dir) if args.dir else Path(__file__).resolve().parent.parent / ".state"
    base.mkdir(parents=True, exist_ok=True)
    medians: dict[str, list[float]] = {"full": [], "normal": [], "bare": []}
    means: dict[str, list[float]] = {"full": [], "normal": [], "bare": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-sync-") as tmp:
        full = RunRecord(Path(tmp) / "full.db", synchronous="FULL")
        normal = RunRecord(Path(tmp) / "normal.db", synchronous="NORMAL")
        bare = bare_db(Path(tmp) / "bare.db")
        for r in range(args.rounds):
            per: dict[str, list[float]] = {"full": [], "normal": [], "bare": []}
            for i in range(args.runs):
                per["full"].append(one_record_run(full, f"f{r}-{i}"))
                per["normal"].append(one_record_run(normal, f"n{r}-{i}"))
                per["bare"].append(one_bare_run(bare, f"b{r}-{i}"))
            for key, values in per.items():
                medians[key].append(statistics.median(values))
                means[key].append(statistics.fmean(values))
        full.close()
        normal.close()
        bare.close()
    med = {k: statistics.median(v) * 1e6 for k, v in medians.items()}
    avg = {k: statistics.median(v) * 1e6 for k, v in means.items()}
    print(f"machine: {os.cpu_count()} cores (nproc), Python {platform.python_version()}, {platform.platform()}")
    print(f"files under {base} (WAL); {args.rounds} rounds x {args.runs} runs x 3 steps, interleaved; "
          f"{time.monotonic() - started:.0f} s")
    print("                                   median/step   mean/step")
    print(f"  bare insert + commit, FULL       {med['bare']:8.1f} us  {avg['bare']:8.1f} us   (baseline)")
    print(f"  record step, synchronous=FULL    {med['full']:8.1f} us  {avg['full']:8.1f} us   "
          f"{med['full'] / med['bare']:.2f}x the baseline")
    print(f"  record step, synchronous=NORMAL  {med['normal']:8.1f} us  {avg['normal']:8.1f} us   "
          f"{med['normal'] / med['bare']:.2f}x the baseline")
    print(f"  FULL / NORMAL                    {med['full'] / med['normal']:8.2f}x     "
          f"{avg['full'] / avg['normal']:8.2f}x   (what the fsync per commit costs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
