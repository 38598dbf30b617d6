"""The line an engine prints each time it begins executing a step, written and read here only.

    step <name> started: run <run id> attempt <n>

Every engine prints it once per execution, just before it calls the step
function: the Temporal activity wrapper (``activities``, as a log record
whose format is ``STARTED``), the run record's runner (``durable_agents.runrecord.runner``),
the DBOS flow (``durable_agents.dbosflow.engine``) and the in-memory "before"
(``lesson.in_memory``). The lab's drivers (``lab.engines``), the lessons and
the tests count executions with ``started_in``: a step that ran again after a
restart is a second line, whatever the engine's own record says.

The exercises' programs (``exercises/*/practice`` and ``solution``) print
the same words as literal text, without `` attempt <n>`` (a learner's first
record keeps no attempt number); ``parse_started`` reads those too, with
``attempt`` None. A learner's file keeps its literal: it imports nothing of
the finished engines.

A line may carry a prefix (a log record's time, level and logger name):
the words are found anywhere in it, from ``step`` on, as long as they begin
the line or follow a space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STARTED = "step %s started: run %s attempt %d"
"""The line's format, ``%``-style so that ``logging`` can take it with its arguments unformatted."""

# A step's name: the flow's (``send_confirmation``), or the agent loop's (``turn-3``, ``turn-3/call-1``).
_LINE = re.compile(r"(?:^|(?<=\s))step (?P<step>\w+(?:-\d+(?:/call-\d+)?)?) started: "
                   r"run (?P<run_id>[A-Za-z0-9][A-Za-z0-9._-]*)(?: attempt (?P<attempt>\d+))?")


@dataclass(frozen=True)
class Started:
    """One execution of a step, as a process announced it."""

    step: str
    run_id: str
    attempt: int | None  # None: a line without it (an exercise's)


def started_line(step: str, run_id: str, attempt: int) -> str:
    """The line to print as ``step`` of ``run_id`` begins its ``attempt``."""
    return STARTED % (step, run_id, attempt)


def parse_started(line: str) -> Started | None:
    """The execution a line announces, or None if it is not a started line."""
    found = _LINE.search(line)
    if found is None:
        return None
    attempt = found["attempt"]
    return Started(found["step"], found["run_id"], int(attempt) if attempt is not None else None)


def started_in(text: str) -> list[Started]:
    """Every execution announced in ``text`` (a process's output), in the order printed."""
    return [s for s in map(parse_started, text.splitlines()) if s is not None]


def started_steps(text: str) -> list[str]:
    """The steps a process began executing, in order, one entry per execution."""
    return [s.step for s in started_in(text)]
