"""Payload encryption (durable_agents/payloadcodec/__init__.py): unit checks of the codec, then the
real thing: a run on the dev server with workers, starter and run-record
compare all on the codec, and the history read raw, without it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

pytest.importorskip("cryptography", reason="the crypto extra: pip install -e '.[dev]'")

import temporalio.converter
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import History
from temporalio.converter import ActivitySerializationContext, WorkflowSerializationContext

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import run_status
from durable_agents.payloadcodec import (
    ENCODING,
    KEY_ID_METADATA,
    WORKFLOW_ID_METADATA,
    AesGcmCodec,
    CodecConfigError,
    DecryptionError,
    PayloadBindingError,
    PlaintextPayloadError,
    UnknownKeyError,
    codec_from_env,
    data_converter_from_env,
    describe,
)
from durable_agents.steps.startedline import started_in
from lab.processes import REPO
from tests.support import first_workflow_task_failure, payloads_in, poll_until, wait_closed

KEY_A = base64.b64encode(bytes(range(32))).decode()
KEY_B = base64.b64encode(bytes(range(100, 132))).decode()
EMAIL = "grace.hopper.codec@example.com"
# Secrets the raw-history check looks for must not occur there by chance: a bare
# number like "7719" turned up inside a hex request id (a CI failure), so the
# order reference and the name contain letters outside 0-9a-f.
TASK = "Confirm the refund for order QZ-7719 to Grace Hopper"


async def test_round_trip_hides_the_plaintext_and_names_the_key():
    codec = codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "2026-11"})
    plain = temporalio.converter.default().payload_converter.to_payloads([{"to": EMAIL}])
    [sealed] = await codec.encode(plain)
    assert sealed.metadata["encoding"] == ENCODING
    assert sealed.metadata[KEY_ID_METADATA] == b"2026-11"
    assert EMAIL.encode() not in sealed.SerializeToString()
    assert b"json/plain" not in sealed.SerializeToString()  # the inner metadata is sealed too
    assert await codec.decode([sealed]) == plain
    # Same plaintext, fresh nonce: ciphertexts differ.
    [again] = await codec.encode(plain)
    assert again.data != sealed.data


async def test_rotation_old_keys_decrypt_new_key_encrypts():
    old = codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1"})
    [sealed_by_old] = await old.encode([Payload(metadata={"encoding": b"json/plain"}, data=b'"x"')])
    rotated = codec_from_env({"LAB_CODEC_KEY": KEY_B, "LAB_CODEC_KEY_ID": "k2", "LAB_CODEC_OLD_KEYS": f"k1:{KEY_A}"})
    assert (await rotated.decode([sealed_by_old]))[0].data == b'"x"'
    [sealed_by_new] = await rotated.encode([Payload(data=b"y")])
    assert sealed_by_new.metadata[KEY_ID_METADATA] == b"k2"
    # A process that never got k2 says which key it lacks, and how to add it.
    with pytest.raises(UnknownKeyError, match=r"key id 'k2'.*LAB_CODEC_DECRYPT_ONLY_KEYS as k2:"):
        await old.decode([sealed_by_new])


async def test_a_staged_key_decrypts_but_never_encrypts():
    """Step 1 of a rolling rotation: the next key is held decrypt-only, so this
    process reads what already-switched processes write while still writing k1."""
    staged = codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1",
                             "LAB_CODEC_DECRYPT_ONLY_KEYS": f"k2:{KEY_B}"})
    switched = codec_from_env({"LAB_CODEC_KEY": KEY_B, "LAB_CODEC_KEY_ID": "k2",
                               "LAB_CODEC_DECRYPT_ONLY_KEYS": f"k1:{KEY_A},k2:{KEY_B}"})
    assert staged.key_ids == ["k1", "k2"] and staged.decrypt_only_ids == ["k2"]
    assert switched.decrypt_only_ids == ["k1"]  # naming the current key there too is allowed
    [by_staged] = await staged.encode([Payload(data=b"from k1")])
    [by_switched] = await switched.encode([Payload(data=b"from k2")])
    assert by_staged.metadata[KEY_ID_METADATA] == b"k1"  # staged: never encrypts with k2
    assert (await staged.decode([by_switched]))[0].data == b"from k2"
    assert (await switched.decode([by_staged]))[0].data == b"from k1"
    assert "decrypt only: k2" in describe(staged)


async def test_unencrypted_payloads_are_refused_unless_allowed():
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b"1")
    codec = codec_from_env({"LAB_CODEC_KEY": KEY_A})
    with pytest.raises(PlaintextPayloadError, match=r"encoding 'json/plain'.*LAB_CODEC_ALLOW_PLAINTEXT=1"):
        await codec.decode([plain])
    allowing = codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_ALLOW_PLAINTEXT": "1"})
    assert await allowing.decode([plain]) == [plain]
    # What is written is encrypted either way.
    [sealed] = await allowing.encode([plain])
    assert sealed.metadata["encoding"] == ENCODING


def _ctx(workflow_id: str) -> WorkflowSerializationContext:
    return WorkflowSerializationContext(namespace="default", workflow_id=workflow_id)


async def test_payloads_are_bound_to_their_workflow_id():
    converter = data_converter_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1"})
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"the task"')
    # The SDK hands the codec the run's context; an activity's context names the same workflow.
    codec_a = converter.with_context(_ctx("run-a")).payload_codec
    [sealed] = await codec_a.encode([plain])
    assert sealed.metadata[WORKFLOW_ID_METADATA] == b"run-a"
    activity = ActivitySerializationContext(
        namespace="default", activity_id="1", activity_type="draft", activity_task_queue="q",
        workflow_id="run-a", workflow_type="AgentFlow", is_local=False)
    assert await converter.with_context(activity).payload_codec.decode([sealed]) == [plain]
    # Read for another run: refused, naming both ids.
    codec_b = converter.with_context(_ctx("run-b")).payload_codec
    with pytest.raises(PayloadBindingError, match=r"bound to workflow id 'run-a'.*'run-b'"):
        await codec_b.decode([sealed])
    # Relabelled to pass the check: the id is associated data, so GCM refuses it.
    relabelled = Payload(metadata={**sealed.metadata, WORKFLOW_ID_METADATA: b"run-b"}, data=sealed.data)
    with pytest.raises(DecryptionError, match="workflow id it is bound to"):
        await codec_b.decode([relabelled])
    # Stripped of the id, to pass as the older unbound format: refused too.
    stripped = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k1"}, data=sealed.data)
    with pytest.raises(DecryptionError):
        await codec_b.decode([stripped])
    # A reader that does not know the run (the codec server) still decrypts it,
    # authenticated against the id it carries.
    assert await converter.payload_codec.decode([sealed]) == [plain]


async def test_binding_can_be_held_back_while_old_code_is_replaced():
    """LAB_CODEC_BIND_PAYLOADS=0 writes what the code before binding reads: AES-GCM
    with the key id alone as associated data (that code's decrypt, verbatim)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    rolling = codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1", "LAB_CODEC_BIND_PAYLOADS": "0"})
    assert "unbound (LAB_CODEC_BIND_PAYLOADS=0)" in describe(rolling)
    in_run = rolling.with_context(_ctx("run-a"))
    [written] = await in_run.encode([Payload(data=b"for an old worker")])
    assert WORKFLOW_ID_METADATA not in written.metadata
    opened = AESGCM(base64.b64decode(KEY_A)).decrypt(written.data[:12], written.data[12:], b"k1")
    assert Payload.FromString(opened).data == b"for an old worker"
    # Bound payloads from processes already binding are still read and checked.
    [bound] = await codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1"}).with_context(
        _ctx("run-a")).encode([Payload(data=b"bound")])
    assert (await in_run.decode([bound]))[0].data == b"bound"
    with pytest.raises(PayloadBindingError):
        await rolling.with_context(_ctx("run-b")).decode([bound])


async def test_unbound_payloads_as_written_before_still_decrypt_in_any_context():
    """The encrypted replay fixtures hold this format (key id as the only associated data)."""
    codec = codec_from_env({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1"})
    [unbound] = await codec.encode([Payload(data=b"old")])  # no context: no workflow to bind to
    assert WORKFLOW_ID_METADATA not in unbound.metadata
    assert (await codec.with_context(_ctx("any-run")).decode([unbound]))[0].data == b"old"
    # A payload recorded by the previous codec, as stored in a committed fixture.
    from tests.record_histories import FIXTURE_KEY, FIXTURE_KEY_ID
    fixture = json.loads((REPO / "tests/data/histories/6ad4721c745f/completed-encrypted.json").read_text())
    started = fixture["events"][0]["workflowExecutionStartedEventAttributes"]["input"]["payloads"][0]
    payload = Payload(metadata={k: base64.b64decode(v) for k, v in started["metadata"].items()},
                      data=base64.b64decode(started["data"]))
    assert WORKFLOW_ID_METADATA not in payload.metadata
    old_reader = codec_from_env({"LAB_CODEC_KEY": FIXTURE_KEY, "LAB_CODEC_KEY_ID": FIXTURE_KEY_ID})
    [opened] = await old_reader.with_context(_ctx("completed-encrypted")).decode([payload])
    assert b"Confirm the refund for order 1234" in opened.data


async def test_wrong_material_for_a_known_id_and_tampering_are_refused():
    a = AesGcmCodec("k1", base64.b64decode(KEY_A))
    b = AesGcmCodec("k1", base64.b64decode(KEY_B))
    [sealed] = await a.encode([Payload(data=b"secret")])
    with pytest.raises(DecryptionError, match="k1"):
        await b.decode([sealed])
    # Relabelling the key id is caught: the id is the GCM associated data.
    c = AesGcmCodec("k2", base64.b64decode(KEY_A))
    relabelled = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k2"}, data=sealed.data)
    with pytest.raises(DecryptionError):
        await c.decode([relabelled])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LAB_CODEC_KEY": "not base64 !!"}, "not valid base64"),
        ({"LAB_CODEC_KEY": base64.b64encode(b"short").decode()}, "decodes to 5 bytes"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "bad id"}, "LAB_CODEC_KEY_ID"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_OLD_KEYS": "k0"}, "no ':'"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_OLD_KEYS": "k0:abc"}, "LAB_CODEC_OLD_KEYS entry 1"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "k1", "LAB_CODEC_OLD_KEYS": f"k1:{KEY_B}"}, "its own id"),
        ({"LAB_CODEC_OLD_KEYS": f"k1:{KEY_A}"}, "LAB_CODEC_KEY is not"),
        ({"LAB_CODEC_DECRYPT_ONLY_KEYS": f"k1:{KEY_A}"}, "LAB_CODEC_DECRYPT_ONLY_KEYS is set but LAB_CODEC_KEY"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_DECRYPT_ONLY_KEYS": "k2:abc"}, "LAB_CODEC_DECRYPT_ONLY_KEYS entry 1"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_DECRYPT_ONLY_KEYS": f"k2:{KEY_A}", "LAB_CODEC_OLD_KEYS": f"k2:{KEY_B}"},
         "in both LAB_CODEC_DECRYPT_ONLY_KEYS and LAB_CODEC_OLD_KEYS"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_ALLOW_PLAINTEXT": "maybe"}, "LAB_CODEC_ALLOW_PLAINTEXT='maybe'"),
        ({"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_BIND_PAYLOADS": "off please"}, "LAB_CODEC_BIND_PAYLOADS='off please'"),
    ],
)
def test_bad_configuration_is_refused_clearly_without_echoing_the_key(env, message):
    with pytest.raises(CodecConfigError, match=message) as err:
        codec_from_env(env)
    assert KEY_A not in str(err.value) and KEY_B not in str(err.value)


def test_off_by_default_and_empty_means_off():
    assert data_converter_from_env({}).payload_codec is None
    assert data_converter_from_env({"LAB_CODEC_KEY": "", "LAB_CODEC_KEY_ID": ""}).payload_codec is None


def test_worker_and_starter_refuse_a_bad_key_before_connecting(dev_server, tmp_path):
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "LAB_CODEC_KEY": "c2hvcnQ="}
    for argv in (["worker.py"], ["starter.py", "status", "any-run"]):
        done = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "LAB_CODEC_KEY decodes to 5 bytes" in done.stderr, done.stderr


def _cli(dev_server, codec_env, *argv, module=None):
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TEMPORAL_NAMESPACE": "default", **codec_env}
    cmd = [sys.executable, "-m", module, *argv] if module else [sys.executable, "starter.py", *argv]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


async def test_history_holds_no_personal_data_and_tools_still_read_it(
    dev_server, client, workers, provider, run_id, task_queue, tmp_path
):
    codec_env = {"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "lab-test"}
    worker = workers(extra_env=codec_env)
    assert "encrypted with key id 'lab-test'" in worker.output()
    sealed_client = await connect({"TEMPORAL_ADDRESS": dev_server.address, **codec_env})
    created, _ = await start_run(sealed_client, run_id, TASK, EMAIL, queue=task_queue)
    assert created

    status = await wait_closed(sealed_client, run_id)
    assert status["status"] == "completed", status
    assert status["steps"][1]["result"]["to"] == EMAIL

    # The history as the server stores it, read by a client without the codec.
    assert client.data_converter.payload_codec is None
    history = await client.get_workflow_handle(run_id).fetch_history()
    raw = History(events=list(history.events)).SerializeToString()
    for secret in (EMAIL, TASK, "Grace Hopper", "QZ-7719", KEY_A):
        assert secret.encode() not in raw, f"{secret!r} is in the stored history"
    assert raw.count(ENCODING) >= 4 and b"lab-test" in raw
    # Without the key nothing decodes: the status reader says which key it lacks.
    from durable_agents.flowclient.status import run_status
    with pytest.raises(UnknownKeyError, match="lab-test"):
        await run_status(await connect({"TEMPORAL_ADDRESS": dev_server.address,
                                        "LAB_CODEC_KEY": KEY_B, "LAB_CODEC_KEY_ID": "other"}), run_id)

    # starter.py with the key in its environment shows the values decoded.
    shown = _cli(dev_server, codec_env, "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["steps"][1]["result"]["to"] == EMAIL

    # So does the run-record comparison, which connects through durable_agents.flowclient.connect.
    record_db = tmp_path / "runrecord.db"
    rec_env = {**codec_env, "RUNRECORD_DB": str(record_db), "PROVIDER_URL": provider.url}
    rec_id = f"rec-{run_id}"[:64]
    ran = _cli(dev_server, rec_env, "start", rec_id, TASK, "--email", EMAIL, module="durable_agents.runrecord")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    compared = _cli(dev_server, rec_env, rec_id, "--temporal", run_id, "--json", module="lesson.compare")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert EMAIL in compared.stdout
    # The worker's own output carries neither the address nor the task.
    assert EMAIL not in worker.output() and TASK not in worker.output()


async def test_failure_messages_are_encrypted_too_and_status_decodes_them(
    dev_server, workers, provider, run_id, task_queue
):
    """A refused address is quoted in the error; with the codec on, not in clear."""
    codec_env = {"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "lab-test"}
    workers(extra_env=codec_env)
    sealed = await connect({"TEMPORAL_ADDRESS": dev_server.address, **codec_env})
    bounced = "grace.hopper@mailbox.invalid"
    await start_run(sealed, run_id, TASK, bounced, queue=task_queue)

    status = await wait_closed(sealed, run_id)
    assert status["status"] == "failed"
    assert bounced in status["error"] and "send_confirmation" in status["error"]
    plain = await connect({"TEMPORAL_ADDRESS": dev_server.address})
    history = await plain.get_workflow_handle(run_id).fetch_history()
    raw = History(events=list(history.events)).SerializeToString()
    assert bounced.encode() not in raw and b"grace.hopper" not in raw


# --- every payload bound to its run, in a real history ------------------------

def check_sealed_and_bound(events, workflow_id: str, key_id: str) -> int:
    """Every payload that went through a codec is encrypted under key_id and bound to workflow_id."""
    found = [(path, p) for n, ev in enumerate(events) for path, p in payloads_in(ev, f"event {n + 1}")]
    clear = [(path, p.metadata.get("encoding")) for path, p in found if p.metadata.get("encoding") != ENCODING]
    # Written by the SDK's core and the server without any codec: the patch
    # marker's data and the search attribute naming the patch (no personal data).
    assert all("marker_recorded" in path or "search_attributes" in path for path, _ in clear), clear
    sealed = [p for _, p in found if p.metadata.get("encoding") == ENCODING]
    assert {(p.metadata[KEY_ID_METADATA], p.metadata[WORKFLOW_ID_METADATA]) for p in sealed} == {
        (key_id.encode(), workflow_id.encode())
    }
    return len(sealed)


async def test_a_real_history_is_bound_to_its_run_for_workers_replay_and_status(
    dev_server, client, workers, provider, run_id, task_queue
):
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    from durable_agents.flowclient.status import activity_traces
    from durable_agents.flowclient.worker_options import worker_options
    from durable_agents.workflows.agent_flow import AgentFlow

    codec_env = {"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "lab-test"}
    workers(extra_env=codec_env)
    sealed_client = await connect({"TEMPORAL_ADDRESS": dev_server.address, **codec_env})
    await start_run(sealed_client, run_id, TASK, EMAIL, queue=task_queue)
    assert (await wait_closed(sealed_client, run_id))["status"] == "completed"

    history = await client.get_workflow_handle(run_id).fetch_history()
    # Input, 3 activity inputs and results, the result: at least 8, all bound.
    assert check_sealed_and_bound(history.events, run_id, "lab-test") >= 8

    # Replay decodes in the run's context, as a worker does...
    replayer = Replayer(workflows=[AgentFlow], workflow_runner=worker_options()["workflow_runner"],
                        data_converter=data_converter_from_env(codec_env))
    await replayer.replay_workflow(history)
    # ...so the same events presented as another workflow's are refused.
    moved = WorkflowHistory(f"other-{run_id}", list(history.events))
    replayed = await replayer.replay_workflow(moved, raise_on_replay_failure=False)
    # (The message is encrypted with the failure; its type name is not.)
    assert "PayloadBindingError" in str(replayed.replay_failure), replayed.replay_failure
    # The status reader decodes in the run's context too.
    assert (await activity_traces(sealed_client, history))
    with pytest.raises(PayloadBindingError, match=f"bound to workflow id {run_id!r}"):
        await activity_traces(sealed_client, moved)


async def test_a_payload_copied_from_another_run_is_refused_by_the_worker(
    dev_server, client, workers, provider, run_id, task_queue
):
    """Someone with write access to the server (not the key) starts a run with
    another run's sealed input: the worker refuses it instead of acting on it."""
    from temporalio.common import RawValue

    from durable_agents.workflows.agent_flow import WORKFLOW_NAME

    codec_env = {"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "lab-test"}
    worker = workers(extra_env=codec_env)
    sealed_client = await connect({"TEMPORAL_ADDRESS": dev_server.address, **codec_env})
    await start_run(sealed_client, run_id, TASK, EMAIL, queue=task_queue)
    assert (await wait_closed(sealed_client, run_id))["status"] == "completed"
    history = await client.get_workflow_handle(run_id).fetch_history()
    [stolen] = history.events[0].workflow_execution_started_event_attributes.input.payloads

    copy_id = f"copy-{run_id}"[:64]
    # The session client has no codec: the payload is stored exactly as it was.
    handle = await client.start_workflow(WORKFLOW_NAME, RawValue(stolen), id=copy_id, task_queue=task_queue,
                                         task_timeout=timedelta(seconds=2))
    try:
        message = await first_workflow_task_failure(client, sealed_client, copy_id)
        assert f"bound to workflow id {run_id!r} but was read for workflow id {copy_id!r}" in message, message
        assert not [s for s in started_in(worker.output()) if s.run_id == copy_id], worker.output()
    finally:
        await handle.terminate("test: a copied payload")


async def test_plaintext_input_is_refused_until_the_switch_allows_it(
    dev_server, client, workers, provider, run_id, task_queue
):
    """A run started without the codec (before encryption was on, or by someone
    without the key) is refused by a worker with the codec; the operator's
    switch makes it readable, and it completes."""
    from durable_agents.workflows.agent_flow import WORKFLOW_NAME, FlowInput

    codec_env = {"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "lab-test"}
    strict = workers(extra_env=codec_env)
    sealed_client = await connect({"TEMPORAL_ADDRESS": dev_server.address, **codec_env})
    # The session client has no codec: this input is stored in clear.
    await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=run_id, task=TASK, email=EMAIL),
                                id=run_id, task_queue=task_queue, task_timeout=timedelta(seconds=2))
    message = await first_workflow_task_failure(client, sealed_client, run_id)
    assert "payload is not encrypted" in message and "LAB_CODEC_ALLOW_PLAINTEXT=1" in message, message
    strict.kill()

    workers(extra_env={**codec_env, "LAB_CODEC_ALLOW_PLAINTEXT": "1"})

    # Parked until then: the failing workflow task is retried (with a growing backoff) and now succeeds.
    async def completed():
        status = await run_status(sealed_client, run_id)
        return status if status["status"] == "completed" else None

    status = await poll_until(completed, timeout=90, interval=0.5, what="the parked run to complete")
    assert status["steps"][1]["result"]["to"] == EMAIL


async def test_memo_queries_results_and_failures_pass_the_codec_with_plaintext_refused(
    dev_server, client, workers, provider, run_id, task_queue
):
    """Everything legitimate a run carries is encrypted by the codec, so the
    default refusal of plaintext breaks none of it."""
    from durable_agents.workflows.agent_flow import WORKFLOW_NAME, FlowInput

    codec_env = {"LAB_CODEC_KEY": KEY_A, "LAB_CODEC_KEY_ID": "lab-test"}
    workers(extra_env={**codec_env, "LAB_STEP_SECONDS": "0.3"})
    sealed_client = await connect({"TEMPORAL_ADDRESS": dev_server.address, **codec_env})
    assert sealed_client.data_converter.payload_codec.allow_plaintext is False
    handle = await sealed_client.start_workflow(
        WORKFLOW_NAME, FlowInput(run_id=run_id, task=TASK, email=EMAIL), id=run_id, task_queue=task_queue,
        task_timeout=timedelta(seconds=2), memo={"customer": "Grace Hopper"})

    async def running_step():
        progress = await handle.query("progress")
        return progress if progress["current_step"] == "send_confirmation" else None

    progress = await poll_until(running_step, timeout=60, what="the progress query to show step 2")
    assert progress["steps"][0]["status"] == "completed"
    await handle.result()
    assert await (await handle.describe()).memo() == {"customer": "Grace Hopper"}
    history = await client.get_workflow_handle(run_id).fetch_history()
    raw = History(events=list(history.events)).SerializeToString()
    assert b"Grace Hopper" not in raw
    check_sealed_and_bound(history.events, run_id, "lab-test")  # the memo among them
