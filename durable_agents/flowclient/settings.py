"""Operational options read from the environment: one reader, so that every
``LAB_*`` number a worker or a starter takes is refused the same way, before
anything connects, with a message naming the variable and what to give
instead. docs/operations.md lists the options, the lab's values and the
values a production deployment would choose.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta


def env_seconds(env: Mapping[str, str], name: str, default: timedelta, *, low: float, high: float,
                allow_zero: bool = False) -> timedelta:
    """``name`` as a number of seconds in ``(low, high]`` (``[0, high]`` with
    ``allow_zero``), or ``default`` when it is unset or empty.

    Raises ``ValueError`` naming the variable, the range and the default."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    in_range = math.isfinite(value) and value <= high and (value > low or (allow_zero and value == 0))
    if not in_range:
        span = f"from 0 to {_plain(high)}" if allow_zero else f"more than {_plain(low)} and at most {_plain(high)}"
        raise ValueError(f"{name}={raw!r} must be a number of seconds {span}; "
                         f"unset, it is {_plain(default.total_seconds())}")
    return timedelta(seconds=value)


def env_count(env: Mapping[str, str], name: str, default: int, *, low: int, high: int) -> int:
    """``name`` as a whole number in ``[low, high]``, or ``default`` when unset or empty.

    Raises ``ValueError`` naming the variable, the range and the default."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValueError(f"{name}={raw!r} must be a whole number from {low} to {high}; unset, it is {default}")
    return value


def _plain(value: float) -> str:
    """A number as a person writes it: 2592000, not 2.592e+06; 0.1, not 0.100000."""
    return f"{value:.0f}" if value == int(value) else f"{value:g}"
