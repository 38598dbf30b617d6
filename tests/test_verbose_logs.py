"""``worker.py --verbose`` keeps payloads out of its output: the task, the
conversation memory sent to the model and the model's reply never appear,
while the SDK's debug lines and one line per HTTP request still do; nor does
the address a failed step's error quotes (durable_agents/flowclient/logs.py).

A real worker process uses the real ``openai`` client against the scripted
OpenAI-compatible server (tests/fake_openai_server.py); two runs share a
conversation, so the second request carries the first run as memory context."""

from __future__ import annotations

import json

from durable_agents.flowclient.runs import start_run
from tests.fake_openai_server import FakeOpenAIServer, completion
from tests.support import wait_closed

EMAIL = "hedy.verbose@example.com"
# Markers with letters outside 0-9a-f, so no id or hash can hold them by chance.
FIRST_TASK = "Refund order VQ-3301 for Hedy Lamarr"
SECOND_TASK = "Also refund order VQ-3302, same customer"
FIRST_REPLY = {"subject": "Your refund VQ-3301", "body": "Dear Hedy, the refund RZ-KWX-BODY is on its way.",
               "summary": "Confirms refund RZ-KWX-SUMMARY."}
SECOND_REPLY = {"subject": "Your refund VQ-3302", "body": "Dear Hedy, the second refund RZ-PLM-BODY is done.",
                "summary": "Confirms refund RZ-PLM-SUMMARY."}


async def test_verbose_worker_output_holds_no_task_memory_or_reply(client, workers, provider, run_id, task_queue):
    conversation = f"conv-{run_id}"
    with FakeOpenAIServer() as model:
        model.push(completion(json.dumps(FIRST_REPLY)), completion(json.dumps(SECOND_REPLY)))
        worker = workers(args=["--verbose"], extra_env={
            "LLM_BASE_URL": model.base_url, "LLM_MODEL": "fake-model", "LLM_API_KEY": "test-key"})
        for n, task in enumerate((FIRST_TASK, SECOND_TASK), 1):
            await start_run(client, f"{run_id}-{n}", task, EMAIL, conversation_id=conversation, queue=task_queue)
            status = await wait_closed(client, f"{run_id}-{n}")
            assert status["status"] == "completed", status
        requests = list(model.requests)

    # The second request really carried the memory context: the first run's task and reply.
    assert len(requests) == 2
    sent = json.dumps(requests[1].body)
    assert FIRST_TASK in sent and "RZ-KWX-BODY" in sent and SECOND_TASK in sent

    out = worker.output()
    assert len(worker.lines) < worker.lines.maxlen, "output was cut: this check would miss lines"
    # Still verbose: the SDK's debug lines, and a line per model request.
    assert " DEBUG temporalio" in out, out[-3000:]
    assert "HTTP Request: POST " in out and "/chat/completions" in out, out[-3000:]
    for secret in (FIRST_TASK, SECOND_TASK, "VQ-3301", "VQ-3302", "Hedy", "RZ-KWX", "RZ-PLM", EMAIL):
        assert secret not in out, f"{secret!r} is in the --verbose worker's output:\n" + "\n".join(
            line for line in out.splitlines() if secret in line)[:3000]


async def test_a_failed_steps_traceback_is_logged_without_its_message(client, workers, provider, run_id, task_queue):
    """The provider's refusal quotes the address; the SDK logs the attempt's
    traceback at WARNING, and the workflow's failure at DEBUG. The frames and
    types stay, the messages do not."""
    bounced = "hedy.bounce@mailbox.invalid"
    worker = workers(args=["--verbose"])
    await start_run(client, run_id, FIRST_TASK, bounced, queue=task_queue)
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed" and bounced in status["error"], status  # history keeps it
    out = worker.output()
    assert "WARNING temporalio.activity: Completing activity as failed" in out, out[-3000:]
    assert "durable_agents.steps.errors.PermanentError: (message not logged" in out and 'File "' in out, out[-3000:]
    assert "DEBUG temporalio.worker._workflow_instance: Workflow raised failure" in out, out[-3000:]
    assert bounced not in out and "hedy.bounce" not in out and "Hedy" not in out, "\n".join(
        line for line in out.splitlines() if "hedy" in line.lower())[:3000]
