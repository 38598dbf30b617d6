"""Which exercise and file each TODO belongs to, read from the practice files themselves.

A practice file marks each TODO ``# TODO n (exercise e): ...`` (and closes it
``# END TODO n``); the numbers run through the whole track. A TODO may take
several blocks of one file, each marked so (TODO 1: what a COMMIT promises, in
``open_record``, and the run's row, in ``start``). The grader's
"look at" lines name a TODO by its number alone: its exercise and file come
from here, so a new exercise's TODOs need no list kept by hand.
"""

from __future__ import annotations

import re
from functools import cache

from lab.processes import REPO

EXERCISES = REPO / "exercises"
_MARKER = re.compile(r"^\s*# TODO (\d+) \(exercise (\d+)\)", re.M)


@cache
def todo_places() -> dict[int, tuple[int, str]]:
    """Each TODO's number -> (its exercise, the practice file that holds it), the first file when several do."""
    found: dict[int, tuple[int, str]] = {}
    for path in sorted(EXERCISES.glob("[0-9][0-9]-*/practice/*.py")):
        for match in _MARKER.finditer(path.read_text()):
            place = (int(match[2]), path.name)
            held = found.setdefault(int(match[1]), place)
            if held[0] != place[0]:  # a TODO's blocks belong to one exercise: the markers contradict each other
                raise LookupError(f"{path} marks TODO {match[1]} for exercise {place[0]}; another block says "
                                  f"exercise {held[0]}")
    return found


def todo(n: int, what: str) -> str:
    """How a failure names TODO ``n``: ``TODO n (exercise e) in FILE: what``."""
    place = todo_places().get(n)
    if place is None:  # a grader naming a TODO no practice file has: the grader's own mistake, said plainly
        raise LookupError(f"no practice file under {EXERCISES} marks TODO {n}")
    exercise, file = place
    return f"TODO {n} (exercise {exercise}) in {file}: {what}"
