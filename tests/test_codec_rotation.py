"""Key rotation during a rolling restart, with real processes (docs/deploy.md,
"Rotating the key without stopping").

One run crosses the whole roll: a starter already switched to the new key
starts it; a worker that was never given the new key fails on it (the order
the docs used to give); a worker with the new key staged decrypt-only runs it
until it is SIGKILLed before step 3, having written its results under the old
key; a switched worker finishes it. Every effect is applied once."""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("cryptography", reason="the crypto extra: pip install -e '.[dev]'")

from temporalio.api.history.v1 import History

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.runs import start_run
from durable_agents.payloadcodec import ENCODING, KEY_ID_METADATA
from durable_agents.providerclient import fetch_effects
from tests.support import executions, first_workflow_task_failure, payloads_in, poll_until, wait_closed

OLD = base64.b64encode(bytes(range(32, 64))).decode()
NEW = base64.b64encode(bytes(range(64, 96))).decode()
TASK = "Confirm the refund for order RX-4410"
EMAIL = "rotation@example.com"

NEVER_GOT_NEW = {"LAB_CODEC_KEY": OLD, "LAB_CODEC_KEY_ID": "2026-11"}
STAGED = {**NEVER_GOT_NEW, "LAB_CODEC_DECRYPT_ONLY_KEYS": f"2027-01:{NEW}"}
SWITCHED = {"LAB_CODEC_KEY": NEW, "LAB_CODEC_KEY_ID": "2027-01",
            "LAB_CODEC_DECRYPT_ONLY_KEYS": f"2026-11:{OLD},2027-01:{NEW}"}


async def test_a_run_survives_a_rolling_key_switch_when_the_new_key_was_staged(
    dev_server, client, workers, provider, run_id, task_queue
):
    switched_client = await connect({"TEMPORAL_ADDRESS": dev_server.address, **SWITCHED})
    old_reader = await connect({"TEMPORAL_ADDRESS": dev_server.address, **NEVER_GOT_NEW})
    await start_run(switched_client, run_id, TASK, EMAIL, queue=task_queue)

    # The unsafe order: a worker still on the old key alone cannot read the input.
    unstaged = workers(extra_env=NEVER_GOT_NEW)
    message = await first_workflow_task_failure(client, old_reader, run_id)
    assert "key id '2027-01', which this process does not hold" in message, message
    unstaged.kill()

    # The safe order, mid-roll: staged (writes the old key, reads both) ...
    staged = workers(extra_env={**STAGED, "CRASH_AT": "record_outcome:before"})
    await poll_until(lambda: not staged.alive(), timeout=60, what="the staged worker to die before step 3")
    assert "step send_confirmation completed" in staged.output(), staged.output()[-3000:]
    # ... then switched (writes the new key, reads both) finishes the run.
    switched = workers(extra_env=SWITCHED)
    status = await wait_closed(switched_client, run_id)
    assert status["status"] == "completed", status
    assert "step record_outcome completed" in switched.output()
    assert executions(switched, "draft") == 0  # steps 1-2 were read, not redone

    # Both keys wrote this run's history, and no effect was doubled.
    history = await client.get_workflow_handle(run_id).fetch_history()
    key_ids = {p.metadata[KEY_ID_METADATA] for _, p in payloads_in(History(events=list(history.events)))
               if p.metadata.get("encoding") == ENCODING}
    assert key_ids == {b"2026-11", b"2027-01"}, key_ids
    effects = fetch_effects(provider.url, run_id=run_id)
    assert sorted(e.kind for e in effects) == ["email", "ticket"], effects
    assert all(e.effects_applied == 1 for e in effects), effects
