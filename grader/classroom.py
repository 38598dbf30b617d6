"""Grade a class: each subfolder of DIR is one learner's submission, graded as that learner would grade it.

    python -m grader.grade N --class DIR [--jobs J] [--only K] [--json] [--report PATH]

Each submission is one ``python -m grader.grade N --impl SUBFOLDER --report FILE`` process of its own, so
nothing is shared between two learners: each grading starts its own provider (its own store, on a port it
binds itself), its own model stand-in (the same), its own work folder and record file, and for exercise 6
its own Temporal dev server. A submission that crashes is that grading's exit 3; one that hangs is failed by
the grading's own deadlines, and a grading that still runs past the sum of its checks' deadlines (plus
``STARTUP_SECONDS``) is stopped (SIGTERM, which ends it through its cleanup) and reported ``did_not_finish``.
Either way the next submission is graded: a submission fails alone.

One at a time. ``--jobs J`` would grade J submissions side by side, and is refused above ``MAX_JOBS``:
two gradings side by side on a 2-core machine failed correct solutions at exercise 5's retry-budget check
(``bench/bench_grader_jobs.py``; the figures in exercises/README.md), so ``MAX_JOBS`` stays 1 until that
bench shows every verdict holding two at a time.

A submission is the learner's code, and it runs with the grader's rights (the user running this command, its
files, its network). Grade a class you do not trust inside a container or a virtual machine of its own.

Output: one line per submission as it finishes, then one table (learner, each check, the verdict, seconds),
and with ``--json``/``--report`` one JSON document (``ClassReport``; fields in exercises/README.md).
Exit code: 0 every submission passed, 1 one or more did not, 2 bad input.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from grader.harness import last_lines
from grader.registry import CHECKS
from grader.report import CheckResult, Grading
from lab.processes import REPO

MAX_JOBS = 1
"""How many gradings may run side by side: raise it only once ``bench/bench_grader_jobs.py`` shows every verdict
holding at that many (it did not at 2: see ``WHY_ONE``)."""
WHY_ONE = ("two gradings side by side failed correct solutions at exercise 5's check: the 2 s retry budget's run "
           "was still running at its 8 s deadline (bench/bench_grader_jobs.py, 2026-12-01; exercises/README.md, "
           "Grading a class)")
STARTUP_SECONDS = 60.0
"""Beyond the checks' deadlines: the grading's own start (provider, model stand-in, imports) and its cleanup."""
STOP_SECONDS = 30.0
"""How long a grading that was sent SIGTERM may take to stop its processes before it is SIGKILLed."""


class BadClass(Exception):
    pass


class Stopped(Exception):
    pass


@dataclass
class ClassReport:
    exercise: int
    folder: str
    checks: list[int]
    jobs: int
    seconds: float = 0.0
    learners: dict[str, Grading] = field(default_factory=dict)

    @property
    def exit(self) -> int:
        return 0 if all(g.verdict == "passed" for g in self.learners.values()) else 1

    def to_json(self) -> dict[str, Any]:
        return {"exercise": self.exercise, "class": self.folder, "checks": self.checks, "jobs": self.jobs,
                "exit": self.exit, "seconds": round(self.seconds, 2),
                "learners": [{"learner": name, **grading.to_json()} for name, grading in self.learners.items()]}


def submissions(folder: Path) -> list[Path]:
    """The learners' folders: every subfolder of ``folder`` but hidden ones and caches, by name."""
    if not folder.is_dir():
        raise BadClass(f"--class {folder}: no such folder. Give a folder with one subfolder per learner")
    found = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    if not found:
        raise BadClass(f"--class {folder}: it has no subfolder. Put each learner's submission in a subfolder of "
                       "its own, named after the learner")
    return found


def time_limit(numbers: list[int]) -> float:
    override = os.environ.get("GRADER_SUBMISSION_SECONDS")  # tests shorten it
    return float(override) if override else sum(CHECKS[k].seconds for k in numbers) + STARTUP_SECONDS


class Gradings:
    """The graders running now, so that a class stopped midway (Ctrl-C, SIGTERM) stops every one of them."""

    def __init__(self) -> None:
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def grade(self, n: int, folder: Path, only: int | None, numbers: list[int], logs: Path) -> Grading:
        report = logs / f"{folder.name}.json"
        argv = [sys.executable, "-m", "grader.grade", str(n), "--impl", str(folder), "--report", str(report),
                *(["--only", str(only)] if only else [])]
        began, limit = time.monotonic(), time_limit(numbers)
        with self.lock, open(logs / f"{folder.name}.log", "w") as log:
            if self.stopping:
                raise Stopped("the class's grading is being stopped: no new grading")
            proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # its own group: a Ctrl-C here is passed on by us
            self.live.add(proc)
        try:
            code = proc.wait(timeout=limit)
            stopped = False
        except subprocess.TimeoutExpired:
            stop(proc)
            code, stopped = proc.returncode, True
        finally:
            with self.lock:
                self.live.discard(proc)
        printed = (logs / f"{folder.name}.log").read_text(errors="replace")
        if stopped:
            return Grading(n, str(folder), CHECKS[n].main_file, verdict="did_not_finish", exit=code,
                           seconds=time.monotonic() - began,
                           message=f"the grading was still running after {limit:.0f} s (the sum of its checks' "
                                   f"deadlines and {STARTUP_SECONDS:.0f} s to start): stopped. Its last lines: "
                                   f"{last_lines(printed)}")
        try:
            grading = Grading.read(report)
        except (OSError, ValueError, TypeError):  # it died before it could write its report
            return Grading(n, str(folder), CHECKS[n].main_file, verdict="did_not_finish", exit=code,
                           seconds=time.monotonic() - began,
                           message=f"the grading ended (exit {code}) without its report. Its last lines: "
                                   f"{last_lines(printed)}")
        return grading

    def stop_all(self) -> None:
        with self.lock:
            self.stopping = True
            live = list(self.live)
        for proc in live:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the grader's cleanup stops its provider and the learner's processes), then SIGKILL."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def grade_class(n: int, folder: Path, only: int | None, numbers: list[int], jobs: int, out: TextIO, to_stdout: bool,
                report_path: str | None) -> int:
    """Grade every submission in ``folder`` (``numbers``: the checks ``grade N [--only K]`` runs)."""
    try:
        if not 1 <= jobs <= MAX_JOBS:
            raise BadClass(f"--jobs {jobs}: refused, at most {MAX_JOBS}: gradings side by side share the machine's "
                           f"cores and the checks judge time; {WHY_ONE}. Grade one at a time (leave out --jobs)")
        learners = submissions(folder)
    except BadClass as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = ClassReport(n, str(folder), numbers, jobs)
    print(f"grading exercise {n} for {len(learners)} learner(s) in {folder}, check(s) {', '.join(map(str, numbers))}"
          f", {jobs} at a time", file=out, flush=True)
    began = time.monotonic()
    gradings = Gradings()
    with tempfile.TemporaryDirectory(prefix="grade-class-") as logs:

        def one(learner: Path) -> Grading:
            grading = gradings.grade(n, learner, only, numbers, Path(logs))
            print(f"  {learner.name}: {grading.verdict} ({grading.seconds:.1f} s)", file=out, flush=True)
            return grading

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            try:
                done = list(pool.map(one, learners))
            finally:  # also on Ctrl-C or SIGTERM: the gradings still running stop before the pool waits for them
                gradings.stop_all()
    report.learners = {learner.name: grading for learner, grading in zip(learners, done, strict=True)}
    report.seconds = time.monotonic() - began
    print(table(report), file=out)
    text = json.dumps(report.to_json(), indent=2)
    if report_path:
        Path(report_path).write_text(text + "\n")
    if to_stdout:
        print(text, flush=True)
    return report.exit


CELL = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}


def table(report: ClassReport) -> str:
    """One row per learner: each check's status, the verdict, the seconds; then each failure in one line."""
    head = ["learner", *(f"check {k}" for k in report.checks), "verdict", "seconds"]
    rows = []
    for name, grading in report.learners.items():
        status = {c.check: CELL[c.status] for c in grading.checks}
        rows.append([name, *(status.get(k, "-") for k in report.checks), grading.verdict, f"{grading.seconds:.1f}"])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    for name, grading in report.learners.items():
        why = first_failure(grading)
        if why:
            lines.append(f"{name}: {why}")
    return "\n".join(["", *lines])


def first_failure(grading: Grading) -> str:
    failed: CheckResult | None = next((c for c in grading.checks if c.status == "failed"), None)
    if failed is not None:
        return f"check {failed.check}: {failed.headline}" + (f" (look at {failed.todo})" if failed.todo else "")
    return grading.message
