"""Payload encryption (flowclient/codec.py): unit checks of the codec, then the
real thing: a run on the dev server with workers, starter and run-record
compare all on the codec, and the history read raw, without it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("cryptography", reason="the crypto extra: pip install -e '.[dev]'")

import temporalio.converter
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import History

from flowclient.codec import (
    ENCODING,
    KEY_ID_METADATA,
    AesGcmCodec,
    CodecConfigError,
    DecryptionError,
    UnknownKeyError,
    codec_from_env,
    data_converter_from_env,
)
from flowclient.connect import connect
from lab.processes import REPO
from starter import start_run
from tests.test_flow import wait_closed

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
    with pytest.raises(UnknownKeyError, match=r"key id 'k2'.*LAB_CODEC_OLD_KEYS"):
        await old.decode([sealed_by_new])


async def test_unencrypted_payloads_pass_through_on_decode():
    codec = codec_from_env({"LAB_CODEC_KEY": KEY_A})
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b"1")
    assert await codec.decode([plain]) == [plain]


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
    from flowclient.status import run_status
    with pytest.raises(UnknownKeyError, match="lab-test"):
        await run_status(await connect({"TEMPORAL_ADDRESS": dev_server.address,
                                        "LAB_CODEC_KEY": KEY_B, "LAB_CODEC_KEY_ID": "other"}), run_id)

    # starter.py with the key in its environment shows the values decoded.
    shown = _cli(dev_server, codec_env, "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["steps"][1]["result"]["to"] == EMAIL

    # So does the run-record comparison, which connects through flowclient.connect.
    record_db = tmp_path / "runrecord.db"
    rec_env = {**codec_env, "RUNRECORD_DB": str(record_db), "PROVIDER_URL": provider.url}
    rec_id = f"rec-{run_id}"[:64]
    ran = _cli(dev_server, rec_env, "start", rec_id, TASK, "--email", EMAIL, module="runrecord")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    compared = _cli(dev_server, rec_env, "compare", rec_id, "--temporal", run_id, "--json", module="runrecord")
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
