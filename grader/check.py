"""What a check is, to the grader: its number (the exercise it grades), what it shows, how to run it, how
long it may take, and the learner's file that marks the exercise's folder.

The checks of exercises 1-6 live in ``grader.checks`` (``grader.temporal`` for 6); from exercise 7 on, each
exercise's check is a module of its own, ``grader/check_<name>.py``, that defines ``CHECK``.
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
