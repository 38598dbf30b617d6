"""In doubt, said plainly, on both engines: when every answer to the email
is lost (the provider applied it, then "lost" the response: 503), the step
ends the run in doubt, not "failed, nothing sent"; ``settle`` asks the
provider by key and says it was applied, with its id; ``retry`` once the
answers come back finishes the run, the email applied once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from flowclient.runs import start_run
from lab.processes import REPO
from providerclient import ProviderClient, fetch_effects
from runrecord import RunRecord
from steps.keys import idempotency_key
from steps.retry import RetryRule
from tests.support import EMAIL, TASK, finished, status_json, wait_closed


async def set_faults(provider, **spec):
    """Inject ``spec`` at the provider, or clear every fault when it is empty."""
    async with ProviderClient(provider.url) as pc:
        await (pc.set_faults(**spec) if spec else pc.clear_faults())


def email_counts(provider, run_id):
    effect = {e.key: e
              for e in fetch_effects(provider.url, run_id=run_id)}[idempotency_key(run_id, "send_confirmation")]
    return effect.requests, effect.effects_applied


async def test_temporal_lost_answers_leave_the_step_in_doubt_and_settle_says_applied(
        client, dev_server, workers, provider, run_id, task_queue):
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(lose_response_next=1000, kinds=["email"])
    workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue, rule=RetryRule(budget_seconds=2))
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed"
    step = status["steps"][1]
    assert step["status"] == "in_doubt" and "settle" in step["note"], step
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "PROVIDER_URL": provider.url}
    settled = subprocess.run([sys.executable, "starter.py", "settle", run_id, "--json"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert settled.returncode == 0, settled.stderr
    report = {e["step"]: e for e in json.loads(settled.stdout)["steps"]}
    assert report["send_confirmation"]["state"] == "applied"
    assert report["send_confirmation"]["ids"]["message_id"].startswith("msg_")
    assert report["record_outcome"]["state"] == "never seen"
    requests, applied = email_counts(provider, run_id)
    assert applied == 1 and requests == step["attempts"]
    # The same words as the record's settle, but Temporal's history cannot take the answer: it says so.
    told = subprocess.run([sys.executable, "starter.py", "settle", run_id], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert told.returncode == 0, told.stderr
    assert "send_confirmation: applied at" in told.stdout, told.stdout
    assert f"`python starter.py retry {run_id}`: the same key gets this answer back" in told.stdout, told.stdout
    assert "Temporal's history cannot record these answers" in told.stdout, told.stdout
    assert (await wait_closed(client, run_id))["steps"][1]["status"] == "in_doubt"

    async with ProviderClient(provider.url) as pc:
        await pc.clear_faults()
    retried = subprocess.run([sys.executable, "starter.py", "retry", run_id, "--wait"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    done = await wait_closed(client, run_id)
    assert done["status"] == "completed"
    assert done["steps"][1]["result"]["message_id"] == report["send_confirmation"]["ids"]["message_id"]
    assert email_counts(provider, run_id) == (requests + 1, 1)


async def test_temporal_refused_connections_are_not_in_doubt(client, workers, provider, run_id, task_queue):
    """Connection refused: the request never left, so the step failed, nothing is in doubt."""
    worker = workers(extra_env={"PROVIDER_URL": "http://127.0.0.1:9"})
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue, rule=RetryRule(budget_seconds=1))
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed" and status["steps"][1]["status"] == "failed", status
    assert "unreachable" in status["error"] and worker.alive()


def test_record_lost_answers_leave_the_step_in_doubt_and_settle_records_applied(runrecord, provider, db, run_id):
    """The email applied, every answer lost: in doubt until ``settle`` records the provider's answer
    (applied, with its id); then the step is no longer in doubt, and ``retry`` gets that answer back."""
    asyncio.run(set_faults(provider, lose_response_next=1000, kinds=["email"]))
    run = runrecord("start", run_id, TASK, "--email", EMAIL, env={"LAB_RETRY_BUDGET_SECONDS": "2"})
    assert finished(run) == 1, run.output()
    status = status_json(runrecord, run_id)
    attempts = status["steps"][1]["attempts"]
    assert status["steps"][1]["status"] == "in_doubt", status
    settle = runrecord("settle", run_id)
    assert finished(settle) == 0, settle.output()
    assert "send_confirmation: applied at" in settle.output() and "message_id msg_" in settle.output()
    assert (f"run record: attempts {', '.join(str(n) for n in range(1, attempts + 1))} settled with this answer; "
            "the step is no longer in doubt") in settle.output(), settle.output()
    assert f"`python -m runrecord retry {run_id}`: the same key gets this answer back" in settle.output()
    # Recorded: the step is failed, not in doubt, and each intent holds the provider's answer.
    assert [s["status"] for s in status_json(runrecord, run_id)["steps"]] == ["completed", "failed", "pending"]
    with RunRecord(db) as record:
        intents = record.intents(run_id)
    assert {i.state for i in intents} == {"settled"} and len(intents) == attempts, intents
    message_id = intents[0].outcome["settled_by_provider"]["ids"]["message_id"]
    assert message_id.startswith("msg_")

    asyncio.run(set_faults(provider))
    again = runrecord("retry", run_id)
    assert finished(again) == 0, again.output()
    assert "intent in doubt" not in again.output()
    assert (f"settled by `settle`: send_confirmation attempts {', '.join(str(n) for n in range(1, attempts + 1))} "
            f"(Idempotency-Key {idempotency_key(run_id, 'send_confirmation')}): the provider said applied at") \
        in again.output(), again.output()
    assert "nothing is applied again" in again.output()
    assert status_json(runrecord, run_id)["steps"][1]["result"]["message_id"] == message_id
    assert email_counts(provider, run_id) == (attempts + 1, 1)


def test_record_settle_records_not_applied_and_leaves_a_running_run_alone(runrecord, provider, db, run_id):
    """503s, nothing applied: ``settle`` records "not applied" and the step is failed, no longer in
    doubt; ``retry`` says so and sends the email once. A run still running is not written to: its
    next attempt settles its own doubt."""
    asyncio.run(set_faults(provider, fail_next=1000, kinds=["email"]))
    run = runrecord("start", run_id, TASK, "--email", EMAIL, env={"LAB_RETRY_BUDGET_SECONDS": "2"})
    assert finished(run) == 1, run.output()
    attempts = status_json(runrecord, run_id)["steps"][1]["attempts"]
    settle = runrecord("settle", run_id)
    assert finished(settle) == 0, settle.output()
    assert "send_confirmation: not applied" in settle.output() and "the step is no longer in doubt" in settle.output()
    shown = runrecord("status", run_id)
    assert finished(shown) == 1
    assert "send_confirmation  failed" in shown.output() and "IN DOUBT" not in shown.output(), shown.output()
    assert shown.output().count("was in doubt; `settle` recorded the provider's answer at ") == attempts
    asyncio.run(set_faults(provider))
    again = runrecord("retry", run_id)
    assert finished(again) == 0, again.output()
    assert "the provider said not applied" in again.output() and "intent in doubt" not in again.output()
    assert email_counts(provider, run_id) == (attempts + 1, 1)

    crashed = run_id + "-crash"  # killed after the provider applied the email: running, in doubt
    first = runrecord("start", crashed, TASK, "--email", EMAIL, env={"CRASH_AT": "send_confirmation:after_effect"})
    assert finished(first) == -9, first.output()
    settle = runrecord("settle", crashed)
    assert finished(settle) == 0, settle.output()
    assert "send_confirmation: applied at" in settle.output()
    assert "run record: not recorded, the run is running" in settle.output(), settle.output()
    with RunRecord(db) as record:
        assert [i.state for i in record.intents(crashed)] == ["in_doubt"]


def test_record_503s_are_in_doubt_with_their_answers_recorded_and_retry_says_so(runrecord, provider, db, run_id):
    """Every attempt answered 503 (fail_next): each intent keeps its answer and stays in doubt (a 5xx
    may come from a gateway after the origin applied the request), and ``retry`` says exactly that of
    each one, not "no recorded answer". The last attempt, the one that spent the budget, included."""
    asyncio.run(set_faults(provider, fail_next=1000, kinds=["email"]))
    run = runrecord("start", run_id, TASK, "--email", EMAIL, env={"LAB_RETRY_BUDGET_SECONDS": "2"})
    assert finished(run) == 1, run.output()
    attempts = status_json(runrecord, run_id)["steps"][1]["attempts"]
    assert attempts >= 2, run.output()
    with RunRecord(db) as record:
        intents = record.intents(run_id)
    assert [(i.attempt, i.state) for i in intents] == [(n, "in_doubt") for n in range(1, attempts + 1)]
    assert all("503 injected_fault" in i.outcome["error"] for i in intents), intents
    shown = runrecord("status", run_id)
    assert finished(shown) == 1
    assert shown.output().count("IN DOUBT: ended in an error that does not say whether it was applied (a 5xx may "
                                "come from a gateway or proxy") == attempts, shown.output()
    assert "no answer recorded" not in shown.output()

    asyncio.run(set_faults(provider))
    again = runrecord("retry", run_id)
    assert finished(again) == 0, again.output()
    for n in range(1, attempts + 1):
        line = (f"intent in doubt: send_confirmation attempt {n} (Idempotency-Key "
                f"{idempotency_key(run_id, 'send_confirmation')}): ended in an error that does not say whether "
                "it was applied; repeating it with the same key")
        assert line in again.output(), again.output()
    assert "no recorded answer" not in again.output() and "no answer recorded" not in again.output()
    assert email_counts(provider, run_id) == (attempts + 1, 1)
