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

Off unless set. When ``CRASH_AT`` is unset, ``crash_point`` is one lookup in an
empty frozenset, read once at import.

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


def _parse(value: str | None) -> frozenset[str]:
    return frozenset(p.strip() for p in (value or "").split(",") if p.strip())


_ARMED = _parse(os.environ.get("CRASH_AT"))


def armed() -> frozenset[str]:
    return _ARMED


def crash_point(name: str) -> None:
    """Die here, by SIGKILL, if ``name`` is armed through CRASH_AT."""
    if name in _ARMED:
        sys.stderr.write(f"CRASH_AT={name}: killing process {os.getpid()} with SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
