"""In doubt, said plainly, on every engine: when every answer to the email
is lost (the provider applied it, then "lost" the response: 503), the step
ends the run in doubt, not "failed, nothing sent"; ``settle`` asks the
provider by key and says it was applied, with its id; ``retry`` once the
answers come back finishes the run, the email applied once.

The same for every other way an effect's outcome is unknown: a Temporal run
closed (terminated, cancelled) while an attempt was open, or with an attempt
cancelled after a worker took it; an unexpected exception in an effect step
(the activity wrapper, the run record, DBOS's status); a 2xx answer the
client cannot read (the provider applied it). A step without an effect is
never in doubt: it is failed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from durable_agents.activities import FlowActivities
from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import IN_DOUBT_NOTE, activity_traces
from durable_agents.providerclient import ProviderClient, fetch_effects
from durable_agents.runrecord import Runner, RunRecord
from durable_agents.runrecord.status import status_of as record_status
from durable_agents.steps.errors import PermanentError, TransientError
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.models import DraftRequest, RecordRequest, SendRequest
from durable_agents.steps.retry import RetryRule
from durable_agents.wiring import deps_from_env
from lab.processes import REPO
from tests.probe.cancelled_attempts import CancelledAttemptProbe
from tests.support import EMAIL, TASK, finished, poll_until, status_json, wait_closed


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
    assert "still shows send_confirmation in_doubt" in told.stdout, told.stdout
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
    # Completed now: settle says so, with no retry (it would refuse the run) and nothing in doubt.
    after = subprocess.run([sys.executable, "starter.py", "settle", run_id], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert after.returncode == 0 and f"run {run_id} completed: nothing to do" in after.stdout, after
    assert "starter.py retry" not in after.stdout and "in_doubt" not in after.stdout, after.stdout


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
    assert f"`python -m durable_agents.runrecord retry {run_id}`: the same key gets this answer back" in settle.output()
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


# -- a Temporal run closed while an effect's attempt was open -------------------------------------------


async def pending_attempt(client, workflow_id: str, step: str, state: int):
    """The run's pending attempt of ``step`` (describe), once it is in ``state``."""
    async def seen():
        described = await client.get_workflow_handle(workflow_id).describe()
        return next((p for p in described.raw_description.pending_activities
                     if p.activity_type.name == step and p.state == state), None)

    return await poll_until(seen, timeout=60,
                            what=f"{step} of {workflow_id} to be {PendingActivityState.Name(state)}")


def starter_status(dev_server, run_id: str) -> tuple[int, dict]:
    """``starter.py status RUN_ID --json``: its exit code and the status."""
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address}
    done = subprocess.run([sys.executable, "starter.py", "status", run_id, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout)


async def test_temporal_terminated_mid_effect_leaves_the_step_in_doubt(
        client, dev_server, workers, provider, run_id, task_queue):
    """The email's request is held by the provider (it may be applied any moment) when the run is
    terminated: history closes no attempt then, and the step is in doubt, pointing at settle."""
    await set_faults(provider, hang_next=1000, hang_seconds=60, kinds=["email"])
    workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    sending = await pending_attempt(client, run_id, "send_confirmation",
                                    PendingActivityState.PENDING_ACTIVITY_STATE_STARTED)
    assert sending.activity_id == "send_confirmation/1", sending
    await client.get_workflow_handle(run_id).terminate(reason="test: terminated mid-effect")

    code, status = starter_status(dev_server, run_id)
    assert code == 1 and status["status"] == "failed", status
    assert status["error"] == "terminated: test: terminated mid-effect", status
    assert [s["status"] for s in status["steps"]] == ["completed", "in_doubt", "pending"], status
    step = status["steps"][1]
    assert step["note"] == IN_DOUBT_NOTE and "`python starter.py settle RUN_ID`" in step["note"], step
    assert step["attempts"] == 1, step
    history = await client.get_workflow_handle(run_id).fetch_history()
    [trace] = [t for t in (await activity_traces(client, history)).values() if t.step == "send_confirmation"]
    assert trace.outcome == "running" and trace.events == ["ActivityTaskScheduled"], trace  # open at the close


@activity.defn(name="draft")
async def probe_draft(what: str) -> dict:
    return await _probe_attempt(what)


@activity.defn(name="send_confirmation")
async def probe_send(what: str) -> dict:
    return await _probe_attempt(what)


async def _probe_attempt(what: str) -> dict:
    """The probe's attempt: completes at once, or runs until cancelled (a cancel reaches it at a heartbeat)."""
    if what == "complete":
        return {"result": {"probe": "completed"}, "attempt": 2}
    while True:
        activity.heartbeat()
        await asyncio.sleep(0.1)


async def test_temporal_status_reads_cancelled_and_open_attempts(client, run_id):
    """ActivityTaskCancelRequested and ActivityTaskCanceled as a real server writes them
    (``tests/probe/cancelled_attempts.py``): an effect's attempt cancelled after a worker took it is in
    doubt; one cancelled before any worker took it, or followed by an attempt that completed, is not;
    a step without an effect is failed, cancelled or open when the run closed."""
    queue = f"probe-{uuid.uuid4().hex[:8]}"
    nobody = f"{queue}-nobody"  # no worker polls it: an attempt there is only ever scheduled
    started, scheduled = (PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,
                          PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED)

    async def probe(case: str, step: str, mode: str, state: int, activity_queue: str = queue):
        workflow_id = f"{run_id}-{case}"
        handle = await client.start_workflow(CancelledAttemptProbe.run, args=[step, mode, activity_queue],
                                             id=workflow_id, task_queue=queue)
        await pending_attempt(client, workflow_id, step, state)
        return workflow_id, handle

    async with Worker(client, task_queue=queue, workflows=[CancelledAttemptProbe],
                      activities=[probe_draft, probe_send]):
        mid_effect, handle = await probe("mid-effect", "send_confirmation", "await", started)
        await handle.cancel()
        never_taken, handle = await probe("never-taken", "send_confirmation", "await", scheduled, nobody)
        await handle.cancel()
        then_completed, handle = await probe("then-completed", "send_confirmation", "signal", started)
        await handle.signal(CancelledAttemptProbe.cancel_attempt)
        draft_cancelled, handle = await probe("draft-cancelled", "draft", "await", started)
        await handle.cancel()
        draft_open, handle = await probe("draft-open", "draft", "await", started)
        await handle.terminate(reason="test: terminated mid-draft")
        closed = {case: await wait_closed(client, case)
                  for case in (mid_effect, never_taken, then_completed, draft_cancelled, draft_open)}

    def step(case: str, name: str) -> dict:
        return next(s for s in closed[case]["steps"] if s["name"] == name)

    assert closed[mid_effect]["status"] == "failed" and closed[mid_effect]["error"] == "canceled", closed[mid_effect]
    sent = step(mid_effect, "send_confirmation")
    assert (sent["status"], sent["note"]) == ("in_doubt", IN_DOUBT_NOTE), sent
    assert sent["last_error"] == "cancelled while it ran: it may have sent its request", sent
    history = await client.get_workflow_handle(mid_effect).fetch_history()
    [trace] = (await activity_traces(client, history)).values()
    assert trace.outcome == "canceled" and trace.cancel_requested, trace
    assert {"ActivityTaskCancelRequested", "ActivityTaskStarted", "ActivityTaskCanceled"} <= set(trace.events), trace

    unsent = step(never_taken, "send_confirmation")
    assert (unsent["status"], unsent["note"]) == ("failed", None), unsent
    assert unsent["last_error"] == "cancelled before a worker took it", unsent

    assert closed[then_completed]["error"] == "probe: the run ends here, after the step completed"
    done = step(then_completed, "send_confirmation")
    assert (done["status"], done["attempts"], done["result"]) == ("completed", 2, {"probe": "completed"}), done

    assert step(draft_cancelled, "draft")["status"] == "failed", closed[draft_cancelled]
    assert closed[draft_open]["error"] == "terminated: test: terminated mid-draft", closed[draft_open]
    assert (step(draft_open, "draft")["status"], step(draft_open, "draft")["note"]) == ("failed", None)


# -- an unexpected exception in an effect step --------------------------------------------------------


class Unexpected:
    """A provider and a model whose every call fails in a way nobody planned for (not a ``StepError``)."""

    name = "unexpected"

    async def send_email(self, **request):
        raise RuntimeError("the HTTP pool fell over")

    async def create_ticket(self, **request):
        raise RuntimeError("the HTTP pool fell over")

    async def draft(self, messages):
        raise RuntimeError("the model client fell over")

    async def aclose(self):
        return None


@pytest.mark.parametrize("step, in_doubt", [("draft", False), ("send_confirmation", True),
                                             ("record_outcome", True)])
async def test_the_activity_marks_an_unexpected_exception_in_an_effect_step_in_doubt(step, in_doubt):
    """What the workflow reads (``durable_agents.workflows.attempts``): the failure's details say ``in_doubt`` for an
    effect step, since the exception may have come after the request reached the provider."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type=step, activity_id=f"{step}/1")
    key = idempotency_key("r-1", step)
    request = {"draft": DraftRequest("r-1", TASK, "r-1"),
               "send_confirmation": SendRequest("r-1", EMAIL, "Your refund", "Hello Ada", key),
               "record_outcome": RecordRequest("r-1", "Refund confirmed", "msg_1", key)}[step]
    flow_activities = FlowActivities(StepDeps(provider=Unexpected(), llm=Unexpected()))
    with pytest.raises(ApplicationError) as raised:
        await env.run(getattr(flow_activities, step), request)
    failure = raised.value
    assert failure.type == "RuntimeError" and not failure.non_retryable, failure
    assert failure.details[0]["in_doubt"] is in_doubt, failure.details


@pytest.mark.parametrize("step, shown", [("draft", "failed"), ("send_confirmation", "in_doubt")])
async def test_record_an_unexpected_exception_in_an_effect_step_is_in_doubt(db, run_id, step, shown):
    """The run record agrees: the step ends in doubt and each attempt's intent stays in doubt."""
    fails = dataclasses.replace(deps_from_env({"MEMORY_DB": "off"}), provider=Unexpected())
    if step == "draft":
        fails = dataclasses.replace(fails, llm=Unexpected())

    async def no_wait(seconds: float) -> None:
        return None

    runner = Runner(db, fails, heartbeat=False, say=lambda line: None, sleep=no_wait,
                    rule=RetryRule(budget_seconds=1))
    try:
        run = await runner.start(run_id, TASK, EMAIL)
    finally:
        runner.close()
    status = record_status(run)
    position = 0 if step == "draft" else 1
    assert status["status"] == "failed" and status["steps"][position]["status"] == shown, status
    assert "RuntimeError" in status["steps"][position]["last_error"], status
    if step == "send_confirmation":
        with RunRecord(db) as record:
            intents = record.intents(run_id)
        assert intents and {i.state for i in intents} == {"in_doubt"}, intents


@pytest.mark.parametrize("step, errors, shown", [
    ("send_confirmation", [RuntimeError("the HTTP pool fell over")] * 2, "in_doubt"),
    ("send_confirmation", [TransientError("503", in_doubt=True), TransientError("unreachable")], "in_doubt"),
    ("send_confirmation", [TransientError("unreachable")] * 2, "failed"),
    ("draft", [RuntimeError("the model client fell over")] * 2, "failed"),
], ids=["unexpected", "an-earlier-attempt-in-doubt", "never-sent", "draft"])
def test_dbos_status_agrees_on_what_may_have_been_applied(step, errors, shown):
    """DBOS's status of a step whose retries were spent: in doubt when any recorded attempt's error may
    have applied the effect, as on the other engines."""
    pytest.importorskip("dbos", reason="DBOS Transact is an optional extra: pip install -e '.[dbos]'")
    from dbos import error as dbos_errors  # DBOS's public name for its exceptions

    from durable_agents.dbosflow.engine import APP_VERSION, StepFailed
    from durable_agents.dbosflow.status import status_of

    rows = [{"function_name": step, "output": None, "error": dbos_errors.DBOSMaxStepRetriesExceeded(step, 2, errors)}]
    if step != "draft":
        rows.insert(0, {"function_name": "draft", "error": None,
                        "output": {"dispatch": 1, "attempt": 1, "result": {"subject": "s"}}})
    wf = SimpleNamespace(workflow_id="dbos-doubt", status="ERROR", recovery_attempts=1, app_version=APP_VERSION,
                         error=StepFailed(f"step {step} failed after 2 attempt(s)"), executor_id="local")
    status = status_of({"workflow": wf, "steps": rows}, version=APP_VERSION)
    assert status["status"] == "failed", status
    assert next(s for s in status["steps"] if s["name"] == step)["status"] == shown, status


def test_dbos_status_a_permanent_error_is_not_in_doubt():
    pytest.importorskip("dbos", reason="DBOS Transact is an optional extra: pip install -e '.[dbos]'")
    from durable_agents.dbosflow.engine import APP_VERSION, StepFailed
    from durable_agents.dbosflow.status import status_of

    rows = [{"function_name": "draft", "error": None, "output": {"dispatch": 1, "attempt": 1, "result": {}}},
            {"function_name": "send_confirmation", "output": None, "error": PermanentError("422 recipient")}]
    wf = SimpleNamespace(workflow_id="dbos-bounce", status="ERROR", recovery_attempts=1, app_version=APP_VERSION,
                         error=StepFailed("step send_confirmation failed after 1 attempt(s)"), executor_id="local")
    assert status_of({"workflow": wf, "steps": rows}, version=APP_VERSION)["steps"][1]["status"] == "failed"


# -- a 2xx the client cannot read ---------------------------------------------------------------------


@pytest.fixture
def odd_provider():
    """A stand-in provider on loopback that answers every POST with ``answer``: status, content type, body."""
    answer: dict = {"status": 200, "type": None, "body": b""}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(answer["status"])
            if answer["type"]:
                self.send_header("Content-Type", answer["type"])
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}", answer=answer)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize("status, content_type, body, unread", [
    (200, "text/html", b"<html><body>Thanks, we got it!</body></html>", "is not a JSON object"),
    (201, "application/json", b"[]", "is not a JSON object"),
    (200, None, b"", "is not a JSON object"),
    (200, "application/json", b'{"status": "ok"}', "has no '{id}'"),
], ids=["html", "a-json-array", "empty", "no-id"])
async def test_an_unreadable_2xx_to_an_effect_is_in_doubt(odd_provider, status, content_type, body, unread):
    """The 2xx says the provider applied the request: an answer the client cannot read is a transient
    error in doubt (a retry with the same key gets the stored answer), never "nothing was sent"."""
    odd_provider.answer.update(status=status, type=content_type, body=body)
    async with ProviderClient(odd_provider.url) as client:
        calls = {"message_id": lambda: client.send_email(idempotency_key="k-email", run_id="r-1", to=EMAIL,
                                                         subject="s", body="b"),
                 "ticket_id": lambda: client.create_ticket(idempotency_key="k-ticket", run_id="r-1", summary="s",
                                                           email_message_id="msg_1")}
        for id_field, call in calls.items():
            with pytest.raises(TransientError) as raised:
                await call()
            error = raised.value
            assert error.in_doubt, error.message
            assert f"the provider answered {status}, so it applied the request, but its answer " \
                   f"{unread.format(id=id_field)}" in error.message, error.message
            assert "Retrying with the same Idempotency-Key gets its stored answer back" in error.message
