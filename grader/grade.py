"""Grade a learner's exercise under real kills.

    python -m grader.grade N [--impl practice|solution|PATH] [--only K] [--keep]

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
and the model saw and what the record file holds (``grader.checks``). It
writes only into a work folder of its own (removed afterwards unless
``--keep``) and leaves nothing running.

Exit codes: 0 every check passed; 1 a check failed (what was expected, what
was seen, which TODO to look at); 2 bad input; 3 the learner's program could
not run (its exception, trimmed to the learner's files).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from grader.evidence import SchemaChanged
from grader.harness import CouldNotRun, Failed, Harness
from grader.model import ModelStandIn
from grader.registry import CHECKS
from lab.processes import REPO
from lab.provider_process import start_provider
from steps.keys import idempotency_key

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


def print_failure(err: Failed) -> None:
    print(f"  FAIL: {err.headline}")
    print(f"    expected: {err.expected}")
    print(f"    seen:     {err.seen}")
    print(f"    look at:  {err.look_at}")


def quick_check_answer(h: Harness) -> None:
    """The answer to exercise 3's quick check, with the evidence of the learner's own run."""
    run = h.evidence_runs.get("scenario")
    chain = h.evidence_runs.get("every_kill")
    if run is None:
        return
    seen = h.witnesses(run)
    record = h.record(run)
    email = next(e for e in seen.applied("send_confirmation"))
    sent = record.result("send_confirmation") or {}
    print()
    print('Quick check (exercise 3\'s README): "A four-step job crashes after step two, which sent an email.')
    print('What must resuming not do?"')
    print("  Answer: it must not send the email again, nor run steps 1 and 2 again. It continues at step three,")
    print("  with step two's recorded result (the email's message id, which the ticket cites) read from the record.")
    print(f"  Your run {run.run_id} showed it, killed between step 2 and step 3 and resumed:")
    print(f"    - the model wrote {seen.drafts} draft in all: the resume asked for none;")
    print(f"    - the email's key {email.key}: {email.requests} request, {email.applied} applied: "
          "the resume sent none;")
    print(f"    - the ticket cites message id {sent.get('message_id')}, read from your record's "
          "send_confirmation row.")
    if chain is not None:
        key = idempotency_key(chain.run_id, "send_confirmation")
        again = next((e for e in h.witnesses(chain).applied("send_confirmation")), None)
        if again is not None:
            print("  An effect left in doubt (sent, not yet recorded) may be repeated only with the same key: your run")
            print(f"  {chain.run_id}, killed right after the provider accepted its email, sent it again on resume "
                  f"under {again.key if again.key != key else 'the same key'}: {again.requests} requests, "
                  f"{again.applied} applied.")


def grade(n: int, impl: Path, only: int | None, keep: bool) -> int:
    alone = CHECKS[n].stands_alone
    numbers = [only] if only else [n] if alone else [k for k in CHECKS if k <= n and not CHECKS[k].stands_alone]
    work = Path(tempfile.mkdtemp(prefix="grade-"))
    shown = impl.relative_to(REPO) if impl.is_relative_to(REPO) else impl
    print(f"grading exercise {n}: {shown}/{CHECKS[n].main_file}, check{'s' if len(numbers) > 1 else ''} "
          f"{', '.join(map(str, numbers))}" + (f" ({alone})" if alone and not only else ""))
    if keep:
        print(f"(work folder: {work}, kept at the end)", flush=True)
    provider = None
    model = ModelStandIn().start()
    harness: Harness | None = None
    failed = 0
    try:
        provider = start_provider(work / "provider.db")
        harness = Harness(impl, work, provider.url, model, CHECKS[n].main_file)
        for k in numbers:
            check = CHECKS[k]
            print(f"check {k}: {check.title}")
            began, processes = time.monotonic(), harness.processes
            harness.deadline = began + check.seconds
            try:
                lines = check.run(harness)
            except Failed as err:
                print_failure(err)
                failed += 1
                break  # the next exercise builds on this one
            except SchemaChanged as err:
                print(f"  FAIL: {err}")
                failed += 1
                break
            except CouldNotRun as err:
                print(f"  your program could not run: {err.what}")
                print("    " + err.traceback.replace("\n", "\n    "))
                return 3
            for line in lines:
                print(f"  - {line}")
            print(f"  PASS ({harness.processes - processes} processes, {time.monotonic() - began:.1f} s)")
            if k == 3 and n == 3:  # exercise 3's quick check, answered where the learner grades it
                quick_check_answer(harness)
    finally:
        if harness is not None:
            harness.stop_all()
        if provider is not None:
            provider.kill()
        model.stop()
        if keep:
            print(f"(work folder kept: {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"exercise {n}: not yet. Fix what the failed check names, then run this again.")
        return 1
    print(f"exercise {n}: every check passed.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.grade", description=__doc__.splitlines()[0])
    parser.add_argument("n", metavar="N", help="the exercise to grade: its checks and those before it run")
    parser.add_argument("--impl", default="practice",
                        help="practice (default), solution, or the folder holding your flow.py")
    parser.add_argument("--only", type=int, default=None, metavar="K", help="run check K alone")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (the record, the provider's store)")
    args = parser.parse_args(argv)
    # A SIGTERM ends the grading like Ctrl-C: through the finally blocks, so nothing is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if not args.n.isdigit() or int(args.n) not in CHECKS:
            raise BadInput(f"N={args.n!r}: give the number of an exercise the grader checks: "
                           f"{', '.join(map(str, sorted(CHECKS)))}")
        n = int(args.n)
        if args.only is not None and not 1 <= args.only <= n:
            raise BadInput(f"--only {args.only}: give a check between 1 and {n}")
        impl = resolve_impl(n, args.impl)
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return grade(n, impl, args.only, args.keep)


if __name__ == "__main__":
    sys.exit(main())
