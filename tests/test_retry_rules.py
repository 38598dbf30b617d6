"""The retry rules (steps.retry), one definition for both engines: the budget,
the backoff with jitter, crashes apart from errors, and the one reading of
Retry-After. Plain arithmetic, so tested here directly; the engines' use of
it is tested with real processes (test_outage.py, test_crashes.py)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from drafting.openai_compat import retry_after_seconds
from providerclient import parse_retry_after as provider_parse
from steps.retry import (
    MAX_RETRY_AFTER,
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


def test_crashes_kept_from_before_a_reset_are_counted_but_not_held_against_the_limit():
    """A Temporal reset gives the step a fresh death count: the crashes it keeps are
    shown (``crashes``), and the limit counts only those after the reset."""
    ledger = StepLedger("draft", RetryRule(max_worker_deaths=1))
    for _ in range(3):
        ledger.attempts += 1
        ledger.kept_from_reset(crashed=True)
    ledger.attempts += 1
    ledger.kept_from_reset(crashed=False)  # an error kept from before: no crash, nothing spent
    assert (ledger.crashes, ledger.error_attempts, ledger.failure) == (3, 0, None)
    ledger.attempts += 1
    assert ledger.after_crash("heartbeat timeout")  # the first death since the reset
    ledger.attempts += 1
    assert not ledger.after_crash("heartbeat timeout")
    assert ledger.crashes == 5 and "worker died 2 times during draft" in ledger.failure


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
    assert RetryRule.from_dict(None) == RetryRule()
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
