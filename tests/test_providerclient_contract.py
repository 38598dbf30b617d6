"""The client's side against docs/provider-contract.md: ``durable_agents.steps.limits``'
constants equal the table's, and the checks the client makes before anything
reaches the provider (``durable_agents.steps.limits``, the model's draft in
``durable_agents.drafting.base``, the keys and metadata the steps derive) hold to every row
the table says the client enforces, at the table's numbers. (The provider's
side: tests/test_provider_contract.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durable_agents.drafting.base import Draft, DraftError
from durable_agents.steps import limits
from durable_agents.steps.adoption import START_ID_METADATA, start_metadata
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.limits import InputError, check_email, check_run_id
from durable_agents.steps.plan import STEP_NAMES
from tests.support import (
    ADDRESSES_MALFORMED,
    ADDRESSES_OK,
    MULTILINE_OK,
    NOT_MULTILINE,
    NOT_SINGLE_LINE,
    TEXT_OK,
    contract_limits,
)

LIMITS = contract_limits()


def draft(**fields: str) -> Draft:
    return Draft(**{"subject": "Your refund", "body": "Hello Ada,\n\nDone.", "summary": "Refund confirmed", **fields})


def accepts(check: Callable[[Any], object], *values: Any) -> None:
    for value in values:
        check(value)


def refuses(check: Callable[[Any], object], *values: Any) -> None:
    for value in values:
        with pytest.raises((InputError, DraftError)):
            check(value)


def subject(v: str) -> Draft:
    return draft(subject=v)


def body(v: str) -> Draft:
    return draft(body=v)


def summary(v: str) -> Draft:
    return draft(summary=v)


def at_and_past(check: Callable[[Any], object], at: Any, past: Any) -> None:
    accepts(check, at)
    refuses(check, past)


def derived_keys_fit(n: int | None) -> None:
    longest_run_id = check_run_id("r" * limits.MAX_RUN_ID_CHARS)
    for step in STEP_NAMES:
        key = idempotency_key(longest_run_id, step)
        assert 1 <= len(key) <= (n or 0) and all("\x21" <= ch <= "\x7e" for ch in key), key


def blank_refused(n: int | None) -> None:
    refuses(check_run_id, "", "  ")
    refuses(check_email, "")
    refuses(subject, "", " ")
    refuses(summary, "", "\u3000")


def start_id_metadata_fits(n: int | None) -> None:
    assert start_metadata("") is None
    assert 1 <= len(start_metadata("a-start-id") or {}) <= (n or 0)


def start_id_key_fits(n: int | None) -> None:
    key = START_ID_METADATA
    assert 1 <= len(key) <= (n or 0) and all(ch.isascii() and (ch.isalnum() or ch in "_.-") for ch in key), key


CASES: dict[str, Callable[[int | None], None]] = {
    "key-length": derived_keys_fit,
    "required": blank_refused,
    "run-id-length": lambda n: at_and_past(check_run_id, "r" * (n or 0), "r" * ((n or 0) + 1)),
    "run-id-text": lambda n: refuses(check_run_id, *NOT_SINGLE_LINE),
    "run-id-format": lambda n: (accepts(check_run_id, "order-1234", "A.b_c-9"),
                                refuses(check_run_id, "has space", "-x", "a/b")),
    "to-length": lambda n: at_and_past(check_email, "a" * ((n or 0) - len("@example.com")) + "@example.com",
                                       "a" * ((n or 0) + 1 - len("@example.com")) + "@example.com"),
    "to-format": lambda n: (accepts(check_email, *ADDRESSES_OK), refuses(check_email, *ADDRESSES_MALFORMED)),
    "to-text": lambda n: refuses(check_email, *(f"ada{v}@example.com" for v in NOT_SINGLE_LINE)),
    "subject-length": lambda n: at_and_past(subject, "s" * (n or 0), "s" * ((n or 0) + 1)),
    "subject-text": lambda n: (accepts(subject, "Your refund" + TEXT_OK),
                               refuses(subject, *("Your refund" + v for v in NOT_SINGLE_LINE))),
    "body-length": lambda n: at_and_past(body, "b" * (n or 0), "b" * ((n or 0) + 1)),
    "body-text": lambda n: (accepts(body, *MULTILINE_OK), refuses(body, *NOT_MULTILINE)),
    "summary-length": lambda n: at_and_past(summary, "s" * (n or 0), "s" * ((n or 0) + 1)),
    "summary-text": lambda n: (accepts(summary, "Refund confirmed" + TEXT_OK),
                               refuses(summary, *("Refund confirmed" + v for v in NOT_SINGLE_LINE))),
    "metadata-entries": start_id_metadata_fits,
    "metadata-key": start_id_key_fits,
}


def test_every_row_the_client_enforces_has_a_case_here() -> None:
    enforced = sorted(row for row, limit in LIMITS.items() if limit.client != "no")
    assert sorted(CASES) == enforced, "docs/provider-contract.md and this test name different rows"


@pytest.mark.parametrize("row", [r for r, limit in LIMITS.items() if limit.client not in ("rule", "no")])
def test_the_clients_constant_is_the_tables(row: str) -> None:
    limit = LIMITS[row]
    assert getattr(limits, limit.client) == limit.limit, (row, limit)


@pytest.mark.parametrize("row", sorted(CASES))
def test_the_client_holds_to_the_row(row: str) -> None:
    CASES[row](LIMITS[row].limit)
