"""Helpers the agent loop's tests share (tests/test_loop_*.py), written once, as tests/support.py is for
every test: plain functions and constants. The model stand-in process they count with is the ``standin``
fixture of tests/conftest.py; its count of a run's turns is ``durable_agents.testing.standin.turns_asked``.

The kill tests of the run record and DBOS (tests/test_loop_runrecord.py, tests/test_loop_dbos.py) run one
task on each engine: ``TASK`` names the two ``ORDERS``, each with something left to refund, so the scripted
model takes ``TURNS`` turns (a lookup; the refund and its email; the second lookup; its refund and email; the
ticket; the final answer) and the provider, the judge, applies 2 refunds, 2 emails and 1 ticket.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from durable_agents.providerclient import EffectRecord, fetch_effects, lookup_counts, seed_orders
from durable_agents.steps.loop import MIN_WINDOW_TOKENS
from durable_agents.steps.retry import SAME_ERROR_LIMIT
from durable_agents.testing.standin import FAILED_WORDS, turns_asked
from lab.processes import REPO

ORDERS = {"A-1001": 2500, "B-2002": 1200}
TASK = "Please refund my orders A-1001 and B-2002: both arrived broken."
CUSTOMER = "ada@example.com"
TURNS = 6

REFUND = "durable_agents.steps.refund_agent:REFUND_AGENT"
"""The lab's refund agent by its import string, as the kill matrix (``durable_agents.testing``) loads it."""


def refund_task(provider_url: str):
    """A task per run for the kill matrix: each run its own two orders, like ``ORDERS``, seeded at the provider
    before the run starts (runs side by side, or one after another, never refund one order twice between
    them); ``TURNS`` turns, as ``TASK``'s."""

    def task(run_id: str) -> str:
        tag = abs(hash(run_id)) % 10**6
        first, second = f"A-{tag:06d}1", f"B-{tag:06d}2"
        seed_orders(provider_url, {first: ORDERS["A-1001"], second: ORDERS["B-2002"]})
        return f"Please refund my orders {first} and {second}: both arrived broken."

    return task


def loop_matrix(kill_matrix: Any, provider_url: str, engine: str, points: Collection[str], **options: Any) -> Any:
    """The refund agent's loop killed at ``points`` on ``engine`` by the kill matrix (the plugin's
    ``kill_matrix``), each run a task of ``refund_task``'s, its turns counted at the matrix's stand-in;
    ``options`` are ``KillMatrix``'s (``at_kill``, ``at_end``: the record's shape at the kill, what the
    takeover printed). Asserts every point was reached and passed; the report."""
    report = kill_matrix(REFUND, refund_task(provider_url), params={"email": CUSTOMER},
                         env={"PROVIDER_URL": provider_url}, cwd=REPO, count_turns=True, engines=(engine,),
                         points=list(points), **options)
    report.assert_ok()
    assert sorted(r.point for r in report.rows) == sorted(points), report.table()
    return report


BAD_LOOP_INPUT = [
    (["--max-turns", "0"], "max turns must be a whole number from 1 to 10000, got 0"),
    (["--max-turns", "many"], "max turns must be a whole number from 1 to 10000, got 'many'"),
    (["--window-tokens", "10"], f"window tokens must be a whole number from {MIN_WINDOW_TOKENS}"),
    (["--email", "not-an-address"], "malformed"),
]
"""Bad input to ``loop`` after ``RUN_ID TASK --email ADDR``, and the words every engine's CLI refuses it with."""


def model_env(url: str) -> dict[str, str]:
    """The environment that makes a worker or a CLI process ask the stand-in at ``url`` (its API root)."""
    return {"LLM_BASE_URL": url, "LLM_MODEL": "scripted"}


def assert_each_effect_once(provider_url: str, run_id: str) -> list[EffectRecord]:
    """The provider's effects of ``TASK``'s run: 2 refunds, 2 emails, 1 ticket, each applied once."""
    effects = fetch_effects(provider_url, run_id=run_id)
    kinds = Counter(e.kind for e in effects if e.effects_applied == 1)
    assert kinds == {"refund": 2, "email": 2, "ticket": 1}, effects
    assert all(e.effects_applied == 1 for e in effects), effects
    return effects


def assert_resumed_asking_and_applying_once(standin: str, provider_url: str, run_id: str, *,
                                            before: Mapping[str, int], recorded: Collection[str],
                                            asked_twice: Collection[str], replayed: str | None) -> None:
    """After a kill and a resume of ``TASK``'s run, what the witnesses say.

    The stand-in's count: each turn asked once, those of ``asked_twice`` (whose answer the kill lost) twice;
    none after it was recorded: a turn among the steps ``recorded`` at the kill still has its count then
    (``before``). The provider: each effect once, each key requested once: the ``replayed`` key too (the call
    the kill interrupted after its effect, if any), whose retry asked the tool's lookup by key and took the
    applied refund's stored answer instead of sending it again; one lookup per order."""
    asked = turns_asked(standin, run_id)
    assert asked == {str(t): 2 if str(t) in asked_twice else 1 for t in range(1, TURNS + 1)}, asked
    assert all(asked[t] == n for t, n in before.items() if f"turn-{t}" in recorded), (before, asked)
    effects = assert_each_effect_once(provider_url, run_id)
    requests = {e.key: e.requests for e in effects}
    assert set(requests.values()) == {1} and (replayed is None or replayed in requests), (replayed, requests)
    assert lookup_counts(provider_url, run_id)["lookups"] == len(ORDERS)


def assert_failed_at_the_turn_limit(status: Mapping[str, Any], provider_url: str, run_id: str) -> None:
    """``TASK``'s run under ``--max-turns 3``, as its status (``status --json``) shows it: FAILED at turn 3,
    naming the limit and what to do next; what the turns before it did stays done, once; turn 3's calls never
    ran."""
    assert status["status"] == "failed" and status["current_step"] == "turn-3", status
    assert status["error"].startswith("step turn-3 failed after 1 attempt(s): turn limit of 3 reached: the model "
                                      "still asked for tools (lookup_order) at turn 3; none of them ran"), status
    assert "Start a new run (a new RUN_ID) with a higher turn limit" in status["error"]
    assert Counter(e.kind for e in fetch_effects(provider_url, run_id=run_id)) == {"refund": 1, "email": 1}


SAME_ERROR_FAILS = {"fail_status": 500}
"""The model stand-in's options (``durable_agents.testing.standin.ModelStandIn``) for a model that answers every turn
with the same model-side error, word for word (a 500 is transient, not an outage:
``durable_agents.drafting.openai_compat``)."""
OUTAGES_THAT_CLEAR = {
    "an outage, the same words": {"fail_status": 503, "fail_times": SAME_ERROR_LIMIT + 1},
    "errors that differ": {"fail_status": 500, "fail_times": SAME_ERROR_LIMIT + 1, "fail_varied": True},
}
"""Options for a model that fails more than ``SAME_ERROR_LIMIT`` times and then answers: neither stops a turn."""


def assert_stopped_by_the_same_error(status: Mapping[str, Any], asked: Mapping[str, int]) -> None:
    """``TASK``'s run whose model answered ``SAME_ERROR_FAILS`` to every turn, as its status (``status --json``)
    and the stand-in's count show it: FAILED at turn 1 after ``SAME_ERROR_LIMIT`` attempts, naming the turn,
    the rule and the error; the model asked exactly that many times, not for the whole retry budget."""
    assert status["status"] == "failed" and status["current_step"] == "turn-1", status
    assert status["error"].startswith(
        f"step turn-1 failed after {SAME_ERROR_LIMIT} attempt(s): the same error on {SAME_ERROR_LIMIT} attempts "
        "in a row on an unchanged request (an outage would clear or change; this is the answer to the request "
        "itself): the LLM server at "), status
    assert status["error"].endswith(f"answered HTTP 500: {FAILED_WORDS}"), status
    assert dict(asked) == {"1": SAME_ERROR_LIMIT}, asked
