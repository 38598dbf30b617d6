"""The agent loop on DBOS (``python -m durable_agents.dbosflow loop``), proved with real processes: the provider (which
counts effects and order lookups), the model stand-in (``durable_agents.testing.standin``, reached through
``LLM_BASE_URL``, which counts every request by run and turn), and ``python -m durable_agents.dbosflow`` processes
killed by SIGKILL at each crash point of the loop, then resumed (DBOS's recovery on launch) without it.

The task names two orders with something left to refund, so the scripted model takes six turns: a lookup,
a refund and its email, the second lookup, its refund and email, the ticket, the final answer (turns 2 and
4 carry two calls). In every kill test: each effect applied once at the provider (2 refunds, 2 emails, 1
ticket), no recorded turn asked again (the stand-in's count), the run completed.

In process, no DBOS launched: the walk's windows are the ones ``LoopPlan.request`` derives from the recorded
outputs, and a changed loop is another application version.

Skipped, saying why, when the optional extra is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("dbos",
                    reason="DBOS Transact is an optional extra: pip install -e '.[dbos]' (make test installs it)")

from durable_agents import Toolbox  # noqa: E402
from durable_agents.dbosflow import loop as dbos_loop  # noqa: E402
from durable_agents.dbosflow import status as dbos_status  # noqa: E402
from durable_agents.drafting import ScriptedModel  # noqa: E402
from durable_agents.memory import MemoryPolicy, derive_window  # noqa: E402
from durable_agents.providerclient import fetch_effects, seed_orders  # noqa: E402
from durable_agents.steps import loop  # noqa: E402
from durable_agents.steps.models import to_jsonable  # noqa: E402
from durable_agents.steps.retry import SAME_ERROR_LIMIT, RetryRule  # noqa: E402
from durable_agents.steps.startedline import started_steps  # noqa: E402
from durable_agents.testing.standin import ModelStandIn, turns_asked  # noqa: E402
from lab.processes import REPO  # noqa: E402
from tests.loop_support import (  # noqa: E402
    BAD_LOOP_INPUT,
    CUSTOMER,
    ORDERS,
    OUTAGES_THAT_CLEAR,
    SAME_ERROR_FAILS,
    TASK,
    TURNS,
    assert_each_effect_once,
    assert_failed_at_the_turn_limit,
    assert_resumed_asking_and_applying_once,
    assert_stopped_by_the_same_error,
    loop_matrix,
    model_env,
)
from tests.support import wait_exit  # noqa: E402

# ---------------------------------------------------------------- the parts


@pytest.fixture
def loop_procs(dbos_procs, provider, standin):
    """``python -m durable_agents.dbosflow ...`` on this test's database and provider, its model the stand-in; the
    task's orders seeded at the provider."""
    seed_orders(provider.url, ORDERS)

    def start(*args: str, crash_at: str | None = None, env: dict | None = None):
        return dbos_procs(*args, crash_at=crash_at, env={**model_env(standin), **(env or {})})

    start.db = dbos_procs.db  # type: ignore[attr-defined]
    return start


def read(db, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """DBOS's rows for the run, and its status from them (what ``status --json`` prints), read in process."""
    raw = dbos_status.read(db, run_id)
    return raw, dbos_status.status_of(raw)


def outputs(raw: dict[str, Any]) -> dict[str, Any]:
    """Each recorded step's result, by name: DBOS's record of the run."""
    return {r["function_name"]: r["output"]["result"] for r in raw["steps"] if r["error"] is None}


# ---------------------------------------------------------------- kills at each crash point


# point -> (the step the kill leaves next, the turns asked twice)
CRASHES = {
    "turn:after_answer@1": ("turn-1", {"1"}),
    "tool:issue_refund:after_effect@1": ("turn-2/call-0", set()),
    "dbos:loop:between_calls@1": ("turn-2/call-1", set()),
    "dbos:loop:after_turn@1": ("turn-2", set()),
}


def dbos_cli(k, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m durable_agents.dbosflow ARGS`` on the killed run's database (its environment, ``k.env``)."""
    return subprocess.run([sys.executable, "-m", "durable_agents.dbosflow", *args], cwd=REPO,
                          env={**os.environ, **k.env, "CRASH_AT": "", **(env or {})}, capture_output=True,
                          text=True, timeout=90)


def test_a_kill_at_each_crash_point_resumes_with_each_effect_once(kill_matrix, provider):
    """The loop through the kill matrix (``durable_agents.testing``, the one mechanism a user runs too), one
    killed run per point, each recovered by ``resume RUN_ID``: the matrix judges the end, each effect through
    its lookup and the turns at its stand-in; the hooks read what only DBOS's rows show at the kill."""
    seen: dict[str, tuple[dict[str, Any], dict[str, int], str | None]] = {}

    def at_kill(k) -> None:
        at, _ = CRASHES[k.point]
        before = k.turns()
        # At the kill, DBOS holds a row for every step that returned, and the steps decided are the plan's of
        # those rows: every recorded turn's calls, then the next turn.
        raw, status = read(k.env["DBOSFLOW_DB"], k.run_id)
        results = outputs(raw)
        names = [s["name"] for s in status["steps"]]
        plan = loop.LoopPlan(dbos_loop.loop_inputs(dbos_status.recorded_inputs(raw["workflow"]) or {}),
                             dbos_loop.no_window)
        assert names == plan.names(results), names
        assert status["status"] == "running" and status["current_step"] == at, status
        assert [n for n in names if n in results] == names[:names.index(at)], (names, list(results))
        replayed = None
        if k.point.startswith("tool:issue_refund:after_effect"):
            # The turn that asked for the refund is recorded; the refund was applied and its output never written.
            assert names == ["turn-1", "turn-1/call-0", "turn-2", "turn-2/call-0", "turn-2/call-1", "turn-3"], names
            replayed = loop.tool_key(k.run_id, 2, 0, results["turn-2"]["calls"][0]["id"])
            assert [(e.kind, e.key, e.effects_applied) for e in fetch_effects(provider.url, run_id=k.run_id)] == [
                ("refund", replayed, 1)]
            shown = dbos_cli(k, "status", k.run_id)
            assert shown.returncode == 0, shown.stderr
            assert "turn 2: asked for issue_refund, send_email" in shown.stdout, shown.stdout
            assert f"key {replayed}" in shown.stdout, shown.stdout
        if k.point.startswith("dbos:loop:between_calls"):
            # The refund's output is written; the email was never sent.
            assert results["turn-2/call-0"]["kind"] == "refund" and "turn-2/call-1" not in results
            assert not [e for e in fetch_effects(provider.url, run_id=k.run_id) if e.kind == "email"]
        if k.point.startswith("dbos:loop:after_turn"):
            assert before == {"1": 1}, before  # turn 2 decided by the record, never asked
            # A process of another loop (another application version) leaves the run alone: parked, not resumed.
            parked = dbos_status.status_of(raw, version="agentlab-loop-0+other")
            assert parked["status"] == "parked" and dbos_loop.LOOP_APP_VERSION in (parked["detail"] or ""), parked
            other = dbos_cli(k, "resume", k.run_id, env={dbos_loop.LOOP_VERSION_ENV: "agentlab-loop-0+other"})
            assert other.returncode == 6, other.stdout + other.stderr
            said = other.stdout + other.stderr
            assert f"{dbos_loop.LOOP_VERSION_ENV}={dbos_loop.LOOP_APP_VERSION}" in said, said
            assert "started: run" not in said
        seen[k.run_id] = (results, before, replayed)

    def at_end(k) -> None:
        at, asked_twice = CRASHES[k.point]
        results, before, replayed = seen[k.run_id]
        # Recovery walks the recorded outputs and starts at the first step without one; no recorded step runs.
        ran = started_steps(k.takeover_output)
        assert ran[0] == at and not set(results) & set(ran), ran
        raw, status = read(k.env["DBOSFLOW_DB"], k.run_id)
        assert len([s for s in status["steps"] if "/" not in s["name"]]) == TURNS
        last = status["steps"][-1]
        assert last["result"]["content"].startswith("Done: I went through the 2 orders you named"), last
        assert raw["workflow"].output["answer"] == status["steps"][-1]["result"]["content"]
        # The recorded outputs before the kill are the ones the run ends with: DBOS's record is the truth.
        assert {n: r for n, r in outputs(raw).items() if n in results} == results
        # The stand-in's count: each turn asked once, the one whose answer the kill lost twice; none after it was
        # recorded (the kill's count for the recorded turns is the final one). The provider: each effect once;
        # the refund the kill interrupted was requested twice, replayed once.
        assert_resumed_asking_and_applying_once(
            k.standin_url, provider.url, k.run_id, before=before, recorded={n for n in results if "/" not in n},
            asked_twice=asked_twice, replayed=replayed)

    report = loop_matrix(kill_matrix, provider.url, "dbos", CRASHES, at_kill=at_kill, at_end=at_end)
    assert {r.status for r in report.rows} == {"completed"}


# ---------------------------------------------------------------- the command's edges


def test_the_turn_limit_fails_the_run_naming_it(loop_procs, standin, provider, run_id):
    run = loop_procs("loop", run_id, TASK, "--email", CUSTOMER, "--max-turns", "3")
    assert wait_exit(run, timeout=90) == 1, run.output()
    shown = loop_procs("status", run_id, "--json")
    assert wait_exit(shown, timeout=60) == 1, shown.output()
    status = json.loads(shown.output()[shown.output().index("{"):])
    assert_failed_at_the_turn_limit(status, provider.url, run_id)
    assert status["steps"][-1]["name"] == "turn-3" and status["steps"][-1]["status"] == "failed", status
    refused = loop_procs("resume", run_id)
    assert wait_exit(refused, timeout=60) == 4, refused.output()
    assert "does not run a failed workflow again" in refused.output() and "started: run" not in refused.output()
    assert turns_asked(standin, run_id) == {"1": 1, "2": 1, "3": 1}


def test_the_same_model_error_on_every_attempt_stops_the_turn(loop_procs, run_id):
    """As on Temporal (tests/test_loop_bounds.py): a model that answers every attempt of turn 1 with the same
    error stops the run within ``SAME_ERROR_LIMIT`` attempts, naming the turn, not after DBOS's retries."""
    with ModelStandIn(**SAME_ERROR_FAILS) as model:
        run = loop_procs("loop", run_id, TASK, "--email", CUSTOMER, env=model_env(model.url))
        assert wait_exit(run, timeout=90) == 1, run.output()
        shown = loop_procs("status", run_id, "--json")
        assert wait_exit(shown, timeout=60) == 1, shown.output()
        status = json.loads(shown.output()[shown.output().index("{"):])
        assert_stopped_by_the_same_error(status, turns_asked(model.url, run_id))


@pytest.mark.parametrize("fails", list(OUTAGES_THAT_CLEAR))
def test_an_outage_or_errors_that_differ_are_retried_until_the_model_answers(fails, loop_procs, provider, run_id):
    with ModelStandIn(**OUTAGES_THAT_CLEAR[fails]) as model:
        run = loop_procs("loop", run_id, TASK, "--email", CUSTOMER, env=model_env(model.url))
        assert wait_exit(run, timeout=90) == 0, run.output()
        asked = turns_asked(model.url, run_id)
    assert asked == {"1": SAME_ERROR_LIMIT + 2, **{str(t): 1 for t in range(2, TURNS + 1)}}, asked
    assert_each_effect_once(provider.url, run_id)


@pytest.mark.process
def test_bad_loop_input_is_refused_with_nothing_recorded(tmp_path):
    db = tmp_path / "dbosflow.db"
    env = {**os.environ, "DBOSFLOW_DB": str(db), "MEMORY_DB": str(tmp_path / "memory.db"), "CRASH_AT": ""}
    procs = [subprocess.Popen([sys.executable, "-m", "durable_agents.dbosflow",
             "loop", "r-1", TASK, "--email", CUSTOMER, *extra],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for extra, _ in BAD_LOOP_INPUT]  # side by side: each refusal is a process start, nothing more
    for proc, (extra, expected) in zip(procs, BAD_LOOP_INPUT, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (extra, out, err)
        assert expected in err and "started" not in out, (extra, out, err)
    assert not db.exists()  # refused before DBOS's database was opened: nothing recorded, not even a file


# ---------------------------------------------------------------- in process


def test_the_walk_asks_each_turn_with_the_window_loop_plan_derives_from_the_record():
    """``LoopWalk`` appends each output's message as it passes it; its window of every turn is the one
    ``LoopPlan.request`` derives from all the outputs before that turn, under the run's bounds, also once
    the window has left messages out."""
    orders = {f"C-{1000 + i}": 1000 + i for i in range(5)}  # 2 * 5 + 2 = 12 turns
    inputs = loop.LoopInputs("walk-1", "Refund these broken orders: " + ", ".join(orders) + ".", CUSTOMER,
                             max_turns=20, window_tokens=600, window_messages=6)
    policy = MemoryPolicy(max_tokens=inputs.window_tokens, max_messages=inputs.window_messages)
    plan = loop.LoopPlan(inputs, lambda i, messages: derive_window(policy, messages))
    model = ScriptedModel()
    walk = dbos_loop.LoopWalk(inputs)
    left_out = False
    while (name := walk.next_step()) is not None:
        request = walk.request(name)
        assert request == plan.request(name, walk.results), name
        if isinstance(request, loop.TurnRequest):
            left_out = left_out or len(request.window) < len(plan.messages(walk.results, upto=name))
            answer = model.answer(request.window)
            result: Any = loop.TurnResult(request.turn, answer.content, list(answer.tool_calls), model.name,
                                          len(request.window))
        else:
            assert isinstance(request, loop.ToolRequest)
            args = json.loads(request.call.arguments)
            content = ({"order_id": args["order_id"], "total": orders[args["order_id"]], "refunded": 0}
                       if request.call.name == "lookup_order" else {"done": request.call.name})
            result = loop.ToolResult(request.turn, request.index, request.call.name, "ok", json.dumps(content),
                                     request.idempotency_key)
        walk.record(name, to_jsonable(result))
    assert left_out, "the bounds never left a message out: the test proves less than it says"
    assert len([n for n in walk.results if "/" not in n]) == 12
    assert walk.answer is not None and walk.answer.startswith("Done: I went through the 5 orders you named")


def test_a_changed_loop_is_another_application_version(monkeypatch):
    """The loop's version is derived from its shape: a tool added, or an effect changed, is another version
    (DBOS recovers a run only in a process of its own), and a run recorded by the other loop is refused."""
    before, signature = dbos_loop.loop_version_of(), dbos_loop.loop_signature()
    assert before == dbos_loop.LOOP_APP_VERSION and before.startswith(dbos_loop.LOOP_VERSION_LABEL + "+")
    tools = list(loop.TOOLBOX)
    monkeypatch.setattr(loop, "TOOLBOX", Toolbox([replace(tools[0], effect="refund"), *tools[1:]]))
    assert dbos_loop.loop_version_of() != before
    assert "was started by an agent loop" in (dbos_loop.loop_changed(list(signature)) or "")
    monkeypatch.undo()
    monkeypatch.setattr(loop, "TOOLBOX", Toolbox([*tools, replace(tools[0], name="cancel_order")]))
    assert dbos_loop.loop_version_of() != before
    monkeypatch.undo()
    assert dbos_loop.loop_version_of() == before and dbos_loop.loop_changed(list(signature)) is None


def test_a_dbos_run_is_asked_with_the_instructions_its_inputs_recorded():
    """What the model is told is the run's (``new_loop_inputs`` records it), not the code's at resume."""
    raw = dbos_loop.new_loop_inputs("told-1", "Refund C-1000.", CUSTOMER, "s", RetryRule(), max_turns=5,
                                    window_tokens=2000, window_messages=40)
    assert raw["instructions"] == loop.instructions() and raw["loop"] == list(loop.loop_signature())
    raw["instructions"] = {"prompt": "The run's own prompt.", "tools": loop.tool_specs()[:1]}
    request = dbos_loop.LoopWalk(dbos_loop.loop_inputs(raw)).request("turn-1")
    assert request.window[0] == {"role": "system", "content": "The run's own prompt."}
    assert request.tools == loop.tool_specs()[:1]
