"""The retry rules (durable_agents.steps.retry), one definition for both engines: the budget,
the backoff with jitter, crashes apart from errors, and the one reading of
Retry-After. Plain arithmetic, so tested here directly; the engines' use of
it is tested with real processes (test_outage.py, test_crashes.py)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from durable_agents.drafting.openai_compat import retry_after_seconds
from durable_agents.providerclient import parse_retry_after as provider_parse
from durable_agents.steps.retry import (
    ATTEMPT_TIMEOUT_SECONDS,
    ATTEMPTS_PER_STEP,
    INTERVALS_PER_BUDGET,
    MAX_RETRY_AFTER,
    RULE_VERSION,
    SAME_ERROR_LIMIT,
    V1_ATTEMPT_TIMEOUT_SECONDS,
    V1_HEARTBEAT_TIMEOUT,
    RetryRule,
    StepLedger,
    parse_retry_after,
    rule_from_env,
    run_timeout_floor,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),  # missing
        ("", None),
        ("soon", None),  # garbage
        ("nan", None),
        ("3", 3.0),
        (" 0.5 ", 0.5),  # fractions (the provider's fault injection sends them)
        ("-5", 0.0),  # negative: now
        ("7200", MAX_RETRY_AFTER),  # an LLM gateway's two hours: capped
        ("1e308", MAX_RETRY_AFTER),  # enormous: capped, never an overflow
        ("inf", MAX_RETRY_AFTER),
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30.0),
        (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 0.0),  # past date: now
        (format_datetime(NOW + timedelta(days=3), usegmt=True), MAX_RETRY_AFTER),
        ("Fri, 31 Dec 99999 23:59:59 GMT", None),  # unreadable date
    ],
)
def test_retry_after_is_read_one_way_and_is_always_safe(value, expected):
    got = parse_retry_after(value, now=NOW.timestamp())
    assert got == expected
    # Both clients use the same reading.
    assert provider_parse(value, now=NOW) == expected
    headers = {} if value is None else {"Retry-After": value}
    assert retry_after_seconds(headers, now=NOW.timestamp()) == expected


def test_retry_after_ms_is_read_the_same_way():
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"retry-after-ms": "99999999999"}) == MAX_RETRY_AFTER
    assert retry_after_seconds({"retry-after-ms": "x", "retry-after": "2"}) == 2.0


def test_backoff_is_capped_exponential_with_jitter_below_the_base():
    rule = RetryRule(initial_interval=0.2, backoff_coefficient=2.0, maximum_interval=30.0, jitter=0.2)
    assert [rule.backoff(n, 0.0) for n in (1, 2, 3, 4)] == pytest.approx([0.2, 0.4, 0.8, 1.6])
    assert rule.backoff(50, 0.0) == 30.0 and rule.backoff(10_000, 0.0) == 30.0  # capped, no overflow
    assert rule.backoff(3, 1.0) == pytest.approx(0.8 * 0.8)  # full jitter takes 20 % off
    assert all(0.8 * 0.8 <= rule.backoff(3, u / 10) <= 0.8 for u in range(11))


def test_errors_spend_the_budget_and_the_last_try_lands_at_its_end():
    ledger = StepLedger("send_confirmation", RetryRule(budget_seconds=10, initial_interval=1, jitter=0),
                        effect=True)
    delays = []
    for _ in range(20):
        ledger.attempts += 1
        delay = ledger.after_error("503 unavailable", 0.5, u=0.0)
        if delay is None:
            break
        delays.append(delay)
    # 0.5 s per attempt plus 1, 2, 4 s of backoff, then the 1.5 s that is left: a last try at the end.
    assert delays == pytest.approx([1, 2, 4, 10 - 0.5 * 4 - 7])
    assert ledger.error_seconds >= 10
    assert "retry budget of 10 s spent" in ledger.failure and "last error: 503 unavailable" in ledger.failure
    assert not ledger.in_doubt  # nobody said the outcome was unknown


def test_retry_after_raises_the_delay_but_never_past_the_cap_or_the_budget():
    rule = RetryRule(budget_seconds=1000, initial_interval=0.2, jitter=0)
    ledger = StepLedger("draft", rule)
    assert ledger.after_error("429", 0.1, retry_after=5.0) == 5.0
    assert ledger.after_error("429", 0.1, retry_after=1e9) == MAX_RETRY_AFTER
    small = StepLedger("draft", RetryRule(budget_seconds=3, jitter=0))
    assert small.after_error("429", 0.1, retry_after=100.0) == pytest.approx(2.9)


def test_crashes_spend_no_budget_and_a_poison_pill_still_ends():
    ledger = StepLedger("draft", RetryRule(budget_seconds=1, max_worker_deaths=10))
    for n in range(10):
        ledger.attempts += 1
        assert ledger.after_crash("heartbeat timeout"), n  # ten deaths survived
    assert ledger.error_seconds == 0 and ledger.failure is None
    ledger.attempts += 1
    assert not ledger.after_crash("heartbeat timeout")
    assert "worker died 11 times during draft" in ledger.failure


def test_a_reset_starts_the_budget_and_the_death_count_again_and_keeps_the_counts():
    """A Temporal reset (``StepLedger.afresh``, called where Temporal reseeds the run) gives
    the step a fresh budget, death count and attempt limit: the attempts and crashes
    before it are still shown, the limit counts only those after it."""
    ledger = StepLedger("draft", RetryRule(budget_seconds=1, max_worker_deaths=1, jitter=0))
    for _ in range(2):
        ledger.attempts += 1
        ledger.after_crash("heartbeat timeout")
    ledger.attempts += 1
    assert ledger.after_error("503", 5.0) is None  # the budget is spent: the run failed here
    ledger.afresh()
    ledger.failure = None
    assert (ledger.crashes, ledger.error_attempts, ledger.error_seconds) == (2, 0, 0.0)
    ledger.attempts += 1
    assert ledger.after_error("503", 0.1) == pytest.approx(0.2)  # the backoff starts again too
    ledger.attempts += 1
    assert ledger.after_crash("heartbeat timeout")  # the first death since the reset
    ledger.attempts += 1
    assert not ledger.after_crash("heartbeat timeout")
    assert ledger.crashes == 4 and "worker died 2 times during draft" in ledger.failure


def test_a_worker_shutdown_is_no_death_and_spends_no_budget():
    ledger = StepLedger("send_confirmation", RetryRule(budget_seconds=1, max_worker_deaths=0), effect=True)
    for _ in range(5):
        ledger.attempts += 1
        assert ledger.after_shutdown("the worker running it shut down mid-attempt")
    assert (ledger.shutdowns, ledger.crashes, ledger.error_seconds, ledger.failure) == (5, 0, 0.0, None)
    assert ledger.in_doubt  # an effect's attempt cut short may have been applied


def test_every_step_has_at_most_its_attempt_limit_whatever_the_budget():
    """The history of a run is bounded by the count, not only by the budget: errors,
    deaths and shutdowns together, since the run (or its last reset) began."""
    rule = RetryRule(budget_seconds=7 * 86400, max_worker_deaths=1000, attempts_per_step=10)
    ledger = StepLedger("record_outcome", rule)
    outcomes = []
    for n in range(10):
        ledger.attempts += 1
        if n % 3 == 0:
            outcomes.append(ledger.after_crash("heartbeat timeout"))
        elif n % 3 == 1:
            outcomes.append(ledger.after_shutdown("shut down"))
        else:
            outcomes.append(ledger.after_error("503", 0.1, u=0.5) is not None)
    assert outcomes == [True] * 9 + [False]
    assert "10 attempts failed, the most a step may have (10" in ledger.failure


def test_a_long_budget_grows_the_backoff_cap_so_time_spends_it_within_the_limit():
    week = RetryRule(budget_seconds=7 * 86400)
    assert week.maximum_interval == pytest.approx(7 * 86400 / INTERVALS_PER_BUDGET)
    assert RetryRule().maximum_interval == 30.0  # the default budget keeps the 30 s cap
    # Recorded as grown: the run's rule reads back the same.
    assert RetryRule.from_dict(week.to_dict()) == week
    ledger, attempts = StepLedger("draft", week), 0
    while ledger.failure is None:
        ledger.attempts += 1
        attempts += 1
        ledger.after_error("503", 1.0, u=0.0)
    assert attempts < ATTEMPTS_PER_STEP and "retry budget of 604800 s spent" in ledger.failure


def test_a_rule_recorded_before_versions_decides_as_it_did():
    """Runs in flight keep the numbers they started with: a rule recorded without a
    version is version 1 (the per-step timeouts and heartbeat timeout of that time,
    no attempt limit, no growing cap), whatever today's defaults are."""
    old = RetryRule.from_dict({"budget_seconds": 604800, "max_worker_deaths": 10, "initial_interval": 0.2,
                               "backoff_coefficient": 2.0, "maximum_interval": 30.0, "jitter": 0.2,
                               "attempt_timeout": None})
    assert old.version == 1 and old.maximum_interval == 30.0 and old.attempts_per_step is None
    assert old.attempt_timeout_for("draft") == V1_ATTEMPT_TIMEOUT_SECONDS["draft"]
    assert old.heartbeat_timeout_seconds() == V1_HEARTBEAT_TIMEOUT
    assert RetryRule.from_dict(None).version == 1
    new = rule_from_env({})
    assert new.version == RULE_VERSION and new.step_timeouts == ATTEMPT_TIMEOUT_SECONDS
    assert RetryRule.from_dict(new.to_dict()) == new
    with pytest.raises(ValueError, match="version 7"):
        RetryRule.from_dict({**new.to_dict(), "version": 7})


def test_v1_values_are_frozen():
    """Histories recorded under version 1 replay with these values: they never change."""
    assert V1_ATTEMPT_TIMEOUT_SECONDS == {"draft": 60.0, "send_confirmation": 15.0, "record_outcome": 15.0}
    assert V1_HEARTBEAT_TIMEOUT == 1.0


def test_doubt_is_for_effects_and_sticks_until_success():
    effect = StepLedger("record_outcome", effect=True)
    effect.after_error("read timeout", 5, in_doubt=True)
    effect.after_error("connection refused", 0.01, in_doubt=False)
    assert effect.in_doubt
    draft = StepLedger("draft", effect=False)
    draft.after_error("read timeout", 5, in_doubt=True)
    assert not draft.in_doubt
    crashed = StepLedger("send_confirmation", effect=True)
    crashed.after_crash("heartbeat timeout")
    assert crashed.in_doubt  # the worker may have died after the provider applied it


def test_rule_from_env_and_its_errors():
    assert rule_from_env({}) == RetryRule()
    rule = rule_from_env({"LAB_RETRY_BUDGET_SECONDS": "30", "LAB_MAX_WORKER_DEATHS": "3"})
    assert (rule.budget_seconds, rule.max_worker_deaths) == (30.0, 3)
    assert RetryRule.from_dict(rule.to_dict()) == rule
    assert RetryRule.from_dict(None).version == 1  # a run that recorded no rule ran under version 1
    for env, word in (({"LAB_RETRY_BUDGET_SECONDS": "soon"}, "LAB_RETRY_BUDGET_SECONDS"),
                      ({"LAB_RETRY_BUDGET_SECONDS": "-1"}, "LAB_RETRY_BUDGET_SECONDS"),
                      ({"LAB_RETRY_BUDGET_SECONDS": "nan"}, "LAB_RETRY_BUDGET_SECONDS"),
                      ({"LAB_MAX_WORKER_DEATHS": "1.5"}, "LAB_MAX_WORKER_DEATHS")):
        with pytest.raises(ValueError, match=word):
            rule_from_env(env)


def test_the_default_budget_rides_out_a_ten_minute_outage():
    """An outage of 600 s: the attempts before it ends and the wait after it
    fit in the default budget, with the next try at most maximum_interval
    after the far side is back."""
    rule = RetryRule()
    ledger = StepLedger("send_confirmation", rule, effect=True)
    clock = 0.0
    while clock < 600:
        ledger.attempts += 1
        delay = ledger.after_error("unreachable", 0.01, u=1.0)
        assert delay is not None, f"gave up at {clock:.0f} s of a 600 s outage"
        clock += 0.01 + delay
    assert clock - 600 <= rule.maximum_interval
    assert run_timeout_floor(rule, 3) == 3 * (rule.budget_seconds + 60)
    assert math.isfinite(ledger.error_seconds) and ledger.error_seconds < rule.budget_seconds


def test_a_turn_stops_on_the_same_error_again_and_again_but_waits_out_an_outage():
    """An error answered to an unchanged request, word for word, ends the step at the limit; an outage
    (not reached, not taken on) neither counts nor breaks the row; another error starts the row again."""
    ledger = StepLedger("turn-3", RetryRule(), same_error_limit=SAME_ERROR_LIMIT)
    errors = [("HTTP 500: boom", False), ("HTTP 503: busy", True), ("HTTP 500: boom", False),
              ("HTTP 500: other", False), ("HTTP 500: boom", False), ("HTTP 500: boom", False),
              ("HTTP 503: busy", True), ("HTTP 500: boom", False)]
    delays = []
    for message, outage in errors:
        ledger.attempts += 1
        delays.append(ledger.after_error(message, 0.1, u=0.5, outage=outage))
    assert [d is not None for d in delays] == [True] * 7 + [False]
    assert ledger.failure == ("step turn-3 failed after 8 attempt(s): the same error on 3 attempts in a row on an "
                              "unchanged request (an outage would clear or change; this is the answer to the "
                              "request itself): HTTP 500: boom")
    # Off unless asked for: the flow's steps and the run record keep spending their budget.
    plain = StepLedger("draft", RetryRule())
    assert all(plain.after_error("HTTP 500: boom", 0.1, u=0.5) is not None for _ in range(10))
    # An error that came with a Retry-After is the other side asking for time: an outage, whatever its flag.
    asked_to_wait = StepLedger("turn-2", RetryRule(), same_error_limit=2)
    assert all(asked_to_wait.after_error("HTTP 500: boom", 0.1, u=0.5, retry_after=1.0) is not None
               for _ in range(5))
    # A reset starts the row again.
    again = StepLedger("turn-1", RetryRule(), same_error_limit=2)
    again.after_error("x", 0.1, u=0.5)
    again.afresh()
    assert again.after_error("x", 0.1, u=0.5) is not None
