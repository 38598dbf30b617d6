"""Injected faults, for tests of retries and timeouts. In memory, thread-safe.

Three faults, each a countdown of the next N effect requests (POST /v1/emails,
/v1/tickets, /v1/refunds: every kind of ``provider.kinds``) that pass
validation, optionally limited to some kinds:

- ``fail_next``: answer ``status`` (default 503, with ``Retry-After`` when
  ``retry_after`` is set) and apply nothing. A 5xx's message says this
  provider applied nothing, and that a client cannot know it from the status:
  a gateway or proxy may answer 5xx after the origin applied the request, so
  the client treats every 5xx as in doubt (docs/provider-contract.md).
- ``hang_next``: sleep ``hang_seconds`` (default 5) first, then process the
  request normally: a client that gave up may find its effect applied later.
- ``lose_response_next``: process the request normally (apply and store, or
  replay), then answer 503 as if the response were lost on the way back.

Each POST /admin/faults replaces only the faults it names; ``kinds`` applies
to every fault named in the same POST.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from provider.kinds import NAMES

KINDS = NAMES
MAX_COUNT = 1_000_000
MAX_HANG_SECONDS = 600.0
MAX_RETRY_AFTER = 3600.0
DEFAULT_HANG_SECONDS = 5.0

_FIELDS = {"fail_next", "status", "retry_after", "kinds", "hang_next", "hang_seconds", "lose_response_next"}


class FaultSpecError(ValueError):
    """A fault request that cannot be honoured; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass
class _Countdown:
    remaining: int = 0
    kinds: tuple[str, ...] = KINDS

    def take(self, kind: str) -> bool:
        if self.remaining > 0 and kind in self.kinds:
            self.remaining -= 1
            return True
        return False


@dataclass
class _Fail(_Countdown):
    status: int = 503
    retry_after: float | None = None


@dataclass
class _Hang(_Countdown):
    seconds: float = DEFAULT_HANG_SECONDS


@dataclass(frozen=True)
class FailDecision:
    status: int
    retry_after: float | None
    remaining: int


@dataclass
class Faults:
    _fail: _Fail = field(default_factory=_Fail)
    _hang: _Hang = field(default_factory=_Hang)
    _lose: _Countdown = field(default_factory=_Countdown)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def configure(self, spec: Any) -> None:
        """Validate ``spec`` completely, then apply it atomically."""
        if not isinstance(spec, dict):
            raise FaultSpecError("", "send a JSON object, e.g. {\"fail_next\": 2, \"status\": 503}")
        unknown = sorted(set(spec) - _FIELDS)
        if unknown:
            raise FaultSpecError(unknown[0],
                                 f"unknown field {unknown[0]!r}: faults accept {', '.join(sorted(_FIELDS))}")
        for detail, owner in (("status", "fail_next"), ("retry_after", "fail_next"), ("hang_seconds", "hang_next")):
            if detail in spec and owner not in spec:
                raise FaultSpecError(detail, f"{detail} belongs to {owner}: give {owner} in the same request")
        named = [name for name in ("fail_next", "hang_next", "lose_response_next") if name in spec]
        if not named:
            raise FaultSpecError("", "name at least one fault: fail_next, hang_next or lose_response_next")

        kinds = _kinds(spec.get("kinds", list(KINDS)))
        fail = hang = lose = None
        if "fail_next" in spec:
            status = spec.get("status", 503)
            if not _is_int(status) or not 400 <= status <= 599:
                raise FaultSpecError("status", f"status must be an HTTP error status from 400 to 599, got {status!r}")
            retry_after = spec.get("retry_after")
            if retry_after is not None:
                retry_after = _number("retry_after", retry_after, 0.0, MAX_RETRY_AFTER)
            fail = _Fail(_count("fail_next", spec["fail_next"]), kinds, status, retry_after)
        if "hang_next" in spec:
            seconds = _number("hang_seconds", spec.get("hang_seconds", DEFAULT_HANG_SECONDS), 0.0, MAX_HANG_SECONDS)
            hang = _Hang(_count("hang_next", spec["hang_next"]), kinds, seconds)
        if "lose_response_next" in spec:
            lose = _Countdown(_count("lose_response_next", spec["lose_response_next"]), kinds)
        with self._lock:
            self._fail = fail or self._fail
            self._hang = hang or self._hang
            self._lose = lose or self._lose

    def clear(self) -> None:
        with self._lock:
            self._fail, self._hang, self._lose = _Fail(), _Hang(), _Countdown()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "fail": {
                    "remaining": self._fail.remaining,
                    "status": self._fail.status,
                    "retry_after": self._fail.retry_after,
                    "kinds": list(self._fail.kinds),
                },
                "hang": {
                    "remaining": self._hang.remaining,
                    "hang_seconds": self._hang.seconds,
                    "kinds": list(self._hang.kinds),
                },
                "lose_response": {"remaining": self._lose.remaining, "kinds": list(self._lose.kinds)},
            }

    def take_hang(self, kind: str) -> float | None:
        """Seconds to sleep before processing, or None."""
        with self._lock:
            return self._hang.seconds if self._hang.take(kind) else None

    def take_fail(self, kind: str) -> FailDecision | None:
        with self._lock:
            if self._fail.take(kind):
                return FailDecision(self._fail.status, self._fail.retry_after, self._fail.remaining)
            return None

    def take_lose_response(self, kind: str) -> bool:
        with self._lock:
            return self._lose.take(kind)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(name: str, value: Any) -> int:
    if not _is_int(value) or not 0 <= value <= MAX_COUNT:
        raise FaultSpecError(name, f"{name} must be a whole number from 0 to {MAX_COUNT}, got {value!r}")
    return value


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise FaultSpecError(name, f"{name} must be a number of seconds from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _kinds(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(k not in KINDS for k in value):
        raise FaultSpecError("kinds", f"kinds must be a non-empty list drawn from {list(KINDS)}, got {value!r}")
    return tuple(k for k in KINDS if k in value)
