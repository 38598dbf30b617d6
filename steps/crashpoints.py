"""Named points where a process can be made to die abruptly, for tests and the
lab's demonstrations.

Set ``CRASH_AT`` to one name, or several separated by commas, before the
process starts, e.g. ``CRASH_AT=send_confirmation:after_effect``. When the
code reaches a named point the process sends itself SIGKILL: no exception is
raised, no ``finally`` runs, nothing is flushed, exactly as if the power went.

Off unless set. When ``CRASH_AT`` is unset, ``crash_point`` is one lookup in an
empty frozenset, read once at import.

Points reached by the step functions (both engines):

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
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = (
    "draft:before",
    "draft:during_llm",
    "send_confirmation:before",
    "send_confirmation:after_effect",
    "record_outcome:before",
    "record_outcome:after_effect",
)


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
