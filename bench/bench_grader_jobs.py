"""Do the checks' verdicts hold with two gradings side by side? What ``--class DIR --jobs 2`` rests on.

    .venv/bin/python bench/bench_grader_jobs.py [--exercises 5,6,7]

For each exercise, a class is built in a temporary folder: its solution twice, and every wrong answer
``tests/test_grader.py`` keeps for that exercise's check (the solution with one change). The class is graded one
at a time (the baseline, on the machine as loaded as it is), then two at a time (``grader.classroom``, each
submission ``--only N``), and each verdict is compared with the one the suite expects: the solutions pass, each
wrong answer fails with its own message. Exercise 5's check is the timing check (retry budgets judged on the
provider's clock, a hang judged by a deadline); 6's has the attempts' timeouts and the stages' deadlines; 7's the
deadlines only. Then exercise 5 graded whole (checks 1-5)
for two solutions, one at a time and two at a time, for the wall time each way.

Not a test: it reports, it does not assert; the outcome is recorded in exercises/README.md ("Grading a class")
and decides ``grader.classroom.MAX_JOBS``. Run it on the machine the class is graded on.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grader.classroom import Gradings  # noqa: E402
from grader.grade import checks_to_run  # noqa: E402
from grader.report import Grading  # noqa: E402

# The suite's wrong answers, read from its file rather than imported: bench/ does not depend on tests/ as a package
# (tests/test_architecture.py), and these are data, the very list `make test` grades.
_SUITE = runpy.run_path(str(REPO / "tests" / "test_grader.py"))
FOLDERS, WRONG_ANSWERS = _SUITE["FOLDERS"], _SUITE["WRONG_ANSWERS"]


def build_class(folder: Path, n: int) -> dict[str, tuple[str, ...]]:
    """The class's submissions for exercise ``n``: name -> the needles its grading must print (none: it passes)."""
    expected: dict[str, tuple[str, ...]] = {}
    for name in ("solution-a", "solution-b"):
        shutil.copytree(FOLDERS[n] / "solution", folder / name)
        expected[name] = ()
    for i, wrong in enumerate(w for w in WRONG_ANSWERS if w.check == n and w.exercise == n):
        learner = folder / f"wrong-{i + 1}"
        shutil.copytree(FOLDERS[n] / "solution", learner)
        text = (learner / wrong.file).read_text()
        if text.count(wrong.old) != 1:
            print(f"  (left out: {wrong.name!r}, the solution no longer has the code it changes)")
            shutil.rmtree(learner)
            continue
        text = text.replace(wrong.old, wrong.new)
        if wrong.also:
            text = text.replace(*wrong.also)
        (learner / wrong.file).write_text(text)
        expected[learner.name] = wrong.message
    return expected


def text_of(grading: Grading) -> str:
    return " ".join(f"{c.headline} {c.expected} {c.seen} {c.todo}" for c in grading.checks) + grading.message


def grade_all(n: int, folder: Path, only: int | None, jobs: int) -> tuple[dict[str, Grading], float]:
    learners = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    gradings, logs = Gradings(), folder / ".logs"
    logs.mkdir(exist_ok=True)
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(lambda p: gradings.grade(n, p, only, checks_to_run(n, only), logs), learners))
    return {p.name: g for p, g in zip(learners, done, strict=True)}, time.monotonic() - began


def judge(n: int, expected: dict[str, tuple[str, ...]], found: dict[str, Grading]) -> int:
    wrong = 0
    for name, needles in expected.items():
        grading = found[name]
        if not needles:
            held = grading.verdict == "passed"
        else:
            held = grading.verdict == "failed" and all(needle in text_of(grading) for needle in needles)
        wrong += not held
        spent = "; ".join(f"check {c.check} {c.seconds:.1f} s" for c in grading.checks)
        print(f"  exercise {n} {name:12} {'held ' if held else 'BROKE'} {grading.verdict:14} {spent}"
              + ("" if held else f"\n      expected {needles or 'a pass'}; saw: {text_of(grading)[:400]}"))
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercises", default="5,6,7")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start")
    broke = {1: 0, 2: 0}
    for n in (int(x) for x in args.exercises.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"bench-jobs-{n}-") as tmp:
            expected = build_class(Path(tmp), n)
            for jobs in (1, 2):  # one at a time first: the baseline, on the machine as loaded as it is now
                found, seconds = grade_all(n, Path(tmp), n, jobs)
                print(f"exercise {n}, check {n} alone, {len(expected)} submissions {jobs} at a time: {seconds:.0f} s, "
                      f"load average {os.getloadavg()[0]:.1f}")
                broke[jobs] += judge(n, expected, found)
    with tempfile.TemporaryDirectory(prefix="bench-jobs-whole-") as tmp:
        for name in ("solution-a", "solution-b"):
            shutil.copytree(FOLDERS[5] / "solution", Path(tmp) / name)
        walls = {}
        for jobs in (1, 2):
            found, walls[jobs] = grade_all(5, Path(tmp), None, jobs)
            print(f"exercise 5 whole (checks 1-5), two solutions, {jobs} at a time: {walls[jobs]:.0f} s")
            broke[jobs] += judge(5, {"solution-a": (), "solution-b": ()}, found)
        print(f"two at a time / one at a time: {walls[2] / walls[1]:.2f}x the wall time")
    print(f"load average {os.getloadavg()[0]:.1f} at the end; verdicts that differ from the suite's: "
          f"{broke[1]} one at a time, {broke[2]} two at a time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
