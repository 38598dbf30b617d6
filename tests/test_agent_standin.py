"""An agent's own scripted model served by the model stand-in (``durable_agents.testing.standin --agent``), and the
worker-side switch that asks it there (``AGENT_MODEL=worker``, ``durable_agents.steps.served``): a script answers alike
in the worker's process and over HTTP, because it is given the same messages both ways; the switch keeps the
agent's version; a bad value or a missing ``LLM_BASE_URL`` is refused saying what to give; and on Temporal,
a worker killed after a turn's answer makes the stand-in, in a process of its own, count that turn twice and
every other once.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3
import sys
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from durable_agents import Agent, ScriptedModel
from durable_agents.drafting import OpenAIChatModel
from durable_agents.flowclient.loop import start_loop
from durable_agents.steps.loop import (
    LoopInputs,
    ToolResult,
    TurnRequest,
    TurnResult,
    model_turn,
    result_message,
    system_message,
    task_message,
    turn_message,
)
from durable_agents.steps.refund_agent import REFUND_AGENT
from durable_agents.steps.served import Served, agent_model, serve
from durable_agents.testing.standin import ModelStandIn, start_model_standin, turns_asked
from examples.scheduler import agent as scheduler
from lab.processes import REPO, Proc
from tests.agents.notebook import NOTEBOOK
from tests.support import wait_exit

NOTEBOOK_SPEC = "tests.agents.notebook:NOTEBOOK"
TASK = "Book a room on 2027-01-12"
SLOTS = {"slots": [{"room": "Fjord", "start": "2027-01-12T09:00", "minutes": 30},
                   {"room": "Delta", "start": "2027-01-12T09:30", "minutes": 30}]}


def recording(seen: list[list[dict]]) -> Agent:
    """The example scheduler, its script wrapped to keep a copy of every window it is given."""
    def script(messages: list[dict]) -> object:
        seen.append(copy.deepcopy(messages))
        return scheduler.script(messages)

    return replace(scheduler.AGENT, model=ScriptedModel(script, name="scheduler-script"))


async def three_turns(ask) -> list[TurnResult]:
    """The scheduler's three turns, each asked through ``durable_agents.steps.loop.model_turn`` by ``ask(request)`` on
    the window the loop builds from what it recorded (tool results written here, as the service would answer)."""
    inputs = LoopInputs("run-1", TASK, "", agent="scheduler", params={"attendee": "ana@example.com"})
    window = [system_message(scheduler.AGENT.instructions)[1], task_message(inputs)[1]]
    turns = []
    for turn in (1, 2, 3):
        result = await ask(TurnRequest("run-1", turn, copy.deepcopy(window), max_turns=20, window_tokens=2000,
                                       tools=scheduler.AGENT.tools.specs(), agent="scheduler"))
        turns.append(result)
        window.append(turn_message(result)[1])
        for index, call in enumerate(result.calls):
            content = json.dumps(SLOTS if call.name == "find_slots" else {"ok": True, "id": f"x-{index}"})
            window.append(result_message(result, ToolResult(turn, index, call.name, "ok", content))[1])
    return turns


async def test_a_script_answers_the_same_in_process_and_through_the_stand_in():
    """The same turns, asked in this process (the agent's declared model) and over HTTP (the worker's client of
    the stand-in serving that agent): the script is given equal messages, and the turns recorded are equal."""
    here: list[list[dict]] = []
    own = recording(here)
    in_process = await three_turns(lambda req: model_turn(req, None, own))

    there: list[list[dict]] = []
    with ModelStandIn(agent=recording(there)) as standin:
        client = OpenAIChatModel(standin.url, "scripted", timeout=10.0)
        deps = SimpleNamespace(agent=client, pace_seconds=0)  # the worker's model, as AGENT_MODEL=worker serves
        try:
            served = serve([own], deps, model="worker")[0]
            assert served.agent.model is None  # so model_turn asks deps.agent, the HTTP client
            over_http = await three_turns(lambda req: model_turn(req, deps, served.agent))  # type: ignore[arg-type]
        finally:
            await client.aclose()
        assert standin.counts("run-1")["turns"] == {"1": 1, "2": 1, "3": 1}

    assert len(here) == len(there) == 3
    assert there == here  # message for message, key for key (an assistant's None content included)
    assert [m["role"] for m in here[-1]] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool"]
    assert [replace(t, model="") for t in over_http] == [replace(t, model="") for t in in_process]
    assert [c.name for c in in_process[1].calls] == ["book_room", "send_invite"]
    assert in_process[2].content == "Booked a room and invited the attendee."


def test_the_stand_in_refuses_an_agent_without_a_model_of_its_own():
    with pytest.raises(ValueError, match="agent refund declares no model of its own"):
        ModelStandIn(agent=REFUND_AGENT)


def test_vary_keeps_an_agent_s_tools_and_arguments_and_varies_its_words_and_call_ids():
    """What the kill matrix's random mode asks of the stand-in: a turn asked again chooses other call ids (so
    other keys), as a real model's would, while the script's choice of tools and arguments stands."""
    import httpx

    ask = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Book a room on 2027-01-12"}],
           "tools": [{"type": "function", "function": {"name": "find_slots"}}]}
    with ModelStandIn(agent=scheduler.AGENT) as plain, ModelStandIn(agent=scheduler.AGENT, vary=True) as varied:
        same = [httpx.post(f"{plain.url}/chat/completions", json=ask).json()["choices"][0]["message"]
                for _ in range(2)]
        other = [httpx.post(f"{varied.url}/chat/completions", json=ask).json()["choices"][0]["message"]
                 for _ in range(2)]
    assert same[0] == same[1]
    calls = [m["tool_calls"][0] for m in other]
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["id"].startswith("call_")
    assert [c["function"] for c in calls] == [same[0]["tool_calls"][0]["function"]] * 2


def test_agent_model_worker_serves_the_agent_without_its_model_and_keeps_its_version(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTEBOOK_DB", str(tmp_path / "n.db"))  # what its services open
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("AGENT_MODEL", "worker")
    refund, notebook = serve([REFUND_AGENT, NOTEBOOK], services := object())
    assert notebook.agent.model is None and NOTEBOOK.model is not None  # the declaration is left as it was
    assert notebook.version == Served(NOTEBOOK).version and notebook.signature == Served(NOTEBOOK).signature
    assert notebook.agent.tools is NOTEBOOK.tools and notebook.agent.instructions == NOTEBOOK.instructions
    assert refund.agent is REFUND_AGENT and refund.services is services
    monkeypatch.setenv("AGENT_MODEL", "own")
    assert serve([NOTEBOOK])[0].agent is NOTEBOOK
    monkeypatch.delenv("AGENT_MODEL")
    assert serve([NOTEBOOK])[0].agent is NOTEBOOK  # own, the default


def test_a_bad_agent_model_or_worker_without_llm_base_url_is_refused_saying_what_to_give(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTEBOOK_DB", str(tmp_path / "n.db"))
    monkeypatch.delenv("LLM_BASE_URL", raising=False)
    for bad in ("workers", "http://127.0.0.1:8790/v1", "OWN"):
        with pytest.raises(ValueError, match=r"is not a choice: give 'own' .* or 'worker'"):
            agent_model({"AGENT_MODEL": bad})
    monkeypatch.setenv("AGENT_MODEL", "mine")
    with pytest.raises(ValueError, match="AGENT_MODEL='mine' is not a choice"):
        serve([REFUND_AGENT])  # refused even where it would change nothing
    monkeypatch.setenv("AGENT_MODEL", "worker")
    with pytest.raises(ValueError, match="AGENT_MODEL=worker asks the worker's model for agent notebook.*"
                                         "LLM_BASE_URL, which is not set"):
        serve([REFUND_AGENT, NOTEBOOK])
    assert serve([REFUND_AGENT])[0].agent is REFUND_AGENT  # no model of its own: nothing to replace


@pytest.mark.process
def test_the_stand_in_process_refuses_an_agent_that_does_not_load_with_exit_2():
    for spec, said in (("tests.agents.nowhere:AGENT", "cannot import 'tests.agents.nowhere'"),
                       ("durable_agents.steps.refund_agent:REFUND_AGENT", "agent refund declares no model of its own")):
        proc = Proc("model-standin", [sys.executable, "-m", "durable_agents.testing.standin", "--agent", spec],
                    cwd=REPO)
        assert wait_exit(proc, 30) == 2, proc.output()
        assert said in proc.output(), proc.output()


@pytest.mark.process
async def test_a_turn_killed_after_its_answer_is_asked_twice_at_the_stand_in_and_every_other_once(
        client, workers, run_id, task_queue, tmp_path):
    """The notebook's script served by the stand-in in its own process; the worker asks it over HTTP
    (``AGENT_MODEL=worker``) and is killed after turn 1's answer, before the turn is recorded; a second worker
    finishes the run. The stand-in's counts: turn 1 twice, turns 2 and 3 once. The script's own log (the
    notebook's store) agrees, so it ran in the stand-in, never in a worker."""
    db = tmp_path / "notebook.db"
    standin, url = start_model_standin(agent=NOTEBOOK_SPEC, env={"NOTEBOOK_DB": str(db)})
    try:
        env = {"NOTEBOOK_DB": str(db), "AGENT_MODEL": "worker", "LLM_BASE_URL": url, "LLM_MODEL": "notebook"}
        first = workers(crash_at="turn:after_answer", extra_env=env, args=["--agent", NOTEBOOK_SPEC])
        created, _ = await start_loop(client, run_id, "Go through page 1 of my notebook.", task_queue=task_queue,
                                      agent=NOTEBOOK, params={"owner": "ana@example.com"})
        assert created
        assert wait_exit(first, 60) == -9, first.output()
        assert turns_asked(url, run_id) == {"1": 1}
        workers(extra_env=env, args=["--agent", NOTEBOOK_SPEC])
        result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=60)
        assert result["status"] == "completed" and result["answer"].startswith("Noted the plumber"), result
        assert turns_asked(url, run_id) == {"1": 2, "2": 1, "3": 1}
    finally:
        standin.kill()
    with sqlite3.connect(db) as conn:
        assert Counter(t for (t,) in conn.execute("SELECT turn FROM asks")) == Counter({1: 2, 2: 1, 3: 1})
        assert Counter(k for (k,) in conn.execute("SELECT kind FROM effects")) == Counter({"note": 1, "archive": 1})


@pytest.mark.process
@pytest.mark.parametrize("engine", ["runrecord", "dbosflow"])
def test_the_run_record_and_dbos_commands_ask_the_stand_in_with_agent_model_worker(
        engine, runrecord, dbos_procs, run_id, tmp_path):
    """The switch is read where every engine serves its agents (``durable_agents.steps.served.serve``): the record's and
    DBOS's commands ask the stand-in too, each turn once."""
    db = tmp_path / "notebook.db"
    standin, url = start_model_standin(agent=NOTEBOOK_SPEC, env={"NOTEBOOK_DB": str(db)})
    try:
        env = {"NOTEBOOK_DB": str(db), "AGENT_MODEL": "worker", "LLM_BASE_URL": url, "LLM_MODEL": "notebook"}
        start = runrecord if engine == "runrecord" else dbos_procs
        proc = start("loop", run_id, "Go through page 1 of my notebook.", "--agent", NOTEBOOK_SPEC,
                     "--param", "owner=ana@example.com", env=env)
        assert wait_exit(proc, 60) == 0, proc.output()
        assert turns_asked(url, run_id) == {"1": 1, "2": 1, "3": 1}, proc.output()
    finally:
        standin.kill()
