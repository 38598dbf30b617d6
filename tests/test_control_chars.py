"""Control characters (docs/commands.md, input limits): refused where they can do harm,
never printed raw.

One list of hostile strings goes through every path a user's text takes:
the starter, the run record's CLI, the workflow's input check, the provider
(its own check) and the model's output. Where the rule refuses a string, the
answer names the field, the character (``U+001B``) and its position; where it
accepts one (a zero-width joiner, a run of combining marks, newline and tab in
a task), the run completes and its status output holds no raw control byte.
And what was recorded before the rule, or comes back from the provider or
from Temporal's history, is shown escaped.

The checks here use their own definition of a raw control byte, not the
code's, so breaking ``durable_agents.steps.controls`` makes them fail.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from durable_agents.flowclient.status import TemporalRunNotFound, run_status
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.payloadcodec import data_converter_from_env
from durable_agents.providerclient import fetch_effects
from durable_agents.steps import flow
from durable_agents.steps.errors import PermanentError
from durable_agents.steps.models import DraftRequest, RecordRequest, SendRequest
from durable_agents.workflows.agent_flow import WORKFLOW_NAME, AgentFlow, FlowInput
from lab.processes import REPO
from lab.provider_process import ProviderProcess
from tests.fake_openai_server import FakeOpenAIServer, completion
from tests.support import EMAIL, TASK, wait_closed
from tests.tiers import starts

# What must never reach a terminal: C0 (newline aside), DEL, C1, bidi overrides and isolates.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@dataclass(frozen=True)
class Hostile:
    name: str
    text: str
    refused: str | None  # the character the rule names, e.g. "U+001B (ESC)"; None: accepted
    position: int | None = None  # counting from 1


HOSTILE = [
    Hostile("issue-example", "Refund \x1b[2J\x1b]0;owned\x07 order \x1b[31mRED\x1b[0m 42", "U+001B (ESC)", 8),
    Hostile("csi-clear-screen", "Refund \x1b[2J order 42", "U+001B (ESC)", 8),
    Hostile("osc-window-title", "Refund order 42\x1b]0;owned\x07", "U+001B (ESC)", 16),
    Hostile("bel", "Refund\x07 order 42", "U+0007 (BEL)", 7),
    Hostile("nul", "Refund order\x00 42", "U+0000 (NUL)", 13),
    Hostile("del", "Refund\x7f order 42", "U+007F (DEL)", 7),
    Hostile("c1-csi", "Refund \x9b2J order 42", "U+009B (CSI)", 8),
    Hostile("rlo", "Refund order \u202e24 redro", "U+202E (RIGHT-TO-LEFT OVERRIDE)", 14),
    Hostile("zero-width-joiner", "Refund order 42 for \U0001F469\u200d\U0001F4BB", None),
    Hostile("combining-4000", "\u0301" * 4000, None),
    Hostile("newline-and-tab", "Refund order 42\n\tand order 43", None),
]
REFUSED = [h for h in HOSTILE if h.refused]
ACCEPTED = [h for h in HOSTILE if not h.refused]
IDS = [h.name for h in HOSTILE]


def assert_no_raw(text: str, where: str) -> None:
    found = RAW.search(text)
    assert found is None, (f"{where} holds raw {found.group()!r} at {found.start()}: "
                           f"{text[max(0, found.start() - 60):found.start() + 60]!r}")


def offline_subject(task: str) -> str:
    """What the offline model writes as the subject (durable_agents/drafting/offline.py): tests must not trust the
    code's escaping."""
    one_line = " ".join(task.split())
    if len(one_line) <= 196:
        return "Re: " + one_line
    return "Re: " + one_line[:193] + "..."


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """A CLI as a user runs it; output kept as bytes, decoded strictly, so nothing is hidden."""
    done = subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          timeout=120)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode("utf-8"),
                                       done.stderr.decode("utf-8"))


def starter(dev_server, *args: str, queue: str = "unused") -> subprocess.CompletedProcess:
    return run_cli(["starter.py", *args], {"TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": queue})


def refusal(field: str, h: Hostile) -> str:
    return f"{field} holds {h.refused} at position {h.position}"


# -- the starter -------------------------------------------------------------------


async def test_the_starter_refuses_hostile_tasks_naming_the_character_and_starts_nothing(dev_server, client, capsys):
    import asyncio

    from durable_agents import starter as starter_module

    for h in REFUSED:
        run = f"ctl-start-{h.name}"
        if "\x00" in h.text:
            # No process can be given a NUL in an argument (execve refuses it): call the CLI's main
            # (in a thread: it runs its own event loop).
            code = await asyncio.to_thread(starter_module.main, ["start", run, h.text, "--email", EMAIL])
            err = capsys.readouterr().err
        else:
            done = starter(dev_server, "start", run, h.text, "--email", EMAIL, "--wait")
            code, err = done.returncode, done.stderr
            assert_no_raw(done.stdout + done.stderr, f"starter output for {h.name}")
        assert code == 2, (h.name, err)
        assert refusal("task", h) in err, (h.name, err)
        assert "Remove it and try again" in err, err
        with pytest.raises(TemporalRunNotFound):
            await run_status(client, run)


def test_the_starter_refuses_hostile_addresses_and_conversation_ids(dev_server):
    cases = [
        (["--email", "ada\t@example.com"], "email address holds U+0009 (TAB) at position 4"),
        (["--email", "ada@example.com\x1b[2J"], "email address holds U+001B (ESC) at position 16"),
        (["--email", EMAIL, "--conversation", "conv\u20661"],
         "conversation id holds U+2066 (LEFT-TO-RIGHT ISOLATE) at position 5"),
    ]
    for extra, expected in cases:
        done = starter(dev_server, "start", "ctl-start-fields", TASK, *extra)
        assert done.returncode == 2 and expected in done.stderr, (extra, done.stderr)
        assert_no_raw(done.stderr, "starter's refusal")


async def test_accepted_text_runs_and_the_starters_output_holds_no_raw_control_byte(
    dev_server, client, workers, provider, task_queue, run_id
):
    workers()
    for h in ACCEPTED:
        run = f"ctl-{h.name}-{run_id[-8:]}"
        done = starter(dev_server, "start", run, h.text, "--email", EMAIL, "--wait", queue=task_queue)
        assert done.returncode == 0, (h.name, done.stdout, done.stderr)
        assert f"run {run}: completed" in done.stdout, done.stdout
        assert_no_raw(done.stdout + done.stderr, f"start --wait of {h.name}")
        for args in (["status", run], ["status", run, "--live"], ["watch", run]):
            shown = starter(dev_server, *args, queue=task_queue)
            assert shown.returncode == 0, (args, shown.stderr)
            assert_no_raw(shown.stdout + shown.stderr, f"{' '.join(args[:1] + args[2:])} of {h.name}")
        as_json = starter(dev_server, "status", run, "--json", queue=task_queue)
        assert_no_raw(as_json.stdout, "status --json")
        status = json.loads(as_json.stdout)
        # Exact, nothing lost: the subject the model wrote from the task, and the email as sent.
        assert status["steps"][0]["result"]["subject"] == offline_subject(h.text), h.name
        [sent] = httpx.get(f"{provider.url}/v1/emails", params={"run_id": run}).json()["emails"]
        assert sent["subject"] == offline_subject(h.text)


async def test_status_escapes_what_temporals_history_holds(dev_server, client, task_queue, run_id):
    """A terminate reason is written into history by whoever terminates: data, shown escaped."""
    await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=run_id, task=TASK, email=EMAIL), id=run_id,
                                task_queue=task_queue)  # no worker: it waits
    reason = HOSTILE[0].text + "\nerror: forged line"
    await client.get_workflow_handle(run_id).terminate(reason=reason)
    for args in (["status", run_id], ["watch", run_id]):
        shown = starter(dev_server, *args)
        assert shown.returncode == 1, shown.stderr
        assert_no_raw(shown.stdout + shown.stderr, " ".join(args))
        assert "Refund \\x1b[2J\\x1b]0;owned\\x07 order \\x1b[31mRED\\x1b[0m 42\\x0aerror: forged line" in shown.stdout
        assert "\nerror: forged line" not in shown.stdout
    as_json = starter(dev_server, "status", run_id, "--json")
    assert_no_raw(as_json.stdout, "status --json")
    assert json.loads(as_json.stdout)["error"] == f"terminated: {reason}"


def test_the_live_rich_table_escapes_data_and_its_markup():
    from rich.console import Console

    from durable_agents.steps.runstate import run_entry, step_entry
    from durable_agents.steps.runview import rich_table

    status = run_entry("r-1", "failed", [
        step_entry("draft", "completed", 1, {"subject": "Re: \x1b]0;owned\x07 [red]x[/red]"}),
        step_entry("send_confirmation", "failed", 1, last_error="\x9b2J"),
        step_entry("record_outcome"),
    ], error="step send_confirmation failed: \u202eevil\x1b[2J")
    out = io.StringIO()
    Console(file=out, width=300, color_system=None, force_terminal=False).print(rich_table(status))
    text = out.getvalue()
    assert_no_raw(text, "rich table")
    assert "\\x1b]0;owned\\x07 [red]x[/red]" in text  # markup shown as written, not applied
    assert "\\u202eevil\\x1b[2J" in text


# -- the workflow's input check ------------------------------------------------------


async def test_the_workflow_refuses_hostile_input_of_runs_started_now(client, workers, provider, run_id, task_queue):
    """Input that bypassed the starter: refused at the workflow boundary, naming field, character, position."""
    workers()
    unique = run_id[-8:]
    cases = {f"ctl-{h.name}-{unique}": (dict(task=h.text), refusal("task", h)) for h in REFUSED}
    cases[f"ctl-email-{unique}"] = (dict(task=TASK, email="ada@exa\x9bmple.com"),
                                    "email address holds U+009B (CSI) at position 8")
    cases[f"ctl-conv-{unique}"] = (dict(task=TASK, conversation_id="c\u202e1"),
                                   "conversation id holds U+202E (RIGHT-TO-LEFT OVERRIDE) at position 2")
    for run, (fields, _) in cases.items():
        await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=run, **{"email": EMAIL, **fields}), id=run,
                                    task_queue=task_queue)
    for run, (_, expected) in cases.items():
        status = await wait_closed(client, run)
        assert status["status"] == "failed", status
        assert status["error"].startswith("input refused: ") and expected in status["error"], status["error"]
        assert [s["status"] for s in status["steps"]] == ["pending"] * 3
        assert fetch_effects(provider.url, run_id=run) == []
    # Accepted text is not refused: the same boundary lets it through to a completed run.
    accepted = f"ctl-accepted-{unique}"
    await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=accepted, task=ACCEPTED[0].text, email=EMAIL),
                                id=accepted, task_queue=task_queue)
    assert (await wait_closed(client, accepted))["status"] == "completed"


HISTORY = REPO / "tests" / "data" / "histories" / "6ad4721c745f" / "in-flight.json"


def _with_task(history: dict, old: str, new: str) -> dict:
    """The history with every payload string holding ``old`` rewritten to hold ``new``:
    what the previous main recorded for a run started with that task."""

    def swap(value):
        if isinstance(value, str):
            return value.replace(old, new)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    def walk(node):
        if isinstance(node, dict):
            if node.get("metadata", {}).get("encoding") == base64.b64encode(b"json/plain").decode() and "data" in node:
                data = json.loads(base64.b64decode(node["data"]))
                if swap(data) != data:  # leave every other payload byte for byte
                    encoded = json.dumps(swap(data), separators=(",", ":"), sort_keys=True).encode()
                    node["data"] = base64.b64encode(encoded).decode()
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    out = copy.deepcopy(history)
    walk(out)
    return out


async def test_a_run_in_flight_before_the_rule_replays_with_a_hostile_task():
    """Runs started before the rule (no live marker) took a task with ESC in it; replaying
    them under this code must not refuse it, or their next workflow task fails."""
    raw = json.loads(HISTORY.read_text())
    hostile = _with_task(raw, TASK, HOSTILE[0].text)
    started = hostile["events"][0]["workflowExecutionStartedEventAttributes"]["input"]["payloads"][0]
    assert "\x1b[2J" in json.loads(base64.b64decode(started["data"]))["task"]
    replayer = Replayer(workflows=[AgentFlow], workflow_runner=worker_options()["workflow_runner"],
                        data_converter=data_converter_from_env({}))
    await replayer.replay_workflow(WorkflowHistory.from_json(HISTORY.stem, hostile))


# -- the run record's CLI ------------------------------------------------------------


def runrecord_cli(db: Path, provider_url: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(["-m", "durable_agents.runrecord", *args, "--db", str(db)],
                   {"PROVIDER_URL": provider_url, "MEMORY_DB": str(db.parent / "memory.db")})


def test_the_run_record_refuses_hostile_tasks_and_runs_accepted_ones(tmp_path, provider, capsys):
    import signal

    from durable_agents.runrecord.cli import main as runrecord_main

    db = tmp_path / "runrecord.db"
    for h in REFUSED:
        if "\x00" in h.text:  # argv cannot hold NUL: the CLI's main, in this process
            saved = signal.getsignal(signal.SIGTERM)
            try:
                code = runrecord_main(["start", f"ctl-rr-{h.name}", h.text, "--email", EMAIL, "--db", str(db)])
            finally:
                signal.signal(signal.SIGTERM, saved)  # main makes SIGTERM a KeyboardInterrupt
            err = capsys.readouterr().err
            assert code == 2 and refusal("task", h) in err, err
            continue
        done = runrecord_cli(db, provider.url, "start", f"ctl-rr-{h.name}", h.text, "--email", EMAIL)
        assert done.returncode == 2, (h.name, done.stdout, done.stderr)
        assert refusal("task", h) in done.stderr, done.stderr
        assert "started:" not in done.stdout
        assert_no_raw(done.stdout + done.stderr, f"runrecord start of {h.name}")
    for h in ACCEPTED:
        run = f"ctl-rr-{h.name}"
        done = runrecord_cli(db, provider.url, "start", run, h.text, "--email", EMAIL)
        assert done.returncode == 0, (h.name, done.stdout, done.stderr)
        assert_no_raw(done.stdout + done.stderr, f"runrecord start of {h.name}")
        shown = runrecord_cli(db, provider.url, "status", run)
        assert shown.returncode == 0 and f"run {run}: completed" in shown.stdout, shown.stdout
        assert_no_raw(shown.stdout + shown.stderr, f"runrecord status of {h.name}")
        status = json.loads(runrecord_cli(db, provider.url, "status", run, "--json").stdout)
        assert status["steps"][0]["result"]["subject"] == offline_subject(h.text)
    listed = runrecord_cli(db, provider.url, "list")
    assert_no_raw(listed.stdout, "runrecord list")
    assert not any(f"ctl-rr-{h.name}" in listed.stdout for h in REFUSED), listed.stdout


def test_the_run_record_escapes_what_it_recorded_before_the_rule(tmp_path, provider):
    """A record as the previous code could leave it: a task with escape sequences, drafted into
    the subject, and an error that quotes it. status, status --json and list read it back."""
    db = tmp_path / "runrecord.db"
    run = "ctl-rr-before"
    assert runrecord_cli(db, provider.url, "start", run, TASK, "--email", EMAIL).returncode == 0
    hostile = HOSTILE[0].text
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT result FROM steps WHERE run_id = ? AND position = 0", (run,)).fetchone()
        result = json.loads(row[0])
        result["subject"] = "Re: " + hostile
        conn.execute("UPDATE steps SET result = ? WHERE run_id = ? AND position = 0", (json.dumps(result), run))
        conn.execute("UPDATE steps SET status = 'failed', last_error = ? WHERE run_id = ? AND position = 1",
                     (f"the provider refused: {hostile}", run))
        conn.execute("UPDATE runs SET task = ?, status = 'failed', error = ?, lease_holder = ? WHERE run_id = ?",
                     (hostile, f"step send_confirmation failed: {hostile}\nforged: line", "holder\x1b[2J", run))
    shown = runrecord_cli(db, provider.url, "status", run)
    assert shown.returncode == 1, shown.stderr
    assert_no_raw(shown.stdout + shown.stderr, "runrecord status")
    assert "\\x1b[2J\\x1b]0;owned\\x07" in shown.stdout and "\\x0aforged: line" in shown.stdout, shown.stdout
    assert_no_raw(runrecord_cli(db, provider.url, "list").stdout, "runrecord list")
    as_json = runrecord_cli(db, provider.url, "status", run, "--json").stdout
    assert_no_raw(as_json, "runrecord status --json")
    assert json.loads(as_json)["steps"][0]["result"]["subject"] == "Re: " + hostile


# -- the provider ----------------------------------------------------------------------


@pytest.fixture(scope="module")
@starts("process")
def provider_url(tmp_path_factory):
    with ProviderProcess(tmp_path_factory.mktemp("ctl-provider") / "provider.db") as provider:
        yield provider.url


def _email(run: str, **fields) -> dict:
    return {"run_id": run, "to": EMAIL, "subject": "Your refund", "body": "Hello Ada,\n\nDone.", **fields}


@pytest.mark.parametrize("h", HOSTILE, ids=IDS)
@pytest.mark.parametrize("field", ["subject", "to", "body", "summary"])
def test_the_provider_checks_text_itself(provider_url, h, field):
    run = f"ctl-prov-{uuid.uuid4().hex[:12]}"
    if field == "summary":
        path, body = "/v1/tickets", {"run_id": run, "summary": h.text, "email_message_id": "msg_1"}
    else:
        path, body = "/v1/emails", _email(run, **{field: h.text})
    answer = httpx.post(f"{provider_url}{path}", json=body, headers={"Idempotency-Key": f"{run}-{field}"})
    single_line = field != "body"
    if h.refused:
        assert answer.status_code == 422, answer.text
        data = answer.json()
        assert data["error"] == "invalid_request" and data["field"] == field, data
        # The provider's own words (not the client's): field, U+XXXX and position.
        assert f"{field} contains {h.refused.split()[0]} at position {h.position}:" in data["message"], data
        assert RAW.search(answer.text) is None  # JSON escapes it; the answer quotes no raw byte
    elif h.name == "newline-and-tab" and single_line:
        assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
        assert "U+000A" in answer.json()["message"] or "U+0009" in answer.json()["message"], answer.text
    elif field == "to":  # passes the text rule, but is no address
        assert answer.status_code == 422 and answer.json()["field"] == "to", answer.text
        assert re.search("malformed|the limit is 254", answer.json()["message"]), answer.text
    elif len(h.text) > {"subject": 200, "summary": 500, "body": 20000}[field]:
        assert answer.status_code == 422 and "the limit is" in answer.json()["message"], answer.text
    else:
        assert answer.status_code == 200, answer.text
        stored = httpx.get(f"{provider_url}{path}", params={"run_id": run}).json()
        [row] = stored["emails" if path == "/v1/emails" else "tickets"]
        assert row[field] == h.text  # exact: nothing mended, nothing lost


def test_the_provider_allows_crlf_and_tab_in_a_body_but_no_lone_cr(provider_url):
    ok = httpx.post(f"{provider_url}/v1/emails", json=_email("ctl-prov-crlf", body="Hi\r\n\tthere\n"),
                    headers={"Idempotency-Key": "ctl-prov-crlf-1"})
    assert ok.status_code == 200, ok.text
    lone = httpx.post(f"{provider_url}/v1/emails", json=_email("ctl-prov-cr", body="Hi\rthere"),
                      headers={"Idempotency-Key": "ctl-prov-cr-1"})
    assert lone.status_code == 422 and "body contains U+000D at position 3" in lone.json()["message"], lone.text


@pytest.mark.parametrize("where", ["subject", "body", "summary", "metadata-value", "metadata-key"])
def test_the_provider_refuses_a_lone_surrogate_by_name_not_with_a_500(provider_url, where):
    """JSON can spell a code point with no UTF-8 form (``\\udcff``); it must get a 422 naming the field, and
    the provider must stay up and count the refusal (before this it answered 500 from deep in the store)."""
    run = f"ctl-sur-{uuid.uuid4().hex[:12]}"
    if where == "summary":
        path, body = "/v1/tickets", {"run_id": run, "summary": "Refund \udcff", "email_message_id": "msg_1"}
    elif where.startswith("metadata"):
        meta = {"note": "x\udcff"} if where == "metadata-value" else {"n\udcffote": "x"}
        path, body = "/v1/emails", _email(run, metadata=meta)
    else:
        path, body = "/v1/emails", _email(run, **{where: "Refund \udcff"})
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as the escape \udcff, as a client would send it
    assert "\\udcff" in raw
    answer = httpx.post(f"{provider_url}{path}", content=raw.encode(), headers={
        "Idempotency-Key": f"{run}-1", "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    data = answer.json()
    field = "metadata" if where.startswith("metadata") else where
    assert data["error"] == "invalid_request" and data["field"] == field, data
    assert "U+DCFF at position" in data["message"] and "valid UTF-8" in data["message"], data
    fixed = httpx.post(f"{provider_url}{path}", json={**body, **({"metadata": {"note": "x"}} if field == "metadata"
                                                                   else {field: "Refund"})},
                       headers={"Idempotency-Key": f"{run}-2"})
    assert fixed.status_code == 200, fixed.text  # the provider is still up and the mended request goes through


def test_the_providers_rule_is_its_own_code():
    """It shares nothing with the client's rule: the provider package imports nothing from the client side
    (durable_agents.steps.controls and durable_agents.steps.limits included), at the top of a module or inside a
    function. Its one project import is the adapter's storage, the neutral SQLite helper, which itself imports
    nothing from the project."""
    from lab.import_graph import edges, units

    graph = edges(units())
    assert sorted(b for a, b in graph if a == "provider") == ["durable_agents.storage"]
    assert sorted(b for a, b in graph if a == "durable_agents.storage") == []


# -- the model's output ------------------------------------------------------------


class _Model:
    """A model that returns whatever it is given, unchecked (as a buggy client might)."""

    name = "fake"

    def __init__(self, **fields):
        self.fields = {"subject": "Re: refund", "body": "Hello.", "summary": "Refund confirmed", **fields}

    async def draft(self, messages):
        return SimpleNamespace(**self.fields)


class _Provider:
    def __init__(self):
        self.calls = 0

    async def send_email(self, **kwargs):
        self.calls += 1
        raise AssertionError("the email was sent")

    async def create_ticket(self, **kwargs):
        self.calls += 1
        raise AssertionError("the ticket was recorded")


@pytest.mark.parametrize("h", HOSTILE, ids=IDS)
async def test_the_models_subject_is_checked_before_anything_is_sent(h):
    from durable_agents.drafting import Draft, DraftError, OfflineModel

    deps = flow.StepDeps(provider=_Provider(), llm=_Model(subject=h.text[:200]))
    request = DraftRequest(run_id="r-1", task=TASK, conversation_id="r-1")
    if h.refused:
        with pytest.raises(PermanentError) as caught:
            await flow.draft(request, deps)
        assert "the model's draft (fake) was refused" in str(caught.value)
        assert refusal("subject", h) in str(caught.value) and "single line of printable text" in str(caught.value)
        with pytest.raises(DraftError, match=re.escape(refusal("subject", h))):
            Draft(subject=h.text, body="b", summary="s")
        # A task that carried it, accepted before the rule: the offline model fails permanently, no
        # retry loop (it drops a NUL from the task itself).
        if "\x00" not in h.text:
            with pytest.raises(PermanentError, match=re.escape(h.refused)):
                await OfflineModel().draft([{"role": "user", "content": h.text}])
        # A draft recorded before the rule: the send and record steps refuse it, and the provider sees nothing.
        with pytest.raises(PermanentError, match="the email request was not made: " + re.escape(refusal("subject", h))):
            await flow.send_confirmation(SendRequest(run_id="r-1", to=EMAIL, subject=h.text, body="b",
                                                     idempotency_key="k-1"), deps)
        with pytest.raises(PermanentError,
                           match="the ticket request was not made: " + re.escape(refusal("summary", h))):
            await flow.record_outcome(RecordRequest(run_id="r-1", summary=h.text, email_message_id="m",
                                                    idempotency_key="k-2"), deps)
        assert deps.provider.calls == 0
    elif h.name == "newline-and-tab":  # text, but not on one line
        with pytest.raises(PermanentError, match=re.escape("subject holds U+000A (LF) at position 16")):
            await flow.draft(request, deps)
    else:
        drafted = await flow.draft(request, deps)
        assert drafted.subject == h.text[:200]
    # The body is multi-line text: newline and tab are fine there, the rest is not.
    body_deps = flow.StepDeps(provider=_Provider(), llm=_Model(body=h.text))
    if h.refused:
        with pytest.raises(PermanentError, match=re.escape(refusal("body", h))):
            await flow.draft(request, body_deps)
    else:
        assert (await flow.draft(request, body_deps)).body == h.text


async def test_a_hostile_subject_from_a_real_model_client_fails_the_run_once_and_sends_nothing(
    dev_server, client, workers, provider, run_id, task_queue
):
    h = HOSTILE[0]
    answer = json.dumps({"subject": h.text, "body": "Your refund is confirmed.", "summary": "refund confirmed"})
    with FakeOpenAIServer() as model:
        model.push(*[completion(answer)] * 4)
        workers(extra_env={"LLM_BASE_URL": model.base_url, "LLM_MODEL": "fake-model", "LLM_API_KEY": "test-key"})
        await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=run_id, task=TASK, email=EMAIL), id=run_id,
                                    task_queue=task_queue)
        status = await wait_closed(client, run_id)
        asked = model.request_count
    assert status["status"] == "failed", status
    draft = status["steps"][0]
    assert (draft["status"], draft["attempts"]) == ("failed", 1), draft  # permanent: not retried
    assert asked == 2  # the client asks the model again once, then gives up
    assert refusal("subject", h) in status["error"], status["error"]
    assert fetch_effects(provider.url, run_id=run_id) == []
    shown = starter(dev_server, "status", run_id)
    assert shown.returncode == 1 and "U+001B (ESC)" in shown.stdout
    assert_no_raw(shown.stdout + shown.stderr, "status of the failed run")


# -- rendering and logs --------------------------------------------------------------


def test_the_table_escapes_every_value_and_a_value_cannot_forge_a_row():
    from durable_agents.steps.runstate import run_entry, step_entry
    from durable_agents.steps.runview import render_table

    evil = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e\x7f\x00\r\n  error: forged"
    status = run_entry("r-1", "running", [
        step_entry("draft", "completed", 1, {"subject": evil}),
        step_entry("send_confirmation", "retrying", 2, last_error=evil, next_try_at="2026-01-01T00:00:00.000Z",
                   note=evil),
        step_entry("record_outcome"),
    ], detail=evil, error=evil)
    text = render_table(status)
    assert_no_raw(text, "render_table")
    assert len(text.splitlines()) == 10, text  # run, columns, 3 steps, last error, next try, note, now, error
    assert "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e\\x7f\\x00\\x0d\\x0a  error: forged" in text


def test_log_lines_show_control_characters_escaped_and_keep_tracebacks():
    from durable_agents.flowclient.logs import FORMAT, PrintableFormatter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(PrintableFormatter(FORMAT))
    log = logging.getLogger("tests.control_chars")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("subject %s", HOSTILE[0].text + "\nforged: line")
        try:
            raise ValueError("bad \x9b2J")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert_no_raw(text, "log output")
    lines = text.splitlines()
    assert lines[0].endswith("subject Refund \\x1b[2J\\x1b]0;owned\\x07 order \\x1b[31mRED\\x1b[0m 42\\x0aforged: line")
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: bad \\x9b2J"


def test_bytes_that_are_not_utf8_are_refused_by_name_not_by_a_traceback(tmp_path, provider):
    """A shell passes whatever bytes it is given; Python turns the ones that are
    not UTF-8 into lone surrogates (U+DC80-U+DCFF), which nothing downstream can
    encode. Both CLIs refuse them like the rule's other characters, exit 2."""
    task = b"Refund \xff order 42"
    commands = {
        "starter": [b"starter.py", b"start", b"ctl-bytes", task, b"--email", EMAIL.encode()],
        "runrecord": [b"-m", b"durable_agents.runrecord", b"start", b"ctl-bytes", task, b"--email", EMAIL.encode(),
                      b"--db", str(tmp_path / "runrecord.db").encode()],
    }
    for name, args in commands.items():
        done = subprocess.run([sys.executable.encode(), *args], cwd=REPO, capture_output=True, timeout=120,
                              env={**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", "PROVIDER_URL": provider.url})
        err = done.stderr.decode("utf-8")  # strict: the refusal itself must be valid UTF-8
        assert done.returncode == 2, (name, err)
        assert "task holds U+DCFF (a byte that is not UTF-8: 0xFF) at position 8" in err, (name, err)
        assert "Traceback" not in err, (name, err)
    db = tmp_path / "runrecord.db"
    if db.exists():  # nothing was recorded
        with sqlite3.connect(db) as con:
            assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_printable_escapes_lone_surrogates_so_printing_cannot_fail():
    from durable_agents.steps.controls import printable

    shown = printable("Refund \udcff order")
    assert shown == "Refund \\udcff order"
    shown.encode("utf-8")  # what print() does to a UTF-8 terminal: no UnicodeEncodeError
