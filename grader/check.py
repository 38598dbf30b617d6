"""What a check is, to the grader: its number (the exercise it grades), what it shows, how to run it, how
long it may take, and the learner's file that marks the exercise's folder.

Each exercise's check is a module of its own, ``grader/check_<name>.py``, that defines ``CHECK``
(``check_record`` 1, ``check_intents`` 2, ``check_resume`` 3, ``check_memory`` 4, ``check_terminal`` 5,
``check_temporal`` 6, ``check_loop`` 7); what the record-track checks expect alike is ``grader.expect``.
``grader.registry`` finds them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grader.harness import Harness


@dataclass(frozen=True)
class Check:
    number: int
    title: str
    run: Callable[[Harness], list[str]]  # returns what it showed, one line each
    seconds: float = 120.0
    """The check's deadline: a check that runs past it fails naming itself (a hang, a loop)."""
    main_file: str = "flow.py"
    """The learner's file that marks the exercise's folder (``--impl`` names the folder that holds it)."""
    stands_alone: str = ""
    """Why ``grade N`` runs this check alone rather than checks 1..N with it; empty: it builds on the ones before."""
