"""A person in the loop on the engines whose runs are processes of their own, the run record (``python -m
durable_agents.runrecord``) and DBOS (``python -m durable_agents.dbosflow``): the same commands on both, with
real processes: the provider (the judge of effects), the model stand-in (counting each turn's requests), and the
refund agent whose refunds over 20.00 wait for a decision (tests/agents/approvals.py). The task's first refund
(25.00) waits; the second (12.00) runs at once. (Temporal's: tests/test_approvals_temporal.py.)

Approve, deny, the deadline (refused back to the model, or the run failed), a kill while the call waits then
the approval, a decision taken while no process runs, the same decision twice and a conflicting one, and bad
input: each effect once at the provider, no recorded turn asked again."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.testing.standin import turns_asked
from tests.loop_support import CUSTOMER, ORDERS, TASK, model_env
from tests.support import finished, status_json

WAITS = "tests.agents.approvals:WAITS"


@pytest.fixture(params=["runrecord", "dbos"])
def loop(request, provider, standin):
    """``python -m durable_agents.runrecord ...`` or ``python -m durable_agents.dbosflow ...``, the stand-in as the
    model, the task's orders seeded."""
    if request.param == "dbos":
        pytest.importorskip("dbos", reason="DBOS Transact is an optional extra (make test installs it)")
    procs = request.getfixturevalue("runrecord" if request.param == "runrecord" else "dbos_procs")
    seed_orders(provider.url, ORDERS)

    def start(*args: str, crash_at: str = ""):
        return procs(*args, env={**model_env(standin), "CRASH_AT": crash_at})

    start.engine = request.param  # type: ignore[attr-defined]
    return start


def start_waiting(loop, run_id: str, agent: str = WAITS):
    """A run started; returned once its first refund waits (the run's process still running)."""
    proc = loop("loop", run_id, TASK, "--agent", agent, "--param", f"email={CUSTOMER}")
    proc.wait_for_line("waits for a person's decision", timeout=60)
    return proc


def kinds(provider_url: str, run_id: str) -> Counter:
    return Counter(e.kind for e in fetch_effects(provider_url, run_id=run_id) if e.effects_applied)


def decide(loop, verb: str, run_id: str, *args: str):
    proc = loop(verb, run_id, *args)
    code = finished(proc)
    return code, proc.output()


def test_an_approved_call_runs_once_and_the_decision_is_recorded_before_it(loop, provider, standin, run_id):
    proc = start_waiting(loop, run_id)
    waiting = status_json(loop, run_id)
    [wait] = waiting["approvals"]
    assert (wait["call"], wait["tool"], wait["state"]) == ("turn-2/call-0", "issue_refund", "waiting"), wait
    assert wait["arguments"] == {"order_id": "A-1001", "amount": 2500} and wait["key"].startswith("agentlab/")
    assert "waits for a person's decision on issue_refund" in waiting["detail"], waiting["detail"]
    step = next(s for s in waiting["steps"] if s["name"] == "turn-2/call-0")
    assert step["status"] == "waiting" and "waits for a person's decision until" in step["note"], step
    assert kinds(provider.url, run_id) == Counter()  # nothing applied while it waits
    code, said = decide(loop, "approve", run_id, "turn-2/call-0", "--by", "ana", "--reason", "checked the photo")
    assert code == 0 and "decided: turn-2/call-0: approved by ana (checked the photo)" in said, said
    assert finished(proc) == 0, proc.output()
    done = status_json(loop, run_id)
    assert done["status"] == "completed"
    [wait] = done["approvals"]
    assert wait["state"] == "approved" and wait["decision"]["by"] == "ana", wait
    assert kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}
    assert set(turns_asked(standin, run_id).values()) == {1}
    # The decision was recorded before the refund was sent: its time is before the provider first saw the key.
    refund = next(e for e in fetch_effects(provider.url, run_id=run_id) if e.key == wait["key"])
    assert wait["decision"]["at"] <= refund.first_seen, (wait["decision"], refund.first_seen)


def test_a_denied_call_goes_back_to_the_model_refused_with_nothing_applied(loop, provider, standin, run_id):
    proc = start_waiting(loop, run_id)
    code, said = decide(loop, "deny", run_id, "turn-2/call-0", "--by", "ben", "--reason", "over the limit")
    assert code == 0 and "denied by ben" in said, said
    assert finished(proc) == 0, proc.output()
    done = status_json(loop, run_id)
    call, after = (next(s for s in done["steps"] if s["name"] == name) for name in ("turn-2/call-0", "turn-2/call-1"))
    assert call["result"]["status"] == "refused" and "denied by ben (over the limit)" in call["result"]["content"]
    # The email the model asked for in the same turn ("we refunded ...") does not go out either.
    assert after["result"]["status"] == "refused" and "turn-2/call-0 of this turn was not approved" in (
        after["result"]["content"]), after
    assert kinds(provider.url, run_id) == {"refund": 1, "email": 1, "ticket": 1}  # the second order's only


def test_bad_decisions_are_refused_and_nothing_is_recorded(loop, provider, run_id):
    proc = start_waiting(loop, run_id)
    for args, words in [
        (("no-such-run", "turn-2/call-0"), "'no-such-run'"),
        ((run_id, "turn-9/call-0"), "turn-9/call-0 is not waiting for a decision"),
        ((run_id, "step-2"), "CALL is a call of the run as status names it"),
        ((run_id, "turn-2/call-0", "--reason", "line one\nline two"), "holds a control character"),
        ((run_id, "turn-2/call-0", "--reason", "x" * 501), "--reason is 501 characters; at most 500"),
        ((run_id, "turn-2/call-0", "--digest", "0" * 16), "made for other arguments or another call"),
    ]:
        code, said = decide(loop, "approve", *args)
        assert code == 2 and words in said, (args, said)
    assert status_json(loop, run_id)["approvals"][0]["state"] == "waiting"
    # The same decision twice: taken once, answered the same; then a different one: refused.
    assert decide(loop, "approve", run_id, "turn-2/call-0", "--by", "ana")[0] == 0
    code, said = decide(loop, "approve", run_id, "turn-2/call-0", "--by", "ana")
    assert code == 0 and "already approved by ana; the same decision again, taken once" in said, said
    code, said = decide(loop, "deny", run_id, "turn-2/call-0", "--by", "ben")
    assert code == 2 and "already approved by ana: a decision, once taken, stands" in said, said
    assert finished(proc) == 0, proc.output()
    assert kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}


@pytest.mark.parametrize("point", ["approval:waiting", "approval:decided"])
def test_a_kill_while_it_waits_then_the_approval_applies_once(point, loop, provider, standin, run_id):
    """Killed at the wait's start (the wait recorded, no decision), or right after the decision was read: the
    decision, sent while no process runs, is kept in the record; the resume neither asks a recorded turn again
    nor loses the decision, and the refund applies once."""
    first = loop("loop", run_id, TASK, "--agent", WAITS, "--param", f"email={CUSTOMER}", crash_at=point)
    if point == "approval:decided":
        first.wait_for_line("waits for a person's decision", timeout=60)
        assert decide(loop, "approve", run_id, "turn-2/call-0", "--by", "ana")[0] == 0
    assert finished(first) == -9, first.output()
    asked = turns_asked(standin, run_id)
    if point == "approval:waiting":
        [wait] = status_json(loop, run_id)["approvals"]  # no process runs it: still waiting, within its deadline
        assert wait["state"] == "waiting" and "note" not in wait, wait
        code, said = decide(loop, "approve", run_id, "turn-2/call-0", "--by", "ana")  # no process running
        assert code == 0 and ("none running" in said if loop.engine == "runrecord" else "kept: " in said), said
    assert kinds(provider.url, run_id) == Counter()
    again = loop("resume", run_id)
    assert finished(again) == 0, again.output()
    assert kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}
    final = turns_asked(standin, run_id)
    assert all(final[t] == n for t, n in asked.items()) and set(final.values()) == {1}, (asked, final)


@pytest.mark.parametrize("agent, ends", [("tests.agents.approvals:EXPIRES", "completed"),
                                         ("tests.agents.approvals:EXPIRES_FAILS", "failed")])
def test_no_decision_by_the_deadline_ends_as_the_declaration_says(agent, ends, loop, provider, run_id):
    proc = loop("loop", run_id, TASK, "--agent", agent, "--param", f"email={CUSTOMER}")
    assert finished(proc) == (0 if ends == "completed" else 1), proc.output()
    status = status_json(loop, run_id)
    assert status["status"] == ends and status["approvals"][0]["state"] == "expired", status
    assert kinds(provider.url, run_id)["refund"] == (1 if ends == "completed" else 0)
    if ends == "failed":
        assert "turn-2/call-0 " in status["error"] or "issue_refund" in status["error"], status["error"]
    code, said = decide(loop, "approve", run_id, "turn-2/call-0", "--by", "late")
    assert code == 2 and "too late" in said, said
    print(json.dumps(status["approvals"]))


def test_a_wait_past_its_deadline_reads_expired_while_no_process_runs(loop, provider, run_id):
    """Killed while it waits, its deadline (2 s) passing with no process: status says expired (noted as not yet
    recorded) and a decision is refused as too late; the resume records the expiry and the run ends."""
    first = loop("loop", run_id, TASK, "--agent", "tests.agents.approvals:EXPIRES", "--param", f"email={CUSTOMER}",
                 crash_at="approval:waiting")
    assert finished(first) == -9, first.output()
    time.sleep(2.5)
    [wait] = status_json(loop, run_id)["approvals"]
    assert wait["state"] == "expired" and "the run's next process records" in wait["note"], wait
    code, said = decide(loop, "approve", run_id, "turn-2/call-0", "--by", "late")
    assert code == 2 and "too late" in said, said
    again = loop("resume", run_id)
    assert finished(again) == 0, again.output()
    [wait] = status_json(loop, run_id)["approvals"]
    assert wait["state"] == "expired" and "note" not in wait, wait
    assert kinds(provider.url, run_id) == {"refund": 1, "email": 1, "ticket": 1}  # the second order's only
