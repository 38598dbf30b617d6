"""What one grading found, as data: one result per check, and the grading's verdict.

``python -m grader.grade N --json`` prints it, ``--report PATH`` writes it, and ``--class DIR``
(``grader.classroom``) gathers one per learner. The fields are the contract a course's own tooling reads;
exercises/README.md ("Grading a class") documents each, so a renamed field is a change to that page too.

A check's ``status`` is ``passed``, ``failed`` or ``skipped``: skipped when a check before it failed (each
exercise builds on the last, so its verdict would say nothing), or when the check itself could not be run on
this machine (``grader.harness.Skipped``: its reason is the headline). A check that ran may still have left out a
part this machine cannot do (checks 1 and 3's power cuts without FUSE): it says so in a line of its own,
``<part> skipped: <reason>``, which ``skipped`` lists. A skip never fails a grading.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["passed", "failed", "skipped"]
Verdict = Literal["passed", "failed", "could_not_run", "bad_input", "did_not_finish"]
_TODO = re.compile(r"TODO (\d+) \(exercise \d+\)")
_PART_SKIPPED = re.compile(r"^[\w ,-]+ skipped: ")  # e.g. "power cuts skipped: there is no /dev/fuse ..."


@dataclass
class CheckResult:
    check: int
    title: str
    status: Status
    headline: str = ""  # failed: what went wrong; skipped: why it did not run
    expected: str = ""
    seen: str = ""
    todo: str = ""  # the "look at" line, as printed
    todos: list[int] = field(default_factory=list)  # the TODO numbers it names, for tallies across a class
    traceback: str = ""  # the learner's own exception, when the program could not run
    shown: list[str] = field(default_factory=list)  # what a passing check showed, one line each
    skipped: list[str] = field(default_factory=list)  # the parts of it this machine could not do, with the reason
    processes: int = 0  # the learner's processes this check started
    seconds: float = 0.0


def todo_numbers(look_at: str) -> list[int]:
    """The TODOs a "look at" line names (``TODO n (exercise e) in FILE: ...``), in order."""
    return [int(n) for n in _TODO.findall(look_at)]


def skipped_parts(shown: list[str]) -> list[str]:
    """The lines of a check's report that say a part of it was skipped here, and why."""
    return [line for line in shown if _PART_SKIPPED.match(line)]


@dataclass
class Grading:
    exercise: int
    impl: str
    main_file: str
    verdict: Verdict = "passed"
    exit: int = 0
    seconds: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)
    message: str = ""  # for bad_input and did_not_finish: what the grader said instead of grading

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        found["seconds"] = round(self.seconds, 2)
        for check in found["checks"]:
            check["seconds"] = round(check["seconds"], 2)
        return found

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> Grading:
        found = json.loads(path.read_text())
        found["checks"] = [CheckResult(**c) for c in found.get("checks", [])]
        return cls(**found)
