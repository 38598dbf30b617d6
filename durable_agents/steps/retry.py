"""The retry rules of a step: one definition, which every engine takes its
numbers from. Temporal's workflow and the run record decide by it attempt by
attempt (``StepLedger``); DBOS maps it onto its own step retries, which count
attempts instead of spending a time budget (``durable_agents.dbosflow.engine``).

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

A **worker shutdown** (Temporal: a worker stopped gracefully mid-attempt, a
rolling deploy) is neither an error nor a death: retried at once, it spends
no budget and is not held against the death limit.

Time spent waiting for a worker (none running, or all busy) is neither: it
is bounded only by the run's own timeout (Temporal's execution timeout, which
the starter sets above the sum of the budgets; see ``run_timeout_floor``). A
failure that does not say how long its attempt took (a cancel, a failure the
SDK raised itself) is charged nothing but its backoff, since the time since
the attempt was scheduled includes that wait.

**Every step has at most ``attempts_per_step`` failed attempts** (50) since
the run, or its last reset, began: errors, deaths and shutdowns together.
That bounds a run's history whatever the budget: Temporal terminates a run
at 51,200 events, and, nearer, a worker replays the whole history within the
2 s workflow task timeout on every cache miss (every task with ``--cache
0``): 50 attempts a step keep the longest history a run can make at about
1,300 events, replayed in under half that timeout (bench/bench_history_bound.py,
docs/operations.md). So that a long budget is still spent by time, not cut
short by the count, a budget longer than ``INTERVALS_PER_BUDGET`` (30)
backoff caps raises the cap to ``budget / 30``: the default 900 s budget
keeps its 30 s cap; a week-long budget retries every 5.6 hours at worst.

**What a run records.** A run records its rule when it starts, and every
number its decisions depend on is in it: the budget, the backoff, the death
limit, each step's attempt timeout, the heartbeat timeout, the attempt limit.
A deploy that changes a default changes new runs only, so a run in flight
decides, and replays, as it started. ``version`` names the arithmetic: a
rule recorded before this field existed is version 1 (the per-step timeouts
and heartbeat timeout of that time, ``V1_ATTEMPT_TIMEOUT_SECONDS``, no
attempt limit, a worker shutdown counted as a death, a failure with no
duration charged the time since its attempt was scheduled); new runs record
version 2. A change to this arithmetic is a new version, never an edit.

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
"""How long one attempt of each step may take, for new runs (which record it): a model call may be
slow; the provider answers in milliseconds."""

V1_ATTEMPT_TIMEOUT_SECONDS = {"draft": 60.0, "send_confirmation": 15.0, "record_outcome": 15.0}
"""Version 1's per-step timeouts, for runs that recorded no timeouts of their own: never edited."""
V1_HEARTBEAT_TIMEOUT = 1.0
"""Version 1's heartbeat timeout (seconds), for runs that recorded none: never edited."""

RULE_VERSION = 2
DEFAULT_HEARTBEAT_TIMEOUT = 3.0
"""Seconds without a heartbeat before Temporal takes an attempt's worker for dead (new runs record it):
several times the longest event-loop stall a busy worker showed (docs/operations.md, "Heartbeat timeout")."""
ATTEMPTS_PER_STEP = 50
INTERVALS_PER_BUDGET = 30


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
    attempt_timeout: float | None = None  # seconds, every step; None: step_timeouts
    # Version 2 on (module docstring, "What a run records"); a version 1 rule has
    # None in each and decides by the V1_ values.
    step_timeouts: dict[str, float] | None = field(default_factory=lambda: dict(ATTEMPT_TIMEOUT_SECONDS))
    heartbeat_timeout: float | None = DEFAULT_HEARTBEAT_TIMEOUT
    attempts_per_step: int | None = ATTEMPTS_PER_STEP
    version: int = RULE_VERSION

    def __post_init__(self) -> None:
        if self.version not in (1, RULE_VERSION):
            raise ValueError(f"retry rule version {self.version!r} is not one this code knows (1 or {RULE_VERSION})")
        if self.heartbeat_timeout is not None and not (
            isinstance(self.heartbeat_timeout, (int, float)) and math.isfinite(self.heartbeat_timeout)
            and 0 < self.heartbeat_timeout <= 3600
        ):
            raise ValueError(f"heartbeat_timeout must be a number of seconds in (0, 3600], "
                             f"not {self.heartbeat_timeout!r}")
        if self.attempts_per_step is not None and not (
            isinstance(self.attempts_per_step, int) and 1 <= self.attempts_per_step <= ATTEMPTS_PER_STEP
        ):
            raise ValueError(f"attempts_per_step must be a whole number from 1 to {ATTEMPTS_PER_STEP}, "
                             f"not {self.attempts_per_step!r}")
        for step, seconds in (self.step_timeouts or {}).items():
            if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and 0 < seconds <= 3600):
                raise ValueError(f"step_timeouts[{step!r}] must be a number of seconds in (0, 3600], not {seconds!r}")
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
        if self.version >= 2 and self.budget_seconds / self.maximum_interval > INTERVALS_PER_BUDGET:
            # A long budget is spent by time, within the attempt limit: the cap grows with it.
            # Recorded as grown (to_dict), so from_dict gives the same rule back.
            object.__setattr__(self, "maximum_interval", self.budget_seconds / INTERVALS_PER_BUDGET)

    def attempt_timeout_for(self, step: str) -> float:
        if self.attempt_timeout is not None:
            return self.attempt_timeout
        timeouts = self.step_timeouts if self.step_timeouts is not None else V1_ATTEMPT_TIMEOUT_SECONDS
        return timeouts.get(step, 60.0)

    def heartbeat_timeout_seconds(self) -> float:
        return self.heartbeat_timeout if self.heartbeat_timeout is not None else V1_HEARTBEAT_TIMEOUT

    def backoff(self, error_attempts: int, u: float) -> float:
        """The delay after ``error_attempts`` errors (1-based), before Retry-After and the budget."""
        exponent = min(max(error_attempts - 1, 0), 64)  # 2**64 * 0.2 s is far past any cap
        base = min(self.initial_interval * self.backoff_coefficient ** exponent, self.maximum_interval)
        return base * (1.0 - self.jitter * min(max(u, 0.0), 1.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RetryRule:
        """The rule a run recorded. A run that recorded none, or one without a
        ``version`` (recorded before it existed), decides by version 1."""
        known = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        if "version" not in known:
            known.update(version=1, step_timeouts=None, heartbeat_timeout=None, attempts_per_step=None)
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


SAME_ERROR_LIMIT = 3
"""Attempts in a row the same error may end before an agent loop's turn gives up (``StepLedger.after_error``)."""


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
    crashes_kept: int = 0  # of ``crashes``: from before the run's last reset (``afresh``)
    shutdowns: int = 0  # attempts a worker shutdown cut short (version 2 on; version 1 counts them as crashes)
    failed_attempts: int = 0  # since the run, or its last reset, began: what ``attempts_per_step`` bounds
    in_doubt: bool = False
    last_error: str | None = None
    failure: str | None = None  # set when the step gave up: the run's error
    same_error_limit: int | None = None  # None: off (see ``after_error``)
    same_errors: int = 0  # the newest error answered to the request, and how often in a row: ``after_error``
    same_error: str | None = None

    def after_error(self, message: str, seconds: float, *, retry_after: float | None = None,
                    in_doubt: bool = False, u: float = 1.0, outage: bool = False) -> float | None:
        """A transient error ended an attempt that took ``seconds``. Returns the
        delay before the next attempt, or None when the budget is spent (then
        ``failure`` says why).

        With ``same_error_limit`` set (the agent loop's turns: ``SAME_ERROR_LIMIT``), a step whose request
        never changes (a turn asks with the same window on every attempt) gives up when the same error,
        word for word, ends that many attempts in a row, an ``outage`` (the other side not reached, or
        not answering this request: ``durable_agents.steps.errors``; or any error that came with a ``retry_after``: the
        other side asking to be given time) not counting and not breaking the row: an error the other side
        answers to the same request again and again is its answer to that request, not bad luck, and
        waiting out the whole budget on it looks like a hang. Every engine's loop sets the limit for its
        turns from ``durable_agents.steps.loop.same_error_limit``."""
        outage = outage or retry_after is not None
        self.error_attempts += 1
        self.error_seconds += max(float(seconds), 0.0) if math.isfinite(seconds) else 0.0
        self.last_error = message
        self.in_doubt = self.in_doubt or (self.effect and in_doubt)
        if self._out_of_attempts(message):
            return None
        if self.same_error_limit is not None and not outage:
            self.same_errors = self.same_errors + 1 if message == self.same_error else 1
            self.same_error = message
            if self.same_errors >= self.same_error_limit:
                self.failure = (
                    f"step {self.name} failed after {self.attempts} attempt(s): the same error on "
                    f"{self.same_errors} attempts in a row on an unchanged request (an outage would clear or "
                    f"change; this is the answer to the request itself): {message}"
                )
                return None
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

    def _out_of_attempts(self, message: str) -> bool:
        """Count one failed attempt; True (and ``failure`` says why) when it was the step's last."""
        self.failed_attempts += 1
        limit = self.rule.attempts_per_step
        if limit is None or self.failed_attempts < limit:
            return False
        self.failure = (
            f"step {self.name} failed after {self.attempts} attempt(s): {self.failed_attempts} attempts failed, "
            f"the most a step may have ({limit}, the run's retry rule) however long its budget; "
            f"last error: {message}"
        )
        return True

    def after_shutdown(self, message: str) -> bool:
        """A worker shut down gracefully mid-attempt (version 2 on): no budget, no death.
        True: try again now; False: the attempt limit is reached."""
        self.shutdowns += 1
        self.last_error = message
        self.in_doubt = self.in_doubt or self.effect
        return not self._out_of_attempts(message)

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
        return not self._out_of_attempts(message)

    def afresh(self) -> None:
        """Temporal: the run was reset here. A reset is an operator's "try again
        from here": the attempts before it stay counted (``attempts``,
        ``crashes``), and the step's budget, backoff, death count and attempt
        limit start again. Whether the outcome is in doubt is left as it was:
        an effect an earlier attempt may have applied may still have been."""
        self.error_attempts = 0
        self.error_seconds = 0.0
        self.crashes_kept = self.crashes
        self.failed_attempts = 0
        self.same_errors, self.same_error = 0, None

    def after_permanent(self, message: str, *, in_doubt: bool = False) -> None:
        self.last_error = message
        self.in_doubt = self.in_doubt or (self.effect and in_doubt)
        self.failure = f"step {self.name} failed after {self.attempts} attempt(s): {message}"
