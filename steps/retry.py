"""The retry rules of a step: one definition, which every engine takes its
numbers from. Temporal's workflow and the run record decide by it attempt by
attempt (``StepLedger``); DBOS maps it onto its own step retries, which count
attempts instead of spending a time budget (``dbosflow.engine``).

An attempt of a step ends in one of four ways, and each has its own rule:

- **success**: the step is done.
- **permanent error** (``PermanentError``, ``InputError``, an idempotency
  conflict that cannot be adopted): the run ends FAILED at once. Retrying the
  same request cannot help.
- **transient error** (``TransientError``: unreachable, 5xx, 408, 425, 429, a
  timeout; anything unexpected; on Temporal, a live worker's call that hangs
  until the attempt's start-to-close timeout): retried with capped
  exponential backoff and jitter while the step's **error budget**
  (``budget_seconds``) lasts. The budget counts the time spent in error
  attempts and in the backoff between them, nothing else.
- **crash** (the process running the attempt died: on Temporal the worker
  stopped heartbeating, or shut down mid-attempt; on the run record an attempt
  started and no outcome was recorded): not the step's fault, so it spends no
  error budget. It is retried at once, up to ``max_worker_deaths`` times; one
  more death ends the run FAILED naming ``worker died N times during <step>``
  (a poison pill: a step that kills its worker every time).

One attempt may last ``attempt_timeout_for(step)`` (draft 60 s, the effects
15 s, or ``attempt_timeout`` for every step); an attempt still running then,
on a live process, is a transient error whose outcome is in doubt (Temporal:
the start-to-close timeout; run record: the runner stops waiting for it).

Time spent waiting for a worker (none running, or all busy) is neither: it
is bounded only by the run's own timeout (Temporal's execution timeout, which
the starter sets above the sum of the budgets; see ``run_timeout_floor``).

Backoff after the n-th error attempt::

    delay = min(initial_interval * backoff_coefficient ** (n - 1), maximum_interval)
            * u,  u uniform in [1 - jitter, 1]            (the jitter)
    delay = max(delay, retry_after)                       (the other side's word,
                                                            capped at MAX_RETRY_AFTER)
    delay = min(delay, budget left)                       (a last try at the end)

and the step fails when an error arrives with no budget left. Defaults: 0.2 s
doubling to 30 s, 20 % jitter, a 900 s budget per step (a 10-minute outage is
ridden out with time to spare: once the far side is back, the next try comes
within 30 s), 10 worker deaths per step.

``u`` comes from the engine: ``workflow.random()`` on Temporal (replayed
identically), ``random.random()`` on the run record. Everything else here is
plain arithmetic, so the workflow and the runner make the same decisions.

**Retry-After** (``parse_retry_after``): the one reading of the header for
every client. Seconds (fractions allowed) or an HTTP date; a date in the past
or a negative number is 0; garbage, NaN and an absent header are "not said"
(None); anything above ``MAX_RETRY_AFTER`` (120 s) is capped there, so an
enormous value can neither overflow a timer nor park a run past its timeout.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from email.utils import mktime_tz, parsedate_tz
from typing import Any

MAX_RETRY_AFTER = 120.0
"""Seconds: the longest a Retry-After header can make a step wait before its next try."""

DEFAULT_BUDGET_SECONDS = 900.0
DEFAULT_MAX_WORKER_DEATHS = 10
MOST_WORKER_DEATHS = 1000  # the highest limit a run may record (LAB_MAX_WORKER_DEATHS)

BUDGET_ENV = "LAB_RETRY_BUDGET_SECONDS"
DEATHS_ENV = "LAB_MAX_WORKER_DEATHS"
ATTEMPT_TIMEOUT_ENV = "LAB_ATTEMPT_TIMEOUT_SECONDS"

ATTEMPT_TIMEOUT_SECONDS = {"draft": 60.0, "send_confirmation": 15.0, "record_outcome": 15.0}
"""How long one attempt of each step may take: a model call may be slow; the provider answers in milliseconds."""


def parse_retry_after(value: str | None, *, now: float | None = None, unit: float = 1.0) -> float | None:
    """Seconds to wait, from a Retry-After value, capped at ``MAX_RETRY_AFTER``.

    ``unit`` scales a number (``0.001`` for ``retry-after-ms``); HTTP dates
    are read only with ``unit`` 1. Never raises.
    """
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None:
        if math.isnan(number):
            return None
        return min(max(number * unit, 0.0), MAX_RETRY_AFTER)
    if unit != 1.0:
        return None
    parsed = parsedate_tz(text)
    if parsed is None:
        return None
    try:
        when = float(mktime_tz(parsed))
    except (OverflowError, ValueError):
        return None
    seconds = when - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


@dataclass(frozen=True)
class RetryRule:
    """How one step retries. Serialisable (``to_dict``) so a run records the
    numbers it runs under: a Temporal run in its input, a run-record run in
    its row. A deploy that changes the defaults never changes a started run."""

    budget_seconds: float = DEFAULT_BUDGET_SECONDS
    max_worker_deaths: int = DEFAULT_MAX_WORKER_DEATHS
    initial_interval: float = 0.2
    backoff_coefficient: float = 2.0
    maximum_interval: float = 30.0
    jitter: float = 0.2
    attempt_timeout: float | None = None  # seconds, every step; None: ATTEMPT_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if self.attempt_timeout is not None and not (
            isinstance(self.attempt_timeout, (int, float)) and math.isfinite(self.attempt_timeout)
            and self.attempt_timeout > 0
        ):
            raise ValueError(f"attempt_timeout must be a positive number of seconds, not {self.attempt_timeout!r}")
        for name in ("budget_seconds", "initial_interval", "maximum_interval"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if not (isinstance(self.max_worker_deaths, int) and self.max_worker_deaths >= 0):
            raise ValueError(f"max_worker_deaths must be a whole number, 0 or more, not {self.max_worker_deaths!r}")
        if not (self.backoff_coefficient >= 1 and 0 <= self.jitter < 1):
            raise ValueError("backoff_coefficient must be >= 1 and jitter in [0, 1)")

    def attempt_timeout_for(self, step: str) -> float:
        return self.attempt_timeout if self.attempt_timeout is not None else ATTEMPT_TIMEOUT_SECONDS.get(step, 60.0)

    def backoff(self, error_attempts: int, u: float) -> float:
        """The delay after ``error_attempts`` errors (1-based), before Retry-After and the budget."""
        exponent = min(max(error_attempts - 1, 0), 64)  # 2**64 * 0.2 s is far past any cap
        base = min(self.initial_interval * self.backoff_coefficient ** exponent, self.maximum_interval)
        return base * (1.0 - self.jitter * min(max(u, 0.0), 1.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RetryRule:
        if not data:
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _env_number(env: Mapping[str, str], name: str, parse: Callable[[str], Any], ok: Callable[[Any], bool],
                what: str, default: Any) -> Any:
    """``name`` from ``env`` read with ``parse`` when set, else ``default``;
    ``ValueError`` saying ``what`` it must be when it does not parse or not ``ok``."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
        if ok(value):
            return value
    except ValueError:
        pass
    raise ValueError(f"{name}={raw!r} must be {what}")


def _seconds_up_to(limit: float) -> Callable[[float], bool]:
    return lambda value: math.isfinite(value) and 0 < value <= limit


def rule_from_env(env: Mapping[str, str] | None = None) -> RetryRule:
    """The rule a new run records: defaults, with ``LAB_RETRY_BUDGET_SECONDS``
    and ``LAB_MAX_WORKER_DEATHS`` when set. Raises ``ValueError`` naming the
    variable when a value is unusable."""
    env = os.environ if env is None else env
    budget = _env_number(env, BUDGET_ENV, float, _seconds_up_to(7 * 86400),
                         "a number of seconds between 0 and 604800 (a week); "
                         f"the default is {DEFAULT_BUDGET_SECONDS:g}", DEFAULT_BUDGET_SECONDS)
    deaths = _env_number(env, DEATHS_ENV, int, lambda value: 0 <= value <= MOST_WORKER_DEATHS,
                         f"a whole number from 0 to {MOST_WORKER_DEATHS}; the default is {DEFAULT_MAX_WORKER_DEATHS}",
                         DEFAULT_MAX_WORKER_DEATHS)
    attempt_timeout = _env_number(env, ATTEMPT_TIMEOUT_ENV, float, _seconds_up_to(3600),
                                  "a number of seconds between 0 and 3600; "
                                  "unset, each step has its own (draft 60 s, the effects 15 s)", None)
    return RetryRule(budget_seconds=budget, max_worker_deaths=deaths, attempt_timeout=attempt_timeout)


def run_timeout_floor(rule: RetryRule, steps: int) -> float:
    """The shortest run timeout that cannot cut a retrying step short: every
    step's budget spent in full, plus its longest attempt once more (the
    last try at the budget's end)."""
    longest = rule.attempt_timeout if rule.attempt_timeout is not None else max(ATTEMPT_TIMEOUT_SECONDS.values())
    return steps * (rule.budget_seconds + longest)


@dataclass
class StepLedger:
    """What one step's attempts have cost so far: Temporal's workflow and the run
    record keep one per step and ask it what to do after each failed attempt.

    ``effect``: the step sends a keyed request, so an attempt whose outcome is
    unknown (a timeout, a lost answer, a crash) may have applied it: the step
    is *in doubt* until an attempt succeeds.
    """

    name: str
    rule: RetryRule = field(default_factory=RetryRule)
    effect: bool = False
    attempts: int = 0
    error_attempts: int = 0
    error_seconds: float = 0.0
    crashes: int = 0
    crashes_kept: int = 0  # of ``crashes``: kept from before a reset (``kept_from_reset``)
    in_doubt: bool = False
    last_error: str | None = None
    failure: str | None = None  # set when the step gave up: the run's error

    def after_error(self, message: str, seconds: float, *, retry_after: float | None = None,
                    in_doubt: bool = False, u: float = 1.0) -> float | None:
        """A transient error ended an attempt that took ``seconds``. Returns the
        delay before the next attempt, or None when the budget is spent (then
        ``failure`` says why)."""
        self.error_attempts += 1
        self.error_seconds += max(float(seconds), 0.0) if math.isfinite(seconds) else 0.0
        self.last_error = message
        self.in_doubt = self.in_doubt or (self.effect and in_doubt)
        left = self.rule.budget_seconds - self.error_seconds
        if left <= 0:
            self.failure = (
                f"step {self.name} failed after {self.attempts} attempt(s): retry budget of "
                f"{self.rule.budget_seconds:g} s spent ({self.error_attempts} error(s) in "
                f"{self.error_seconds:.0f} s); last error: {message}"
            )
            return None
        delay = self.rule.backoff(self.error_attempts, u)
        if retry_after is not None and math.isfinite(retry_after):
            delay = max(delay, min(max(retry_after, 0.0), MAX_RETRY_AFTER))
        delay = min(delay, left)
        self.error_seconds += delay
        return delay

    def after_crash(self, message: str) -> bool:
        """The process running the attempt died. True: try again now; False: give up."""
        self.crashes += 1
        self.last_error = message
        self.in_doubt = self.in_doubt or self.effect
        deaths = self.crashes - self.crashes_kept
        if deaths > self.rule.max_worker_deaths:
            self.failure = (
                f"step {self.name} failed after {self.attempts} attempt(s): worker died {deaths} times "
                f"during {self.name} (the limit is {self.rule.max_worker_deaths}; {DEATHS_ENV}): "
                f"a step that kills its worker every time is a poison pill, not bad luck; last: {message}"
            )
            return False
        return True

    def kept_from_reset(self, *, crashed: bool) -> None:
        """Temporal: a failed attempt kept from the run a reset started from. It is
        history: counted in ``attempts`` (and ``crashes`` if it crashed), but it
        spends nothing, since a reset gives the step a fresh budget and death count."""
        if crashed:
            self.crashes += 1
            self.crashes_kept += 1

    def after_permanent(self, message: str, *, in_doubt: bool = False) -> None:
        self.last_error = message
        self.in_doubt = self.in_doubt or (self.effect and in_doubt)
        self.failure = f"step {self.name} failed after {self.attempts} attempt(s): {message}"
