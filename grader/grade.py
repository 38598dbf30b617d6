"""Grade a learner's exercise under real kills.

    python -m grader.grade N [--impl practice|solution|PATH] [--only K] [--keep] [--json] [--report PATH]
    python -m grader.grade N --class DIR [--jobs J] [--only K] [--json] [--report PATH]

Runs the checks of exercises 1..N (each exercise builds on the last) against
the learner's program: ``--impl practice`` (the default) is the
exercise's ``practice/`` folder, ``solution`` its ``solution/``, any other
value a folder holding the exercise's main file (``flow.py``; ``worker.py``
for exercise 6, ``agent_loop.py`` for 7: ``Check.main_file``), or the file
itself. The checks, their deadlines and main files: ``grader.registry``. ``--only K`` runs
check K alone.

It starts its own provider (``python -m provider``) and model stand-in, runs
the learner's program as real processes, kills them with SIGKILL at the
lab's crash points and between its commits, and judges by what the provider
and the model saw and what the record file holds (``grader/check_*.py``). It
writes only into a work folder of its own (removed afterwards unless
``--keep``) and leaves nothing running.

``--json`` prints one machine-readable result per check on stdout (the
progress goes to stderr); ``--report PATH`` writes the same into PATH
(``grader.report``; the fields: exercises/README.md, "Grading a class").
``--class DIR`` grades each subfolder of DIR as one learner's submission
(``grader.classroom``): one table, and the JSON with ``--json`` or ``--report``.

Exit codes: 0 every check passed; 1 a check failed (what was expected, what
was seen, which TODO to look at); 2 bad input; 3 the learner's program could
not run (its exception, trimmed to the learner's files).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from grader.evidence import SchemaChanged
from grader.harness import CouldNotRun, Failed, Harness, Skipped
from grader.model import ModelStandIn
from grader.quick_check import quick_check_answer
from grader.registry import CHECKS
from grader.report import CheckResult, Grading, skipped_parts, todo_numbers
from lab.processes import REPO
from lab.provider_process import start_provider

EXERCISES = REPO / "exercises"


class BadInput(Exception):
    pass


def exercise_folder(n: int) -> Path:
    found = sorted(EXERCISES.glob(f"{n:02d}-*"))
    if not found:
        raise BadInput(f"there is no exercise {n}: the exercises are {', '.join(exercise_numbers())}")
    return found[0]


def exercise_numbers() -> list[str]:
    return [p.name.split("-")[0].lstrip("0") for p in sorted(EXERCISES.glob("[0-9][0-9]-*"))]


def resolve_impl(n: int, impl: str) -> Path:
    if impl in ("practice", "solution"):
        return exercise_folder(n) / impl
    main = CHECKS[n].main_file
    path = Path(impl).expanduser()
    if path.is_file() and path.name == main:
        path = path.parent
    if not (path / main).is_file():
        raise BadInput(f"--impl {impl}: no {main} there. Give the folder that holds your {main} "
                       f"(e.g. {exercise_folder(n).relative_to(REPO)}/practice), or practice or solution")
    return path.resolve()


def checks_to_run(n: int, only: int | None) -> list[int]:
    """``grade N`` runs checks 1..N (each builds on the last), or N alone if it stands alone; ``--only K``: K."""
    if only:
        return [only]
    return [n] if CHECKS[n].stands_alone else [k for k in CHECKS if k <= n and not CHECKS[k].stands_alone]


def shown_path(impl: Path) -> Path:
    return impl.relative_to(REPO) if impl.is_relative_to(REPO) else impl


def print_failure(err: Failed, out: TextIO) -> None:
    print(f"  FAIL: {err.headline}", file=out)
    print(f"    expected: {err.expected}", file=out)
    print(f"    seen:     {err.seen}", file=out)
    print(f"    look at:  {err.look_at}", file=out)


def run_check(k: int, harness: Harness, out: TextIO) -> CheckResult:
    """Check ``k`` on the learner's program: its result, printed as it goes."""
    check = CHECKS[k]
    print(f"check {k}: {check.title}", file=out, flush=True)
    began, processes = time.monotonic(), harness.processes
    harness.deadline = began + check.seconds
    result = CheckResult(k, check.title, "failed")
    try:
        result.shown = check.run(harness)
        result.status = "passed"
    except Failed as err:
        print_failure(err, out)
        result.headline, result.expected, result.seen, result.todo = (err.headline, err.expected, err.seen,
                                                                      err.look_at)
    except SchemaChanged as err:
        print(f"  FAIL: {err}", file=out)
        result.headline = str(err)
    except CouldNotRun as err:
        print(f"  your program could not run: {err.what}", file=out)
        print("    " + err.traceback.replace("\n", "\n    "), file=out)
        result.headline, result.traceback = f"your program could not run: {err.what}", err.traceback
    except Skipped as err:
        print(f"  SKIPPED: {err}", file=out)
        result.status, result.headline = "skipped", str(err)
    result.processes, result.seconds = harness.processes - processes, time.monotonic() - began
    result.todos, result.skipped = todo_numbers(result.todo), skipped_parts(result.shown)
    if result.status == "passed":
        for line in result.shown:
            print(f"  - {line}", file=out)
        print(f"  PASS ({result.processes} processes, {result.seconds:.1f} s)", file=out)
    return result


def grade(n: int, impl: Path, only: int | None, keep: bool, out: TextIO = sys.stdout) -> Grading:
    numbers = checks_to_run(n, only)
    alone = CHECKS[n].stands_alone
    grading = Grading(n, str(shown_path(impl)), CHECKS[n].main_file)
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="grade-"))
    print(f"grading exercise {n}: {shown_path(impl)}/{CHECKS[n].main_file}, check{'s' if len(numbers) > 1 else ''} "
          f"{', '.join(map(str, numbers))}" + (f" ({alone})" if alone and not only else ""), file=out)
    if keep:
        print(f"(work folder: {work}, kept at the end)", file=out, flush=True)
    provider = None
    model = ModelStandIn().start()
    harness: Harness | None = None
    try:
        provider = start_provider(work / "provider.db")
        harness = Harness(impl, work, provider.url, model, CHECKS[n].main_file)
        for i, k in enumerate(numbers):
            result = run_check(k, harness, out)
            grading.checks.append(result)
            if result.status == "failed":  # the next exercise builds on this one: its verdict would say nothing
                grading.checks += [CheckResult(later, CHECKS[later].title, "skipped",
                                               headline=f"not run: check {k} failed, and this check builds on it")
                                   for later in numbers[i + 1:]]
                break
            if k == 3 and n == 3:  # exercise 3's quick check, answered where the learner grades it
                quick_check_answer(harness, out)
    finally:
        if harness is not None:
            harness.stop_all()
        if provider is not None:
            provider.kill()
        model.stop()
        if keep:
            print(f"(work folder kept: {work})", file=out)
        else:
            shutil.rmtree(work, ignore_errors=True)
    grading.seconds = time.monotonic() - began
    failed = [c for c in grading.checks if c.status == "failed"]
    skipped = [c for c in grading.checks if c.status == "skipped"]
    if any(c.traceback for c in failed):
        grading.verdict, grading.exit = "could_not_run", 3
    elif failed:
        grading.verdict, grading.exit = "failed", 1
        print(f"exercise {n}: not yet. Fix what the failed check names, then run this again.", file=out)
    else:
        print(f"exercise {n}: every check passed"
              + (f"; skipped: {', '.join(f'check {c.check} ({c.headline})' for c in skipped)}" if skipped else "")
              + ".", file=out)
    return grading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.grade", description=__doc__.splitlines()[0])
    parser.add_argument("n", metavar="N", help="the exercise to grade: its checks and those before it run")
    parser.add_argument("--impl", default=None,
                        help="practice (default), solution, or the folder holding your flow.py")
    parser.add_argument("--only", type=int, default=None, metavar="K", help="run check K alone")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (the record, the provider's store)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as JSON on stdout, one entry per check (progress goes to stderr)")
    parser.add_argument("--report", metavar="PATH", default=None, help="write the result as JSON into PATH")
    parser.add_argument("--class", dest="klass", metavar="DIR", default=None,
                        help="grade each subfolder of DIR as one learner's submission")
    parser.add_argument("--jobs", type=int, default=1, metavar="J",
                        help="with --class: submissions graded at once (1; more is refused: exercises/README.md)")
    args = parser.parse_args(argv)
    # A SIGTERM ends the grading like Ctrl-C: through the finally blocks, so nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = sys.stderr if args.json else sys.stdout
    try:
        if not args.n.isdigit() or int(args.n) not in CHECKS:
            raise BadInput(f"N={args.n!r}: give the number of an exercise the grader checks: "
                           f"{', '.join(map(str, sorted(CHECKS)))}")
        n = int(args.n)
        if args.only is not None and not 1 <= args.only <= n:
            raise BadInput(f"--only {args.only}: give a check between 1 and {n}")
        if args.klass is not None:
            from grader.classroom import grade_class  # the class runner starts one of these per submission

            if args.impl is not None or args.keep:
                raise BadInput("--class grades every subfolder of DIR: give no --impl (nor --keep) with it")
            return grade_class(n, Path(args.klass), args.only, checks_to_run(n, args.only), args.jobs, out,
                               args.json, args.report)
        if args.jobs != 1:
            raise BadInput(f"--jobs {args.jobs}: only with --class DIR (one grading runs its checks itself)")
        impl = resolve_impl(n, args.impl or "practice")
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        if args.report or args.json:  # a machine reading the result learns why there is none
            refused = Grading(int(args.n) if args.n.isdigit() else 0, str(args.impl or args.klass or "practice"),
                              "", verdict="bad_input", exit=2, message=str(err))
            emit(refused.to_json(), args.json, args.report)
        return 2
    grading = grade(n, impl, args.only, args.keep, out)
    emit(grading.to_json(), args.json, args.report)
    return grading.exit


def emit(found: dict, to_stdout: bool, path: str | None) -> None:
    text = json.dumps(found, indent=2)
    if path:
        Path(path).write_text(text + "\n")
    if to_stdout:
        print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
