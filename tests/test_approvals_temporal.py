"""A person in the loop on Temporal, with real processes: the session's dev server, worker processes
(``worker.py --agent tests.agents.approvals:...``) killed and replaced, the provider (the judge of effects), the
model stand-in (counting each turn's requests), and ``starter.py approve|deny`` as a person runs them. The
task's first refund (25.00) waits for a decision; the second (12.00) runs at once.

Approve (an update: answered, in history before the sender hears), deny, the deadline on a durable timer (both
ends a declaration allows), a decision sent while no worker runs (kept as a signal, taken when one starts), a
kill while the call waits then the approval, the same decision twice and a conflicting one, and bad input:
each effect once at the provider, no recorded turn asked again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from durable_agents.agent import load_agent
from durable_agents.flowclient.loop import loop_status, start_loop
from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.testing.standin import turns_asked
from lab.processes import REPO
from tests.loop_support import CUSTOMER, ORDERS, TASK, model_env

WAITS = "tests.agents.approvals:WAITS"


def kinds(provider_url: str, run_id: str) -> Counter:
    return Counter(e.kind for e in fetch_effects(provider_url, run_id=run_id) if e.effects_applied)


def starter(dev_server, *args: str, timeout: float = 60) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "starter.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TEMPORAL_ADDRESS": dev_server.address,
                                                "TEMPORAL_NAMESPACE": "default"})
    return done.returncode, done.stdout + done.stderr


async def wait_for_status(client, run_id: str, until, timeout: float = 60) -> dict:
    """``loop_status`` (from history, no worker needed) once ``until`` holds of it."""
    deadline = time.monotonic() + timeout
    while True:
        status = await loop_status(client, run_id)
        if until(status):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} did not get there in {timeout:.0f} s: {status}")
        await asyncio.sleep(0.2)


async def start(client, run_id: str, task_queue: str, spec: str = WAITS) -> None:
    agent = load_agent(spec)
    created, _ = await start_loop(client, run_id, TASK, task_queue=task_queue, agent=agent,
                                  params={"email": CUSTOMER}, agent_spec=spec)
    assert created


async def waiting(client, run_id: str, timeout: float = 60) -> dict:
    return await wait_for_status(client, run_id, lambda s: any(a.get("state") == "waiting"
                                                               for a in s.get("approvals") or ()),
                                 timeout=timeout)


@pytest.fixture
def agent_workers(workers, standin):
    def start_one(spec: str = WAITS, crash_at: str | None = None):
        return workers(crash_at=crash_at, extra_env=model_env(standin), args=["--agent", spec])

    return start_one


async def test_approve_over_an_update_then_the_call_runs_once(client, dev_server, agent_workers, provider, standin,
                                                             run_id, task_queue):
    seed_orders(provider.url, ORDERS)
    agent_workers()
    await start(client, run_id, task_queue)
    status = await waiting(client, run_id)
    [wait] = status["approvals"]
    assert (wait["call"], wait["tool"], wait["arguments"]) == ("turn-2/call-0", "issue_refund",
                                                                {"order_id": "A-1001", "amount": 2500}), wait
    assert "waits for a person's decision" in status["detail"] and kinds(provider.url, run_id) == Counter()
    code, said = starter(dev_server, "approve", run_id, "turn-2/call-0", "--by", "ana", "--reason", "photo")
    assert code == 0 and "decided: turn-2/call-0: approved by ana (photo)" in said, said
    done = await wait_for_status(client, run_id, lambda s: s["status"] != "running", timeout=60)
    assert done["status"] == "completed", done
    assert done["approvals"][0]["state"] == "approved" and done["approvals"][0]["decision"]["by"] == "ana"
    assert kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}
    assert set(turns_asked(standin, run_id).values()) == {1}
    # The same decision again: answered as the first was; a different one: refused, nothing sent.
    code, said = starter(dev_server, "approve", run_id, "turn-2/call-0", "--by", "ana", "--reason", "photo")
    assert code == 0 and "the same decision again, taken once" in said, said
    code, said = starter(dev_server, "deny", run_id, "turn-2/call-0", "--by", "ben")
    assert code == 2 and "a decision, once taken, stands" in said, said


async def test_deny_goes_back_to_the_model_and_bad_input_is_refused(client, dev_server, agent_workers, provider,
                                                                    run_id, task_queue):
    seed_orders(provider.url, ORDERS)
    agent_workers()
    await start(client, run_id, task_queue)
    await waiting(client, run_id)
    for args, words in [
        (("no-such-run", "turn-2/call-0"), "no run with id 'no-such-run'"),
        ((run_id, "turn-9/call-0"), "turn-9/call-0 is not waiting for a decision"),
        ((run_id, "turn-2"), "CALL is a call of the run as status names it"),
        ((run_id, "turn-2/call-0", "--reason", "a\x1b[31mred"), "holds a control character"),
        ((run_id, "turn-2/call-0", "--reason", "x" * 501), "--reason is 501 characters; at most 500"),
        ((run_id, "turn-2/call-0", "--digest", "0" * 16), "made for other arguments or another call"),
    ]:
        code, said = starter(dev_server, "approve", *args)
        assert code == 2 and words in said, (args, said)
    assert (await loop_status(client, run_id))["approvals"][0]["state"] == "waiting"
    code, said = starter(dev_server, "deny", run_id, "turn-2/call-0", "--by", "ben", "--reason", "too much")
    assert code == 0 and "denied by ben (too much)" in said, said
    done = await wait_for_status(client, run_id, lambda s: s["status"] != "running", timeout=60)
    call, after = done["turns"][1]["calls"]
    assert call["outcome"] == "refused" and "denied by ben" in call["result"], call
    # The email asked for in the same turn is refused too, in workflow code (no activity), and read so.
    assert after["outcome"] == "refused" and "turn-2/call-0 of this turn was not approved" in after["result"], after
    assert kinds(provider.url, run_id) == {"refund": 1, "email": 1, "ticket": 1}


async def test_a_decision_sent_while_no_worker_runs_is_kept_and_taken_by_the_next(
        client, dev_server, agent_workers, provider, standin, run_id, task_queue):
    """The worker is SIGKILLed while the call waits (its wait in history); the decision, sent with no worker, is
    kept in history (a signal) and acted on when a worker starts: the refund once, no recorded turn asked
    again."""
    seed_orders(provider.url, ORDERS)
    first = agent_workers()
    await start(client, run_id, task_queue)
    await waiting(client, run_id)  # the wait is in history
    first.kill()
    assert first.wait(10) == -9
    asked = turns_asked(standin, run_id)
    code, said = starter(dev_server, "approve", run_id, "turn-2/call-0", "--by", "ana", "--accept-seconds", "2")
    assert code == 0 and said.startswith("kept: turn-2/call-0: no worker accepted the decision"), said
    kept = await loop_status(client, run_id)
    assert [a["state"] for a in kept["approvals"]] == ["waiting", "kept"], kept["approvals"]
    assert kinds(provider.url, run_id) == Counter()
    agent_workers()
    done = await wait_for_status(client, run_id, lambda s: s["status"] != "running", timeout=90)
    assert done["status"] == "completed" and done["approvals"][0]["state"] == "approved", done.get("approvals")
    assert kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}
    final = turns_asked(standin, run_id)
    assert all(final[t] == n for t, n in asked.items()) and set(final.values()) == {1}, (asked, final)


async def test_a_kill_right_after_the_decision_neither_loses_it_nor_applies_twice(
        client, dev_server, agent_workers, provider, standin, run_id, task_queue):
    seed_orders(provider.url, ORDERS)
    first = agent_workers(crash_at="approval:decided")
    await start(client, run_id, task_queue)
    await waiting(client, run_id)
    code, said = starter(dev_server, "approve", run_id, "turn-2/call-0", "--by", "ana")
    assert code == 0, said
    assert first.wait(60) == -9, first.output()
    agent_workers()
    done = await wait_for_status(client, run_id, lambda s: s["status"] != "running", timeout=90)
    assert done["status"] == "completed", done
    assert kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}
    assert set(turns_asked(standin, run_id).values()) == {1}


@pytest.mark.parametrize("spec, ends", [("tests.agents.approvals:EXPIRES", "completed"),
                                        ("tests.agents.approvals:EXPIRES_FAILS", "failed")])
async def test_no_decision_by_the_deadline_ends_on_a_durable_timer_as_declared(
        spec, ends, client, dev_server, agent_workers, provider, run_id, task_queue):
    seed_orders(provider.url, ORDERS)
    agent_workers(spec)
    await start(client, run_id, task_queue, spec)
    done = await wait_for_status(client, run_id, lambda s: s["status"] != "running", timeout=90)
    assert done["status"] == ends and done["approvals"][0]["state"] == "expired", done
    assert kinds(provider.url, run_id)["refund"] == (1 if ends == "completed" else 0)
    if ends == "failed":
        assert "turn-2/call-0 (issue_refund)" in done["error"], done["error"]
    code, said = starter(dev_server, "approve", run_id, "turn-2/call-0", "--by", "late")
    assert code == 2 and ("too late" in said or "has run" in said), said
