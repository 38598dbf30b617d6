"""The comparison, on a real run of each engine: Temporal (dev server, worker
process) and the run record (runner processes, one SIGKILLed after the email
went out), with the provider's counts as the judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import read_history
from durable_agents.runrecord import RunRecord
from durable_agents.steps.keys import idempotency_key
from lab.processes import REPO
from lesson.compare import compare, render
from tests.support import (
    EMAIL,
    TASK,
    counts,
    finished,
    parse_page,
    wait_closed,
    wait_lease_expired,
)


async def test_compare_agrees_with_the_provider(client, dev_server, workers, provider, runrecord, db, run_id,
                                                task_queue, tmp_path):
    temporal_id, record_id = f"{run_id}-t", f"{run_id}-r"
    workers()
    created, _ = await start_run(client, temporal_id, TASK, EMAIL, queue=task_queue)
    assert created

    crashed = runrecord("start", record_id, TASK, "--email", EMAIL,
                        env={"CRASH_AT": "send_confirmation:after_effect", "RUNRECORD_LEASE_SECONDS": "0.5"})
    assert finished(crashed) == -9, crashed.output()
    await wait_lease_expired(db, record_id)
    resumed = runrecord("resume", record_id)
    assert finished(resumed) == 0, resumed.output()
    assert (await wait_closed(client, temporal_id))["status"] == "completed"

    with RunRecord(db) as record:
        report = await compare(record, record_id, client, temporal_id, provider.url)
    rec, tmp = report["record"], report["temporal"]
    assert rec["status"] == tmp["status"] == "completed"
    # Both engines drove the same step functions: same draft.
    assert rec["steps"][0]["result"] == tmp["steps"][0]["result"]

    # Per step, each engine's attempts agree with the provider's request count for its key.
    for engine, rid in (("record", record_id), ("temporal", temporal_id)):
        side = report[engine]
        for step in side["steps"][1:]:
            requests, applied = counts(provider.url, rid, step["name"])
            assert step["attempts"] == requests and applied == 1, (engine, step, requests, applied)
            entry = report["provider"][engine][idempotency_key(rid, step["name"])]
            assert (entry["requests"], entry["effects_applied"]) == (requests, applied), entry
            assert entry["first_seen"] <= entry["last_seen"], entry  # ISO 8601 UTC: ordered as text
    assert all(c["ok"] for c in report["checks"]) and len(report["checks"]) == 8, report["checks"]
    assert rec["steps"][1]["attempts"] == 2 and tmp["steps"][1]["attempts"] == 1

    # The record: 1 run row, 3 step rows, one intent per effect attempt (2 + 1); one settled after doubt.
    assert rec["totals"]["rows"] == 1 + 3 + 3
    assert [i["state"] for i in rec["steps"][1]["intents"]] == ["settled", "answered"]
    assert rec["only_here"] == {"intents": 3, "in_doubt": 0, "settled_after_doubt": 1,
                                "lease": {"holder": None, "expires_at": None}}
    with RunRecord(db) as record:
        assert rec["totals"]["bytes"] == record.footprint(record_id)["bytes"] > 0

    # Temporal: totals are the history's own.
    _, history = await read_history(client, temporal_id)
    assert tmp["totals"]["events"] == len(history.events)
    assert tmp["totals"]["bytes"] >= sum(ev.ByteSize() for ev in history.events)
    assert tmp["only_here"]["workflow_task_events"] >= 3 * 4  # scheduled/started/completed per decision
    assert tmp["only_here"]["timer_events"] == 0
    assert tmp["only_here"]["worker_identities"]
    assert [s["events"] for s in tmp["steps"]] == [
        ["ActivityTaskScheduled", "ActivityTaskStarted", "ActivityTaskCompleted"]] * 3

    text = render(report)
    print(text)  # shown with -s: the table a person reads
    assert "only in Temporal's history" in text and "only in the run record" in text and "DIFF" not in text

    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "PROVIDER_URL": provider.url,
           "RUNRECORD_DB": str(db)}
    page = tmp_path / "compare.html"
    done = subprocess.run([sys.executable, "-m", "lesson.compare", record_id, "--temporal", temporal_id,
                           "--json", "--html", str(page)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["checks"] == report["checks"]
    assert f"the picture of it: {page}" in done.stderr

    # The same runs as one page: drawn from the records alone, so nothing in it is an observation.
    lanes = {lane.attrs["data-engine"]: lane for lane in parse_page(page.read_text()).all("section", cls="lane")}
    assert list(lanes) == ["runrecord", "temporal"]
    assert not [g for lane in lanes.values() for g in lane.all(cls="observed")]
    record_email = lanes["runrecord"].all("g", cls="span", data_row="send_confirmation")
    # The killed attempt (its intent settled by the next) and the one that answered.
    assert [sorted(g.classes) for g in record_email] == [["record", "span", "unrecorded"],
                                                         ["executed", "record", "span"]], record_email
    for lane in lanes.values():
        assert len(lane.all("li", cls="email")) == 1 and len(lane.all("li", cls="applied")) == 2, lane.text()
        assert [g.attrs["class"] for g in lane.all(cls="mark")] in ([], ["mark replay record"])
    missing = subprocess.run([sys.executable, "-m", "lesson.compare", record_id, "--temporal", "no-such-run"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no run with id 'no-such-run'" in missing.stderr
    # The command runrecord hands over to, called by its own name: an unknown record run, refused before
    # anything connects to Temporal.
    unknown = subprocess.run([sys.executable, "-m", "lesson.compare", "no-such-record", "--temporal", temporal_id],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "no run with id 'no-such-record'" in unknown.stderr, unknown.stderr
