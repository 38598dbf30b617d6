"""An agent the lab has never seen (``tests.agents.notebook``), brought as a user brings theirs: by import
string on the worker's and the record's command lines, nothing of the adapter or the lab edited, no global
replaced. Killed after each of its effects and after a turn's answer, on Temporal (a standby worker takes
over) and on the run record (resumed by run id): each effect applied once at its own store, judged from
outside the killed process; no recorded turn asked again. A worker that does not serve the run's agent, or
serves another version of it, refuses the run visibly, naming both; an unknown tool is refused back to the
model.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from durable_agents import Agent, Tool, Toolbox
from durable_agents.flowclient.loop import loop_status, start_loop
from durable_agents.steps.limits import InputError
from durable_agents.steps.loop import AskedCall, LoopInputs, run_tool, tool_request
from durable_agents.steps.loopargs import settled_agent
from durable_agents.steps.served import Served
from lab.processes import REPO
from tests.agents.notebook import NOTEBOOK, Page, read_page
from tests.support import first_workflow_task_failure, wait_exit

SPEC = "tests.agents.notebook:NOTEBOOK"
TASK = "Go through page 1 of my notebook."
POINTS = ["turn:after_answer", "tool:write_note:after_effect", "tool:archive:after_effect"]


def applied(db: Path) -> tuple[dict[str, int], Counter[str], Counter[int], list[str], Counter[str]]:
    """(effects per kind, requests per key, asks per turn, the owners on the notes, lookups per key), from the
    agent's store."""
    with sqlite3.connect(db) as conn:
        kinds = Counter(k for (k,) in conn.execute("SELECT kind FROM effects"))
        requests = Counter(k for (k,) in conn.execute("SELECT key FROM requests"))
        asks = Counter(t for (t,) in conn.execute("SELECT turn FROM asks"))
        owners = [b for (b,) in conn.execute("SELECT json_extract(body, '$.owner') FROM effects WHERE kind='note'")]
        lookups = Counter(k for (k,) in conn.execute("SELECT key FROM lookups"))
    return dict(kinds), requests, asks, owners, lookups


def judge(db: Path, point: str) -> None:
    kinds, requests, asks, owners, lookups = applied(db)
    assert kinds == {"note": 1, "archive": 1}, kinds
    assert owners == ["ana@example.com"], owners  # the run's parameter, never the model's
    # The call whose answer died with its process is retried: write_note asks its lookup and takes the applied
    # note (sent once, looked up once); archive declares no lookup, so it is sent again under its key.
    note = next(key for key in requests if key.split("/")[-1].startswith("call-0"))
    want = {key: 2 if point == "tool:archive:after_effect" and key != note else 1 for key in requests}
    assert requests == Counter(want), requests
    assert lookups == (Counter({note: 1}) if point == "tool:write_note:after_effect" else Counter()), lookups
    assert asks == Counter({1: 2 if point == "turn:after_answer" else 1, 2: 1, 3: 1}), asks


@pytest.mark.process
@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.replace(":", "."))
async def test_an_agent_of_its_own_killed_on_temporal_applies_each_effect_once(
        point, client, dev_server, workers, run_id, task_queue, tmp_path):
    db = tmp_path / "notebook.db"
    env = {"NOTEBOOK_DB": str(db)}
    first = workers(crash_at=point, extra_env=env, args=["--agent", SPEC])
    assert "notebook (version" in first.output()
    created, _ = await start_loop(client, run_id, TASK, task_queue=task_queue, agent=NOTEBOOK,
                                  params={"owner": "ana@example.com"}, agent_spec=SPEC)
    assert created
    assert wait_exit(first, 90) == -9, first.output()
    workers(extra_env=env, args=["--agent", SPEC])
    result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=120)
    assert result["status"] == "completed" and result["answer"].startswith("Noted the plumber"), result
    judge(db, point)
    status = await loop_status(client, run_id)
    assert status["counts"] == {"turns": 3, "tool_calls": 3, "effects": 2, "refused": 0}, status["counts"]
    keyed = [c["name"] for t in status["turns"] for c in t["calls"] if c["key"]]
    assert keyed == ["write_note", "archive"], status["turns"]  # its effects, from what the run recorded
    assert (status["agent"], status["agent_spec"]) == ("notebook", SPEC)
    if point != POINTS[-1]:
        return
    # settle loads the run's agent by the import string it recorded, and its tools ask their own services.
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "NOTEBOOK_DB": str(db)}
    done = subprocess.run([sys.executable, "starter.py", "settle", run_id, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert settled(json.loads(done.stdout)) == SETTLED


def test_settle_names_the_agent_a_run_needs_when_it_recorded_no_import_string():
    with pytest.raises(InputError, match="started by agent 'notebook'.*--agent MODULE:ATTR"):
        settled_agent(None, "notebook", "python starter.py settle r1 --agent MODULE:ATTR")
    with pytest.raises(InputError, match="is agent 'refund', but the run was started by agent 'notebook'"):
        settled_agent("durable_agents.steps.refund_agent:REFUND_AGENT", "notebook", "...")
    assert settled_agent(SPEC, "notebook", "...") is NOTEBOOK
    assert settled_agent(None, "", "...").name == "refund"  # a run recorded before agents had names


def settled(report: dict) -> list[tuple[str, str]]:
    """A settle report's (tool, state) per call: write_note asked through its lookup, archive not askable."""
    return [(e["tool"], e["state"]) for e in report["steps"]]


SETTLED = [("write_note", "applied"), ("archive", "cannot ask")]


def json_of(proc) -> dict:
    assert wait_exit(proc, 60) == 0, proc.output()
    text = proc.output()
    return json.loads(text[text.index("{"):])


@pytest.mark.process
@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.replace(":", "."))
def test_an_agent_of_its_own_killed_on_the_run_record_resumes_by_run_id(point, runrecord, run_id, tmp_path):
    db = tmp_path / "notebook.db"
    env = {"NOTEBOOK_DB": str(db), "CRASH_AT": point}
    first = runrecord("loop", run_id, TASK, "--agent", SPEC, "--param", "owner=ana@example.com", env=env)
    assert wait_exit(first, 60) == -9, first.output()
    # The record named the agent and its import string: resume needs neither again.
    second = runrecord("resume", run_id, env={"NOTEBOOK_DB": str(db)})
    assert wait_exit(second, 60) == 0, second.output()
    assert "Noted the plumber" in second.output(), second.output()
    judge(db, point)
    # settle asks each call's own tool, loaded from the import string the run recorded.
    assert settled(json_of(runrecord("settle", run_id, "--json", env={"NOTEBOOK_DB": str(db)}))) == SETTLED


@pytest.mark.process
@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.replace(":", "."))
def test_an_agent_of_its_own_killed_on_dbos_recovers_by_run_id(point, dbos_procs, run_id, tmp_path):
    db = tmp_path / "notebook.db"
    env = {"NOTEBOOK_DB": str(db)}
    first = dbos_procs("loop", run_id, TASK, "--agent", SPEC, "--param", "owner=ana@example.com", crash_at=point,
                       env=env)
    assert wait_exit(first, 90) == -9, first.output()
    assert "application version agentlab-loop-1-notebook+" in first.output(), first.output()
    second = dbos_procs("resume", run_id, env=env)  # the agent from the import string the run recorded
    assert wait_exit(second, 90) == 0, second.output()
    judge(db, point)
    assert settled(json_of(dbos_procs("settle", run_id, "--json", env=env))) == SETTLED


@pytest.mark.process
async def test_a_worker_refuses_a_run_of_an_agent_it_does_not_serve_naming_both_versions(
        client, workers, task_queue, run_id, tmp_path):
    workers(extra_env={"NOTEBOOK_DB": str(tmp_path / "n.db")}, args=["--agent", SPEC])
    # A run of an agent this worker does not serve at all.
    other = Agent("diary", "Keep a diary.", Toolbox([Tool("read_page", "Read a page.", Page, read_page)]),
                  model=NOTEBOOK.model)
    await start_loop(client, f"{run_id}-diary", TASK, task_queue=task_queue, agent=other)
    message = await first_workflow_task_failure(client, client, f"{run_id}-diary")
    assert "does not serve agent 'diary'" in message and "notebook (version" in message, message
    # A run of another version of the notebook (one tool fewer): refused, naming both versions.
    older = Agent("notebook", NOTEBOOK.instructions, Toolbox(list(NOTEBOOK.tools)[:2]), model=NOTEBOOK.model,
                  params=("owner",))
    await start_loop(client, run_id, TASK, task_queue=task_queue, agent=older, params={"owner": "ana@example.com"})
    message = await first_workflow_task_failure(client, client, run_id)
    assert (f"started by agent notebook of version {Served(older).version}" in message
            and f"this code's is version {Served(NOTEBOOK).version}" in message), message
    status = await loop_status(client, run_id)
    assert status["status"] == "parked" and status["detail"], status  # not failed: it waits for its code


async def test_a_run_names_its_agent_and_its_parameters_are_checked(client, task_queue):
    with pytest.raises(InputError, match="needs the run parameter owner"):
        await start_loop(client, "own-agent-no-owner", TASK, task_queue=task_queue, agent=NOTEBOOK)
    with pytest.raises(InputError, match="takes no parameter 'email'"):
        await start_loop(client, "own-agent-email", TASK, task_queue=task_queue, agent=NOTEBOOK,
                         params={"owner": "a@b.c", "email": "x@y.z"})


async def test_an_unknown_tool_is_refused_back_to_the_model_and_nothing_is_dispatched(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_DB", str(tmp_path / "n.db"))
    inputs = LoopInputs("r1", TASK, "", agent="notebook", params={"owner": "a@b.c"})
    services = NOTEBOOK.services() if NOTEBOOK.services else None
    for name in ("create_ticket", "issue_refund", "wire_money"):  # the lab's tools are not this agent's
        result = await run_tool(tool_request(inputs, 1, 0, AskedCall("c", name, "{}")), None, NOTEBOOK, services)
        assert result.status == "refused" and f"unknown tool '{name}'" in result.content, result
        assert "read_page, write_note, archive" in result.content
    assert applied(tmp_path / "n.db")[0] == {}


@pytest.mark.process
async def test_the_plugin_serves_an_agent_on_a_worker_of_the_users_own(client, run_id, tmp_path, monkeypatch):
    """``AgentPlugin`` on a plain ``Worker``: the loop's workflow and activities added, the agent served on
    that queue, a run started by ``start_agent`` completed with each effect once."""
    from temporalio.worker import Worker

    from durable_agents.flowclient.agents import AgentPlugin, start_agent

    monkeypatch.setenv("NOTEBOOK_DB", str(tmp_path / "n.db"))
    queue = f"plugin-{run_id}"
    with pytest.raises(ValueError, match="has no model"):
        AgentPlugin(Agent("bare", "Read.", Toolbox([Tool("read_page", "Read a page.", Page, read_page)])))
    async with Worker(client, task_queue=queue, plugins=[AgentPlugin(NOTEBOOK)]):
        created, _ = await start_agent(client, NOTEBOOK, run_id, TASK, task_queue=queue,
                                       params={"owner": "ana@example.com"})
        assert created
        result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=60)
    assert result["status"] == "completed", result
    judge(tmp_path / "n.db", "")
