"""The codec server (durable_agents/payloadcodec/server.py): the protocol over real HTTP
against the process, then the Temporal UI in a real browser (headless
Chromium) showing an encrypted run decrypted through it, and not without it.

The browser test needs Debian's ``chromium`` (``make test`` installs it);
without it the test fails and says how to get it: a skipped browser check
would pass a broken UI silently."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("cryptography", reason="the crypto extra: pip install -e '.[dev]'")

import temporalio.converter
from temporalio.api.common.v1 import Payload
from temporalio.converter import WorkflowSerializationContext

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.runs import start_run
from durable_agents.payloadcodec import ENCODING, WORKFLOW_ID_METADATA, codec_from_env
from lab.browser import NoChromium, chromium, dom, screenshot
from lab.processes import (
    LAB_SERVER_CONFIG,
    REPO,
    DevServer,
    Proc,
    free_port,
    start_codec_server,
    start_worker,
)
from tests.support import poll_until, wait_closed

pytestmark = pytest.mark.process

KEY = base64.b64encode(bytes(range(7, 39))).decode()
OTHER_KEY = base64.b64encode(bytes(range(50, 82))).decode()
ENV = {"LAB_CODEC_KEY": KEY, "LAB_CODEC_KEY_ID": "ui-key"}
UI_ORIGIN = "http://127.0.0.1:18233"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def as_json(payload: Payload) -> dict:
    return {"metadata": {k: b64(v) for k, v in payload.metadata.items()}, "data": b64(payload.data)}


def from_json(item: dict) -> Payload:
    return Payload(metadata={k: base64.b64decode(v) for k, v in item.get("metadata", {}).items()},
                   data=base64.b64decode(item.get("data", "")))


@pytest.fixture(scope="module")
def codec_server_proc():
    proc, url = start_codec_server(ENV, origins=[UI_ORIGIN])
    try:
        yield proc, url
    finally:
        proc.stop()


@pytest.fixture
def codec_server(codec_server_proc):
    return codec_server_proc[1]


def test_listens_on_loopback_only(codec_server_proc):
    from tests.support import is_loopback, listening_addresses

    seen = listening_addresses(codec_server_proc[0].pid)
    assert seen and all(is_loopback(address) for address, _ in seen), seen


def test_decode_and_encode_round_trip_over_http(codec_server):
    plain = temporalio.converter.default().payload_converter.to_payloads([{"task": "the task"}])[0]
    encoded = httpx.post(f"{codec_server}/encode", json={"payloads": [as_json(plain)]},
                         headers={"X-Namespace": "default"})
    assert encoded.status_code == 200, encoded.text
    [sealed] = [from_json(p) for p in encoded.json()["payloads"]]
    assert sealed.metadata["encoding"] == ENCODING and b"the task" not in sealed.data
    # The CLI's {namespace} template: only the last path segment counts.
    decoded = httpx.post(f"{codec_server}/default/decode", json={"payloads": [as_json(sealed)]})
    assert decoded.status_code == 200, decoded.text
    assert [from_json(p) for p in decoded.json()["payloads"]] == [plain]


async def test_decodes_payloads_bound_to_a_run_and_shows_plaintext_as_is(codec_server):
    """The UI sends no workflow id: bound payloads open against the id they carry."""
    codec = codec_from_env(ENV).with_context(WorkflowSerializationContext(namespace="default", workflow_id="run-7"))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"Ada Lovelace"')
    [bound] = await codec.encode([plain])
    assert bound.metadata[WORKFLOW_ID_METADATA] == b"run-7"
    marker = Payload(metadata={"encoding": b"json/plain"}, data=b'"memory-in-record-outcome"')
    answer = httpx.post(f"{codec_server}/decode", json={"payloads": [as_json(bound), as_json(marker)]})
    assert answer.status_code == 200, answer.text
    assert [from_json(p) for p in answer.json()["payloads"]] == [plain, marker]
    # An altered binding does not open.
    moved = Payload(metadata={**bound.metadata, WORKFLOW_ID_METADATA: b"run-8"}, data=bound.data)
    refused = httpx.post(f"{codec_server}/decode", json={"payloads": [as_json(moved)]})
    assert refused.status_code == 400 and "does not decrypt" in refused.json()["message"], refused.text


def test_cors_preflight_and_origins(codec_server):
    preflight = httpx.options(f"{codec_server}/decode", headers={
        "Origin": UI_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace"})
    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["access-control-allow-origin"] == UI_ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")}
    assert {"content-type", "x-namespace", "authorization"} <= allowed
    answer = httpx.post(f"{codec_server}/decode", json={"payloads": []}, headers={"Origin": UI_ORIGIN})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == UI_ORIGIN
    # Another site's page in the same browser gets no decryption.
    for send in (httpx.options, lambda url, **kw: httpx.post(url, json={"payloads": []}, **kw)):
        refused = send(f"{codec_server}/decode", headers={"Origin": "http://evil.example"})
        assert refused.status_code == 403, refused.text
        assert "access-control-allow-origin" not in refused.headers
        assert "--origin http://evil.example" in refused.json()["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "the body is not JSON"),
        (b'{"payload": []}', 400, 'no "payloads" list'),
        (b'{"payloads": [{"data": 5}]}', 400, "not protobuf JSON"),
        (b'{"payloads": [{"metadata": {"encoding": "YmluYXJ5L2VuY3J5cHRlZA==", '
         b'"encryption-key-id": "bm9wZQ=="}, "data": "AAAA"}]}', 400, "key id 'nope'"),
    ],
    ids=["not-json", "no-payloads", "not-protobuf-json", "unknown-key"],
)
def test_bad_input_gets_a_json_error_that_says_what_to_send(codec_server, body, status, words):
    answer = httpx.post(f"{codec_server}/decode", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert set(error) == {"error", "message"} and words in error["message"], error
    assert KEY not in answer.text
    if status == 400 and words != "key id 'nope'":
        assert '{"payloads": [...]}' in error["message"]


@pytest.mark.parametrize(
    "body",
    [b"[" * 5000 + b"]" * 5000, b'{"payloads": ' + b"[" * 5000 + b"]" * 5000 + b"}",
     b'{"payloads": [{"metadata": {"x": "]]]]\\"]"}, "data": "", "extra": ' + b"{" * 30 + b"}" * 30 + b"}]}"],
    ids=["bare", "in-payloads", "one-past-after-brackets-in-a-string"],
)
def test_json_nested_past_the_depth_limit_gets_a_400_naming_it(codec_server_proc, body):
    """Not a dropped connection and a traceback: Python's JSON parser recurses per level."""
    from durable_agents.payloadcodec.server import MAX_JSON_DEPTH

    answer = httpx.post(f"{codec_server_proc[1]}/decode", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["error"] == "too_deep" and f"more than {MAX_JSON_DEPTH} deep" in error["message"], error
    assert "Traceback" not in codec_server_proc[0].output()
    assert httpx.post(f"{codec_server_proc[1]}/decode", json={"payloads": []}).status_code == 200


def test_wrong_paths_and_methods(codec_server):
    assert httpx.post(f"{codec_server}/other", json={"payloads": []}).status_code == 404
    wrong = httpx.get(f"{codec_server}/decode")
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]


def _run_module(argv, env):
    return subprocess.run([sys.executable, "-m", "durable_agents.payloadcodec.server", *argv], cwd=REPO,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_refuses_to_start_without_keys_or_beyond_loopback():
    clean = {k: "" for k in ("LAB_CODEC_KEY", "LAB_CODEC_DECRYPT_ONLY_KEYS", "LAB_CODEC_OLD_KEYS")}
    done = _run_module(["--port", "0"], clean)
    assert done.returncode == 2 and "LAB_CODEC_KEY is not set" in done.stderr, done.stderr
    done = _run_module(["--port", "0"], {**clean, "LAB_CODEC_KEY": "c2hvcnQ="})
    assert done.returncode == 2 and "LAB_CODEC_KEY decodes to 5 bytes" in done.stderr, done.stderr
    done = _run_module(["--host", "0.0.0.0", "--port", "0"], {**ENV, "LAB_CODEC_SERVER_ALLOW_REMOTE": ""})
    assert done.returncode == 2, done.stderr
    assert "refusing to listen on '0.0.0.0'" in done.stderr and "LAB_CODEC_SERVER_ALLOW_REMOTE=1" in done.stderr
    done = _run_module(["--origin", "localhost:8233"], ENV)
    assert done.returncode == 2 and "scheme://host[:port]" in done.stderr, done.stderr
    assert KEY not in done.stderr + done.stdout


# --- the Temporal UI, in a real browser ------------------------------------------------------

class Browser:
    """Headless Chromium (``lab.browser``): a fresh profile per page load, every process reaped."""

    def __init__(self) -> None:
        try:
            chromium()
        except NoChromium as err:  # a skipped browser check would pass a broken UI silently
            pytest.fail(str(err))

    def dom(self, url: str) -> str:
        return dom(url)

    async def screenshot(self, url: str, name: str) -> None:
        """To look at the page yourself: LAB_UI_SCREENSHOTS=<directory> pytest ..."""
        folder = os.environ.get("LAB_UI_SCREENSHOTS")
        if folder:
            await asyncio.to_thread(screenshot, url, Path(folder) / name, 1400, 1100)

    async def dom_with(self, url: str, needle: str) -> str:
        """Load the page until its DOM holds ``needle`` (the UI renders asynchronously)."""
        async def check():
            dom = await asyncio.to_thread(self.dom, url)
            return dom if needle in dom else None

        return await poll_until(check, timeout=120, interval=0.5, what=f"{needle!r} in the DOM of {url}")


@pytest.mark.browser
async def test_the_ui_shows_encrypted_payloads_decrypted_through_the_codec_server(tmp_path, provider, task_queue,
                                                                                  run_id):
    browser = Browser()
    task = "Confirm the refund for order KV-5150 to Katherine Johnson"
    email = "katherine.ui@example.com"
    ui_port = free_port()
    origin = f"http://127.0.0.1:{ui_port}"
    procs: list[Proc] = []
    servers: list[DevServer] = []
    try:
        codec_proc, codec_url = start_codec_server(ENV, origins=[origin])
        procs.append(codec_proc)
        db = tmp_path / "temporal.db"
        server = DevServer(db_file=db, ui_port=ui_port, headless=False, dynamic_config=LAB_SERVER_CONFIG,
                           ui_codec_endpoint=codec_url)
        servers.append(server.start())
        procs.append(start_worker(server.address, provider.url, task_queue,
                                  {**ENV, "MEMORY_DB": str(tmp_path / "memory.db")}))
        sealed = await connect({"TEMPORAL_ADDRESS": server.address, **ENV})
        await start_run(sealed, run_id, task, email, queue=task_queue)
        assert (await wait_closed(sealed, run_id))["status"] == "completed"
        raw = await connect({"TEMPORAL_ADDRESS": server.address})
        history = await raw.get_workflow_handle(run_id).fetch_history()
        [stored_input] = history.events[0].workflow_execution_started_event_attributes.input.payloads
        ciphertext = b64(stored_input.data)[:48]
        page = f"{server.ui_url}/namespaces/default/workflows/{run_id}"

        # With the codec endpoint: the UI asks the codec server and shows the task and address.
        seen = await browser.dom_with(page, task)
        assert email in seen and ciphertext not in seen
        assert "decode" in codec_proc.output(), codec_proc.output()
        assert KEY not in codec_proc.output() and task not in codec_proc.output()  # names and counts only
        await browser.screenshot(page, "with-codec-server.png")

        # The same history, the same UI, no codec endpoint: ciphertext, and neither value.
        for proc in procs:
            proc.kill()
        server.stop()
        servers.clear()
        plain_ui = DevServer(db_file=db, ui_port=free_port(), headless=False, dynamic_config=LAB_SERVER_CONFIG)
        servers.append(plain_ui.start())
        page = f"{plain_ui.ui_url}/namespaces/default/workflows/{run_id}"
        seen = await browser.dom_with(page, ciphertext)
        assert task not in seen and email not in seen and "Katherine" not in seen
        await browser.screenshot(page, "without-codec-server.png")
    finally:
        for proc in procs:
            proc.kill()
        for server in servers:
            server.stop()


def test_the_temporal_cli_starts_and_reads_runs_through_it(dev_server, workers, provider, codec_server, task_queue,
                                                            run_id):
    """The other client of the protocol: input typed into the CLI is encrypted by
    /encode (unbound, so a worker that refuses plaintext accepts it), and the
    result is shown decrypted by /decode."""
    from lab.processes import temporal_cli

    workers(extra_env=ENV)
    task = "Confirm the refund typed into the CLI, order CL-2231"
    server = ["--address", dev_server.address]
    codec = ["--codec-endpoint", f"{codec_server}/{{namespace}}"]  # the CLI fills in the namespace

    def temporal(*argv: str) -> subprocess.CompletedProcess:
        done = subprocess.run([temporal_cli(), *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    flow_input = f'{{"run_id": "{run_id}", "task": "{task}", "email": "cli@example.com"}}'
    started = temporal("workflow", "execute", *server, *codec, "--type", "AgentFlow", "--task-queue", task_queue,
                       "--workflow-id", run_id, "--input", flow_input)
    assert "COMPLETED" in started.stdout and task in started.stdout, started.stdout
    shown = temporal("workflow", "show", *server, *codec, "--workflow-id", run_id, "--output", "json")
    plain = temporal("workflow", "show", *server, "--workflow-id", run_id, "--output", "json")
    # Decoded, the history's payloads are json/plain; stored, they are encrypted.
    assert b64(b"json/plain") in shown.stdout and b64(ENCODING) not in shown.stdout
    assert b64(ENCODING) in plain.stdout


def test_with_a_token_only_bearers_of_it_are_answered():
    token = "a-token-of-twenty-four-chars"
    proc, url = start_codec_server({**ENV, "LAB_CODEC_SERVER_TOKEN": token}, origins=[UI_ORIGIN])
    try:
        plain = temporalio.converter.default().payload_converter.to_payloads(["hello"])
        body = {"payloads": [as_json(p) for p in plain]}
        refused = httpx.post(f"{url}/encode", json=body)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        assert "LAB_CODEC_SERVER_TOKEN" in refused.json()["message"] and token not in refused.text
        wrong = httpx.post(f"{url}/encode", json=body, headers={"Authorization": "Bearer not-the-token-at-all"})
        assert wrong.status_code == 401
        sealed = httpx.post(f"{url}/encode", json=body, headers={"Authorization": f"Bearer {token}"})
        assert sealed.status_code == 200, sealed.text
        # A browser's preflight carries no credentials and is still answered.
        preflight = httpx.options(f"{url}/decode", headers={"Origin": UI_ORIGIN,
                                                            "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 204
    finally:
        proc.stop()
    assert token not in proc.output()


def test_a_short_token_is_refused_at_start():
    done = subprocess.run([sys.executable, "-m", "durable_agents.payloadcodec.server", "--port", "0"], cwd=REPO,
                          env={**os.environ, **ENV, "LAB_CODEC_SERVER_TOKEN": "short"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "too short" in done.stderr
