"""Input safety, end to end, where tests/test_flow.py and tests/test_provider.py
leave gaps: header injection through the model's subject, the conversation id
and the 255-character address at the starter, over-long input at the workflow
boundary, loopback-only listeners, and secrets kept out of history and logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from temporalio.api.history.v1 import History

from durable_agents.flowclient.runs import start_run
from durable_agents.providerclient import fetch_effects
from durable_agents.steps.limits import MAX_EMAIL_CHARS, MAX_TASK_CHARS, check_email
from durable_agents.workflows.agent_flow import WORKFLOW_NAME, FlowInput
from lab.processes import REPO, DevServer
from tests.fake_openai_server import FakeOpenAIServer, completion
from tests.support import EMAIL, TASK, is_loopback, listening_addresses, wait_closed


def _starter(dev_server, *args):
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": "unused"}
    return subprocess.run([sys.executable, "starter.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_starter_refuses_bad_conversation_ids_and_a_255_character_address(dev_server):
    at_limit = "a" * (MAX_EMAIL_CHARS - len("@example.com")) + "@example.com"
    assert len(at_limit) == MAX_EMAIL_CHARS == 254 and check_email(at_limit) == at_limit
    too_long = "a" + at_limit
    cases = [
        (["--email", too_long], "email address is 255 characters; the limit is 254"),
        (["--email", EMAIL, "--conversation", "c" * 129], "conversation id is 129 characters"),
        (["--email", EMAIL, "--conversation", "conv 1"], "conversation id 'conv 1' may hold only"),
        (["--email", EMAIL, "--conversation", "c1\r\nX-Injected: 1"], "single line"),
    ]
    for extra, expected in cases:
        done = _starter(dev_server, "start", "safety-run", TASK, *extra)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert expected in done.stderr, (extra, done.stderr)
    # Nothing was started by any of them.
    shown = _starter(dev_server, "status", "safety-run")
    assert shown.returncode == 2 and "no run with id" in shown.stderr


@pytest.mark.parametrize(
    ("inp", "expected"),
    [
        (dict(task="x" * (MAX_TASK_CHARS + 1), email=EMAIL), "task is 4001 characters; the limit is 4000"),
        (dict(task=TASK, email="a" * 243 + "@example.com"), "email address is 255 characters"),
        (dict(task=TASK, email="ada@example.com\r\nBcc: eve@example.com"), "single line"),
        (dict(task=TASK, email=EMAIL, conversation_id="c" * 129), "conversation id is 129 characters"),
    ],
    ids=["task-4001", "email-255", "email-crlf", "conversation-129"],
)
async def test_workflow_boundary_refuses_input_that_bypassed_the_starter(
    client, workers, provider, run_id, task_queue, inp, expected
):
    workers()
    await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=run_id, **inp), id=run_id, task_queue=task_queue)
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed", status
    assert status["error"].startswith("input refused:") and expected in status["error"], status["error"]
    assert [s["status"] for s in status["steps"]] == ["pending"] * 3
    assert fetch_effects(provider.url, run_id=run_id) == []


async def test_a_subject_with_crlf_from_the_model_never_reaches_an_email(client, workers, provider, run_id, task_queue):
    injected = json.dumps({
        "subject": "Your refund\r\nBcc: eve@example.com",
        "body": "Hello, your refund is confirmed.",
        "summary": "refund confirmed",
    })
    with FakeOpenAIServer() as model:
        # The client asks again once after output that breaks the rules, then gives up.
        model.push(completion(injected), completion(injected), completion(injected), completion(injected))
        worker = workers(extra_env={"LLM_BASE_URL": model.base_url, "LLM_MODEL": "fake-model",
                                    "LLM_API_KEY": "test-key"})
        created, _ = await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
        assert created
        status = await wait_closed(client, run_id)
    assert status["status"] == "failed", status
    assert status["current_step"] == "draft"
    assert [s["status"] for s in status["steps"]] == ["failed", "pending", "pending"]
    assert "single line" in status["error"], status["error"]
    assert fetch_effects(provider.url, run_id=run_id) == []
    assert "step send_confirmation started" not in worker.output()


# --- listening sockets -------------------------------------------------------

def test_the_provider_and_the_demos_dev_server_listen_on_loopback_only(provider):
    seen = listening_addresses(provider.proc.pid)
    assert seen, "found no listening socket of the provider"
    assert all(is_loopback(a) for a, _ in seen), seen
    # The dev server as the demo starts it: with the UI.
    server = DevServer(headless=False).start()
    try:
        seen = listening_addresses(server.proc.pid)
        ports = {p for _, p in seen}
        assert server.port in ports and server.port + 1000 in ports, seen
        assert all(is_loopback(a) for a, _ in seen), seen
    finally:
        server.stop()


# --- secrets -----------------------------------------------------------------

LLM_SECRET = "sk-lab-SECRET-0f1e2d3c4b5a"
TEMPORAL_SECRET = "tmprl-SECRET-api-key-9a8b7c"


async def test_secrets_stay_out_of_history_and_logs(dev_server, client, workers, provider, run_id, task_queue):
    import base64

    codec_key = base64.b64encode(b"K" * 32).decode()
    env = {
        # Offline model (LLM_BASE_URL unset) with a key set: it must go nowhere.
        "LLM_API_KEY": LLM_SECRET,
        "LLM_BASE_URL": "",
        # Sent to the dev server as authorization metadata; TLS off so the dev server accepts it.
        "TEMPORAL_API_KEY": TEMPORAL_SECRET,
        "TEMPORAL_TLS": "false",
        "LAB_CODEC_KEY": codec_key,
        "LAB_CODEC_KEY_ID": "safety",
    }
    worker = workers(extra_env=env, args=["--verbose"])
    done = subprocess.run(
        [sys.executable, "starter.py", "--verbose", "start", run_id, TASK, "--email", EMAIL, "--wait"],
        cwd=REPO, env={**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue, **env},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run {run_id}: completed" in done.stdout, done.stdout
    # Read raw, by the session client, which has no codec: what the server stores.
    raw = History(events=list((await client.get_workflow_handle(run_id).fetch_history()).events)).SerializeToString()
    outputs = {"worker": worker.output(), "starter": done.stdout + done.stderr}
    assert "step draft completed" in outputs["worker"]
    for secret in (LLM_SECRET, TEMPORAL_SECRET, codec_key):
        assert secret.encode() not in raw, f"{secret} is in the history"
        for name, text in outputs.items():
            assert secret not in text, f"{secret} is in the {name}'s output"
