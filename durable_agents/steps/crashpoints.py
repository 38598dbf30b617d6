"""Named points where a process can be made to die abruptly, for tests and the
lab's demonstrations.

Set ``CRASH_AT`` to one name, or several separated by commas, before the
process starts, e.g. ``CRASH_AT=send_confirmation:after_effect``. When the
code reaches a named point the process sends itself SIGKILL: no exception is
raised, no ``finally`` runs, nothing is flushed, no connection is closed. That
is a process crash, not a power cut: what the process wrote is in the kernel's
page cache and reaches the disk anyway, synced or not. ``lab/powercut.py``
makes the power cut (writes never synced are lost); a crash point is how its
tests stop a process at an exact place before cutting the power under it.

A name may carry the time it kills at, ``name@K`` (K from 1): the process dies the K-th time it reaches
``name`` (a plain ``name`` is ``name@1``), so a point a run reaches often (a turn's answer, a tool's
effect) can be killed at each occurrence (the kill matrix, ``durable_agents.testing.matrix``). Counted per
process: a resumed run's new process counts from 1 again.

``CRASH_TRACE=PATH`` appends the name of every point reached to PATH, one a line, in order (the kill matrix
reads an unkilled run's trace to know where it can kill).

Off unless set. When neither is set, ``crash_point`` is one test of a constant and one lookup in an empty
dict, read once at import.

Points reached by the step functions (every engine):

=====================================  ============================================
``draft:before``                       the draft step has started, nothing done
``draft:during_llm``                   the model call is in flight
``send_confirmation:before``           step 2 has started, no request sent
``send_confirmation:after_effect``     the provider accepted the email; the
                                       step's completion is not yet recorded
``record_outcome:before``              step 3 has started, no request sent
``record_outcome:after_effect``        the provider created the ticket; the
                                       step's completion is not yet recorded
=====================================  ============================================

After the run, every engine: ``memory:after_append``: the run's exchange is
committed to conversation memory, the process has not closed memory (not in
``step_points``: the crash matrix does not run it; the power-cut tests do).

Points reached by one engine only are each engine's own, named by its code
and listed by its registration (``crash_points`` of its ``registration.py``,
``lab.registry.engine_points(FLOW)`` for them all): ``<engine>:S:<where>``
for a step S. The steps' points are derived from the flow,
``durable_agents.steps.plan.step_points(FLOW)``: a step declares the points its function
reaches (``FlowStep.crash_points``).
This module is only the mechanism (arm, reach, die) and imports nothing of
the project: the plan names the points, the step functions reach them.

docs/crashpoints.md has the full table: every point on every engine and what
resume must do at each. tests/test_crash_matrix.py kills a run at each one.
"""

from __future__ import annotations

import os
import signal
import sys


def _parse(value: str | None) -> dict[str, frozenset[int]]:
    """``name`` or ``name@K`` entries, comma-separated: each name with the times (1-based) it kills at."""
    armed: dict[str, set[int]] = {}
    for entry in (p.strip() for p in (value or "").split(",")):
        if not entry:
            continue
        name, at, times = entry.rpartition("@")
        if not at or not times.isdigit() or int(times) < 1:
            name, times = entry, "1"
        armed.setdefault(name, set()).add(int(times))
    return {name: frozenset(times) for name, times in armed.items()}


_ARMED = _parse(os.environ.get("CRASH_AT"))
_SPECS = frozenset(p.strip() for p in (os.environ.get("CRASH_AT") or "").split(",") if p.strip())
_TRACE = (os.environ.get("CRASH_TRACE") or "").strip() or None
_REACHED: dict[str, int] = {}


def armed() -> frozenset[str]:
    """The points ``CRASH_AT`` arms, as written there (``name`` or ``name@K``)."""
    return _SPECS


def crash_point(name: str) -> None:
    """Die here, by SIGKILL, if ``name`` is armed through CRASH_AT for this time of reaching it; with
    CRASH_TRACE, first note that it was reached."""
    if _TRACE is not None:
        with open(_TRACE, "a", encoding="utf-8") as trace:
            trace.write(f"{name}\n")
    times = _ARMED.get(name)
    if times is None:
        return
    reached = _REACHED[name] = _REACHED.get(name, 0) + 1
    if reached in times:
        sys.stderr.write(f"CRASH_AT={name}@{reached}: killing process {os.getpid()} with SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
