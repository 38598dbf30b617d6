"""One vocabulary for a run's state, on every engine: the words, the JSON
fields and the exit codes. ``starter.py status`` (Temporal's history, and the
workflow's own ``progress`` query), ``python -m durable_agents.runrecord status`` (the SQLite
record) and ``python -m durable_agents.dbosflow status`` (DBOS's tables) print the same
shape, each built with ``step_entry`` and ``run_entry``, and render it with
the same table (``durable_agents.steps.runview``). Typed: the words are ``RunStateName`` and
``StepStateName`` (a misspelt one is a mypy error where it is written, and a
``ValueError`` from ``step_entry``/``run_entry`` if it arrives another way), the
entries ``StepEntry`` and ``RunEntry``, a step's result ``JsonValue``.

The JSON shape::

    {"run_id", "status", "current_step", "error", "detail",
     "steps": [{"name", "status", "attempts", "result",
                "crashes", "last_error", "next_try_at", "note"}]}

A run's ``status``:

=========  ====================================================================
running    making progress: a step is running, retrying after an error, or
           waiting for a worker (``detail`` says which)
parked     stopped by its *code*, not by its steps: on Temporal the workflow
           task keeps failing (an incompatible deploy, a bug in workflow code);
           on the run record the code's flow differs from the recorded one.
           ``detail`` names the failing task, the error and since when. It
           resumes by itself once compatible code runs; nothing is lost
completed  every step completed (or adopted)
failed     terminal: ``error`` names the step, the attempts and the reason
           (Temporal's timed out, terminated and canceled are failed too, and
           ``error`` says which)
=========  ====================================================================

A step's ``status``:

=========  ====================================================================
pending    not reached yet
running    an attempt is executing
waiting    an attempt is due but nothing runs it: no worker has taken it
           (Temporal), or no live process holds the run (run record)
retrying   the last attempt failed with a transient error; ``next_try_at``
           says when the next one is due, ``last_error`` why
completed  done; ``result`` holds its recorded result
adopted    done by adopting the effect this run had already applied under the
           step's key (``durable_agents.steps.adoption``); ``note`` gives the reason and both
           request digests
failed     this step ended the run
in_doubt   this step ended the run, and an attempt's outcome is unknown (a
           5xx, a timeout, a lost answer, an unreadable 2xx, an unexpected
           error, a crash mid-request, a run closed or cancelled
           mid-request): the effect may have been applied. Only a step with
           an effect is ever in doubt. ``settle`` asks the provider by key
=========  ====================================================================

``attempts`` counts every execution of the step, ``crashes`` the ones whose
process died (not the step's fault: they spend no error budget, see
``durable_agents.steps.retry``).

Exit codes of ``status``, ``watch`` and ``start --wait`` on both CLIs:
0 completed or running, 1 failed, 2 bad input or unknown run, 3 parked.
``starter.py`` adds 4 (``status --live``: no worker answered the query),
130 (interrupted with Ctrl-C; the run goes on) and 141 (the reader of its
output went away: ``| head``). (The run record's start and resume keep their
own codes for their refusals.)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Literal, TypeAlias, TypedDict, get_args

RunStateName = Literal["running", "parked", "completed", "failed"]
"""A run's ``status`` (the table above). mypy holds callers to these words; ``run_entry`` refuses any other."""
StepStateName = Literal["pending", "running", "waiting", "retrying", "completed", "adopted", "failed", "in_doubt"]
"""A step's ``status`` (the table above); ``step_entry`` refuses any other."""

RUN_STATES: tuple[RunStateName, ...] = get_args(RunStateName)
STEP_STATES: tuple[StepStateName, ...] = get_args(StepStateName)
DONE_STEP_STATES: tuple[StepStateName, ...] = ("completed", "adopted")

JsonValue: TypeAlias = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
"""What a step's ``result`` may hold: plain JSON, as every engine records it
(``durable_agents.steps.models.to_jsonable``)."""


class StepEntry(TypedDict):
    """One step in the status JSON (``step_entry`` builds it), its keys in the order printed."""

    # The step's name, as in durable_agents.steps.plan
    name: str
    status: StepStateName
    # Every execution of the step, those whose process died included
    attempts: int
    # The recorded result of a completed or adopted step; None otherwise
    result: JsonValue
    # Executions whose process died (they spend no error budget, durable_agents.steps.retry)
    crashes: int
    # The last attempt's error, if one failed
    last_error: str | None
    # A retrying step's next attempt, as ``iso`` writes it
    next_try_at: str | None
    # Why a step stands as it does: an adoption's reason, a waiting step's cause, a doubt's way out
    note: str | None


class RunEntry(TypedDict):
    """A run's status JSON (``run_entry`` builds it): what ``status --json`` prints on every engine."""

    run_id: str
    status: RunStateName
    # The first step not completed or adopted; None once every step is done
    current_step: str | None
    steps: list[StepEntry]
    # Why a failed run failed: the step, the attempts and the reason
    error: str | None
    # What a running or parked run is doing or waiting for
    detail: str | None

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_PARKED = 3
EXIT_NO_WORKER = 4
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141


def exit_code(status: RunEntry | Mapping[str, object]) -> int:
    """A run's exit code by its status (a flow run's ``RunEntry`` or a loop run's status dict alike)."""
    return {"failed": EXIT_FAILED, "parked": EXIT_PARKED}.get(str(status["status"]), EXIT_OK)


def iso(ts: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC with milliseconds (the status JSON's time format)."""
    if ts is None:
        return None
    whole = int(ts // 1)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((ts - whole) * 1000):03d}Z"


def unix(ts_iso: str | None) -> float | None:
    """The inverse of ``iso``: an ISO 8601 UTC time (every side's format, the provider's included) as Unix
    seconds."""
    return None if ts_iso is None else datetime.fromisoformat(ts_iso.replace("Z", "+00:00")).timestamp()


def clock(ts_iso: str | None) -> str:
    """The HH:MM:SS (UTC) part of an ``iso`` time, for one-line messages."""
    return ts_iso[11:19] if ts_iso else "?"


def step_state(word: str) -> StepStateName:
    """``word`` (read from a store, say) as a step's status; ValueError if it is none."""
    for name in STEP_STATES:
        if word == name:
            return name
    raise _not_a_status("step", word, STEP_STATES)


def run_state(word: str) -> RunStateName:
    """``word`` as a run's status; ValueError if it is none."""
    for name in RUN_STATES:
        if word == name:
            return name
    raise _not_a_status("run", word, RUN_STATES)


def _not_a_status(kind: str, word: object, words: tuple[str, ...], whose: str = "") -> ValueError:
    return ValueError(f"{whose}{word!r} is not a {kind} status, which is one of: {', '.join(words)} "
                      "(durable_agents.steps.runstate)")


def step_entry(name: str, status: StepStateName = "pending", attempts: int = 0, result: JsonValue = None, *,
               crashes: int = 0, last_error: str | None = None, next_try_at: str | None = None,
               note: str | None = None) -> StepEntry:
    # mypy refuses a misspelt word written here; this refuses one that came from elsewhere.
    if status not in STEP_STATES:
        raise _not_a_status("step", status, STEP_STATES, f"step {name!r}: ")
    return {"name": name, "status": status, "attempts": attempts, "result": result, "crashes": crashes,
            "last_error": last_error, "next_try_at": next_try_at, "note": note}


def run_entry(run_id: str, status: RunStateName, steps: list[StepEntry], *, error: str | None = None,
              detail: str | None = None) -> RunEntry:
    if status not in RUN_STATES:
        raise _not_a_status("run", status, RUN_STATES, f"run {run_id!r}: ")
    current = next((s["name"] for s in steps if s["status"] not in DONE_STEP_STATES), None)
    return {"run_id": run_id, "status": status, "current_step": current, "steps": steps,
            "error": error, "detail": detail}


def result_fields(step: StepEntry) -> dict[str, JsonValue]:
    """A step's result when it is an object (every step's is, once recorded), else empty: its fields to read."""
    result = step["result"]
    return result if isinstance(result, dict) else {}


def describe_step(step: StepEntry, *, waiting_for: str = "a worker") -> str:
    """One line on what a step is doing, for ``detail``; ``waiting_for``: what a waiting step waits for on
    this engine (Temporal: a worker; the run record: a resume; DBOS: a launch that recovers it)."""
    name, status = step["name"], step["status"]
    if status == "retrying":
        return (f"retrying {name}: attempt {step['attempts']} failed ({step.get('last_error') or 'error'}); "
                f"next try at {clock(step.get('next_try_at'))} UTC")
    if status == "waiting":
        return f"{name} is waiting for {waiting_for} (attempt {step['attempts']})"
    if status == "running":
        beat = f"; {step['note']}" if step.get("note") else ""
        return f"{name} is running (attempt {step['attempts']}{beat})"
    return f"{name}: {status}"
