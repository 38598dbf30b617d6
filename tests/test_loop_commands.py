"""The agent loop's commands and driver, as a user and the lab's tools meet them, with real processes: the
session's dev server, a provider process (the judge of effects), the model stand-in as its own process (it
counts every turn asked: the witness that a recorded turn is never asked again) and worker or ``python -m
durable_agents.runrecord`` processes, SIGKILLed at a crash point.

- ``starter.py loop``: starts a loop run (seeding the orders its task names), attaches to it when started
  again, follows it turn by turn to its end; ``status`` (text and ``--json``, the shape docs/commands.md
  shows) shows every turn, each call's key and status, the answer and the chain's Temporal runs; the
  Temporal UI's details say the turn the run is at; ``settle`` of the completed run: nothing to do;
- bad input: exit 2 with what to give, and nothing started;
- the driver interface (``lab.engines``: ``start_loop``, ``resume``, ``loop_status``) on the run record and
  on Temporal: killed right after a refund, resumed, read back in one shape, the same on both engines;
- ``make loop-demo`` (``python -m lab.loop_demo``): its PASS lines, exit 0, nothing left running.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata

from durable_agents.flowclient.loop import read_chain, start_loop
from durable_agents.flowclient.runs import start_run
from durable_agents.providerclient import fetch_effects, seed_orders
from durable_agents.steps.loop import MIN_WINDOW_TOKENS
from durable_agents.testing.standin import start_model_standin, turns_asked
from lab.engines import InMemoryDriver, LoopStatus, RunRecordDriver, TemporalDriver, started_steps
from lab.processes import REPO, wait_until
from tests.loop_support import model_env
from tests.support import EMAIL, TASK

POINT = "tool:issue_refund:after_effect"
TWO_ORDERS = {"A-1001": 2500, "A-1002": 4000}
TWO_TASK = "Order A-1001 arrived broken and so did A-1002: please refund both."
ONE_TASK = "Order C-3001 arrived broken: please refund it."


def effect_kinds(provider_url: str, run_id: str) -> Counter[str]:
    """Effects applied for the run, by kind; each key's effect applied at most once, or the test fails here."""
    effects = fetch_effects(provider_url, run_id=run_id)
    assert all(e.effects_applied == 1 for e in effects), effects
    return Counter(e.kind for e in effects)


def starter_env(dev_server, provider_url: str, task_queue: str) -> dict[str, str]:
    return {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue,
            "PROVIDER_URL": provider_url, "PYTHONUNBUFFERED": "1"}


def starter(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "starter.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


async def ui_details(client, run_id: str) -> str:
    """What the Temporal UI shows as the run's current details (``workflow.set_current_details``)."""
    meta = await client.get_workflow_handle(run_id).query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


# ---------------------------------------------------------------- starter.py loop, status


async def test_starter_loop_starts_attaches_and_status_shows_every_turn(client, dev_server, workers, provider,
                                                                        run_id, task_queue):
    # A stand-in of this test's own, slow enough to read the UI's details while a turn is asked, and to start
    # the starter again before the run's last turn ends: 2.5 s a turn (at 1 s, a loaded machine's interpreter
    # start-up outlasted turns 3 and 4, and the run had completed before the second starter attached).
    slow, slow_url = start_model_standin(delay=2.5)
    try:
        workers(extra_env=model_env(slow_url))
        env = starter_env(dev_server, provider.url, task_queue)
        first = starter(env, "loop", run_id, ONE_TASK, "--email", EMAIL, "--orders", "C-3001=1500", "--no-wait")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "the provider keeps order(s) C-3001 (1500 cents)" in first.stdout
        assert f"started loop run {run_id} on task queue {task_queue!r}: at most 20 turns" in first.stdout
        assert f"/workflows/{run_id}" in first.stdout and first.stderr == ""

        # The UI's details say the turn the run is at: turn 3 is being asked (counted on arrival, answered 2.5 s on).
        await wait_until(lambda: "3" in turns_asked(slow_url, run_id), 60, "the stand-in to be asked turn 3",
                         interval=0.05)
        details = await ui_details(client, run_id)
        assert details.startswith("turn 3 of at most 20 (run 1 of the chain): running"), details
        assert "turn-3: running, attempt 1" in details, details

        # Started again: attached, never a second run; it follows the run to its end, a line per change.
        again = starter(env, "loop", run_id, ONE_TASK, "--email", EMAIL, "--orders", "C-3001=1500")
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"run {run_id} already exists (running); attached to it" in again.stderr
        assert "started loop run" not in again.stdout
        assert re.search(r"turn-4: completed \(attempt 1\): the final answer \(no tool\)", again.stdout), again.stdout
        assert f"loop run {run_id}: completed, turn 4 of at most 20" in again.stdout
        assert "answer: Done: I went through the 1 order you named and recorded ticket tkt_" in again.stdout
        assert turns_asked(slow_url, run_id) == {"1": 1, "2": 1, "3": 1, "4": 1}  # attaching asked nothing again
    finally:
        slow.kill()
    assert effect_kinds(provider.url, run_id) == {"refund": 1, "email": 1, "ticket": 1}
    assert (await ui_details(client, run_id)).startswith("turn 4 of at most 20 (run 1 of the chain): completed")

    description = await client.get_workflow_handle(run_id).describe()
    text = starter(env, "status", run_id)
    assert text.returncode == 0, text.stdout + text.stderr
    out = text.stdout
    for line in (f"loop run {run_id}: completed, turn 4 of at most 20",
                 "  turn 1: completed: asked for lookup_order",
                 '    call 0 lookup_order {"order_id": "C-3001"}',
                 "      no key: no effect (read-only)",
                 "  turn 2: completed: asked for issue_refund, send_email",
                 '    call 0 issue_refund {"order_id": "C-3001", "amount": 1500}',
                 "  turn 3: completed: asked for create_ticket",
                 "  turn 4: completed: the final answer (no tool)",
                 "  4 turn(s), 4 tool call(s), 3 effect(s), 0 refused",
                 f"    1. {description.run_id}"):
        assert line + "\n" in out, (line, out)
    assert re.search(r"      completed: ok \{\"refund_id\": \"rfd_\w+\", \"order_id\": \"C-3001\", \"amount\": 1500\}",
                     out), out

    # --live asks the workflow itself (its progress query: a worker answers it); watch of an ended run: its end.
    live = starter(env, "status", run_id, "--live")
    assert live.returncode == 0, live.stdout + live.stderr
    assert f"loop run {run_id}: completed, turn 4 of at most 20" in live.stdout
    assert "run 1 of the chain (the workflow's own answer)" in live.stdout and "key agentlab/" in live.stdout
    watched = starter(env, "watch", run_id)
    assert watched.returncode == 0 and "turn-4: completed (attempt 1): the final answer" in watched.stdout, watched

    as_json = starter(env, "status", run_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    page = (REPO / "docs" / "commands.md").read_text()
    shown = json.loads(re.search(r"<!-- loop-status-json -->\n```json\n(.*?)\n```", page, re.S).group(1))
    assert list(status) == list(shown), "docs/commands.md shows another shape than status --json prints"
    assert list(status["turns"][0]) == list(shown["turns"][0])
    assert list(status["turns"][1]["calls"][0]) == list(shown["turns"][0]["calls"][0])
    assert (status["status"], status["runs"], status["counts"]) == (
        "completed", [description.run_id], {"turns": 4, "tool_calls": 4, "effects": 3, "refused": 0})
    assert status["answer"].startswith("Done: I went through the 1 order you named")
    refund = status["turns"][1]["calls"][0]
    recorded_turn = status["turns"][1]
    assert refund["name"] == "issue_refund" and refund["outcome"] == "ok" and refund["effect_id"].startswith("rfd_")
    assert refund["key"].startswith(f"agentlab/{run_id}/turn-2/call-0-"), refund
    assert [c["name"] for c in recorded_turn["calls"]] == ["issue_refund", "send_email"]
    assert status["turns"][0]["calls"][0]["key"] is None  # the lookup applies nothing
    # The keys the status shows are the keys the provider holds the effects under.
    assert {c["key"] for t in status["turns"] for c in t["calls"] if c["key"]} == {
        e.key for e in fetch_effects(provider.url, run_id=run_id)}

    # settle of the completed run: each key applied, and nothing to do: no retry (which refuses it), none in doubt.
    settled = starter(env, "settle", run_id)
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert settled.stdout.count(": applied at ") == 3 and f"run {run_id} completed: nothing to do" in settled.stdout
    assert "starter.py retry" not in settled.stdout and "in_doubt" not in settled.stdout, settled.stdout
    report = json.loads(starter(env, "settle", run_id, "--json").stdout)
    assert (report["run_status"], report["in_doubt"]) == ("completed", []), report
    assert {e["state"] for e in report["steps"]} == {"applied"} and "nothing to do" in report["advice"], report
    refused = starter(env, "retry", run_id)  # what settle no longer suggests
    assert refused.returncode == 2 and "a completed run cannot be retried" in refused.stderr, refused


async def test_bad_input_is_refused_with_exit_2_and_starts_nothing(client, dev_server, provider, run_id, task_queue):
    env = starter_env(dev_server, provider.url, task_queue)
    seed_orders(provider.url, {"A-1001": 2500})
    # A run of the flow and a loop run, both left with no worker (terminated at the end).
    flow_id, loop_id = f"{run_id}-flow", f"{run_id}-loop"
    await start_run(client, flow_id, TASK, EMAIL, queue=task_queue)
    await start_loop(client, loop_id, TWO_TASK, EMAIL, task_queue=task_queue)
    loop_args = ["loop", run_id, TWO_TASK, "--email", EMAIL]
    cases = [
        (loop_args + ["--max-turns", "abc"], "max turns must be a whole number from 1 to 10000, got 'abc'"),
        (loop_args + ["--max-turns", "0"], "max turns must be a whole number from 1 to 10000, got 0"),
        (loop_args + ["--window-tokens", "5"], f"window tokens must be a whole number from {MIN_WINDOW_TOKENS}"),
        (loop_args + ["--window-tokens", str(MIN_WINDOW_TOKENS - 1)],
         f"give at least {MIN_WINDOW_TOKENS} window tokens"),
        (loop_args + ["--window-messages", "many"], "window messages must be a whole number from 4"),
        (loop_args + ["--history-bound", "5"], "history bound must be a whole number of events from 10 to 20000"),
        (loop_args + ["--orders", "A-1001"], "give ORDER=CENTS"),
        (loop_args + ["--orders", "A-1001=0"], "give ORDER=CENTS"),
        (loop_args + ["--orders", "A-1001=999"], "already kept with a total of 2500 cents"),
        (["loop", run_id, TWO_TASK, "--email", "not-an-address"], "malformed"),
        (["loop", "bad id", TWO_TASK, "--email", EMAIL], "run id"),
        (["loop", run_id, "", "--email", EMAIL], "task is empty"),
        (["loop", run_id, TWO_TASK], "the refund agent needs --email ADDR"),
        (["loop", run_id, TWO_TASK, "--agent", "no_such_module:AGENT"], "cannot import 'no_such_module'"),
        (["loop", run_id, TWO_TASK, "--agent", "tests.agents.notebook:NOTEBOOK"], "needs the run parameter owner"),
        (["loop", run_id, TWO_TASK, "--agent", "tests.agents.notebook:NOTEBOOK", "--param", "owner=a@b.c",
          "--email", EMAIL], "--email is the refund agent's"),
        (["loop", flow_id, TWO_TASK, "--email", EMAIL], "is a run of AgentFlow, not of the agent loop"),
        (["start", loop_id, TASK, "--email", EMAIL], "is a run of the agent loop, not of the flow"),
    ]
    down = {**env, "PROVIDER_URL": "http://127.0.0.1:9"}  # nothing listens on the discard port
    procs = [subprocess.Popen([sys.executable, "starter.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args, _ in cases]
    procs.append(subprocess.Popen([sys.executable, "starter.py", *loop_args, "--orders", "A-1001=2500"], cwd=REPO,
                                  env=down, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    cases.append((loop_args, "unreachable"))
    try:
        answers = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for (args, words), proc, (out, err) in zip(cases, procs, answers, strict=True):
        assert proc.returncode == 2, (args, out, err)
        assert words in err and "Traceback" not in err, (args, err)
    # With --json the refusal is JSON on stdout, as start's.
    refused = starter(env, *loop_args, "--max-turns", "x", "--json")
    assert refused.returncode == 2 and json.loads(refused.stdout)["exit_code"] == 2, refused
    # Nothing was started under the refused ids.
    missing = starter(env, "status", run_id)
    assert missing.returncode == 2 and "no run with id" in missing.stderr, missing
    # status of a loop run with no worker: read from history, no turn recorded yet.
    waiting = starter(env, "status", loop_id, "--json")
    assert waiting.returncode == 0 and json.loads(waiting.stdout)["status"] == "running", waiting
    for run in (flow_id, loop_id):
        await client.get_workflow_handle(run).terminate("test over")


# ---------------------------------------------------------------- the driver interface


# Each turn, its calls: (turn, status, attempts, final, [(index, name, status, attempts, outcome, keyed)]).
AFTER_THE_RESUME = [
    (1, "completed", 1, False, [(0, "lookup_order", "completed", 1, "ok", False)]),
    (2, "completed", 1, False, [(0, "issue_refund", "completed", 2, "ok", True),
                                (1, "send_email", "completed", 1, "ok", True)]),
    (3, "completed", 1, False, [(0, "lookup_order", "completed", 1, "ok", False)]),
    (4, "completed", 1, False, [(0, "issue_refund", "completed", 1, "ok", True),
                                (1, "send_email", "completed", 1, "ok", True)]),
    (5, "completed", 1, False, [(0, "create_ticket", "completed", 1, "ok", True)]),
    (6, "completed", 1, True, []),
]


def outline(status: LoopStatus) -> list[tuple[Any, ...]]:
    return [(t["turn"], t["status"], t["attempts"], t["final"],
             [(c["index"], c["name"], c["status"], c["attempts"], c["outcome"], c["key"] is not None)
              for c in t["calls"]]) for t in status["turns"]]


@pytest.mark.parametrize("engine", ["runrecord", "temporal"])
async def test_the_driver_kills_resumes_and_reads_a_loop_run_in_one_shape(engine, dev_server, provider, standin,
                                                                           run_id, task_queue, tmp_path):
    seed_orders(provider.url, TWO_ORDERS)
    env = {"PROVIDER_URL": provider.url, "RUNRECORD_DB": str(tmp_path / "runrecord.db"),
           "MEMORY_DB": str(tmp_path / "memory.db"), **model_env(standin)}
    driver = (RunRecordDriver(env, timeout=90) if engine == "runrecord"
              else TemporalDriver(dev_server, env, queue=task_queue, timeout=90))
    with driver:
        assert await driver.loop_status(run_id) is None
        first = await driver.start_loop(run_id, TWO_TASK, EMAIL, crash_at=POINT, max_turns=10)
        await driver.killed(first)
        assert started_steps(first) == ["turn-1", "turn-1/call-0", "turn-2", "turn-2/call-0"]

        # At the kill: the refund applied, its call's result not recorded; the turn that asked for it recorded.
        at_kill = await driver.loop_status(run_id)
        assert at_kill is not None and at_kill["status"] == "running", at_kill
        assert effect_kinds(provider.url, run_id) == {"refund": 1}
        turn2 = at_kill["turns"][1]
        assert (turn2["turn"], turn2["status"], turn2["final"]) == (2, "completed", False), turn2
        refund, email = turn2["calls"]
        assert refund["status"] in ("running", "waiting") and refund["outcome"] is None, refund
        assert email["status"] == "pending" and email["outcome"] is None, email
        assert (at_kill["answer"], at_kill["error"]) == (None, None)

        settled = await driver.resume(run_id)
        assert settled.completed, settled.proc.last_lines()
        assert settled.status is not None and settled.status["status"] == "completed"
        assert settled.status["steps"][0]["name"] == "turn-1" and settled.status["current_step"] is None
        assert started_steps(settled.proc)[0] == "turn-2/call-0"
        assert not {"turn-1", "turn-1/call-0", "turn-2"} & set(started_steps(settled.proc))

        final = await driver.loop_status(run_id)
    assert final is not None
    assert list(final) == ["run_id", "status", "turns", "answer", "error"]
    assert list(final["turns"][0]) == ["turn", "status", "attempts", "final", "calls"]
    assert list(final["turns"][0]["calls"][0]) == ["index", "name", "key", "status", "attempts", "outcome",
                                                   "effect_id"]
    assert (final["run_id"], final["status"], final["error"]) == (run_id, "completed", None)
    assert final["answer"] is not None and final["answer"].startswith("Done: I went through the 2 orders you named")
    # The same outline on both engines: one shape, one story.
    assert outline(final) == AFTER_THE_RESUME
    refund = final["turns"][1]["calls"][0]
    effects = {e.key: e for e in fetch_effects(provider.url, run_id=run_id)}
    # Sent once, applied once: its retry asked the provider by its key (the tool's lookup) and took the answer.
    assert refund["key"] in effects and effects[refund["key"]].requests == 1, effects
    assert refund["effect_id"].startswith("rfd_")
    assert effect_kinds(provider.url, run_id) == {"refund": 2, "email": 2, "ticket": 1}
    assert turns_asked(standin, run_id) == {str(n): 1 for n in range(1, 7)}  # no recorded turn asked again


async def test_an_engine_without_the_loop_says_so():
    with InMemoryDriver() as before:
        with pytest.raises(NotImplementedError, match=r"the in_memory engine's driver does not run the agent loop"):
            await before.start_loop("r-1", TWO_TASK, EMAIL)
        with pytest.raises(NotImplementedError, match=r"the in_memory engine's driver does not read the agent loop"):
            await before.loop_status("r-1")


async def test_the_temporal_driver_reads_a_loop_run_that_continued_as_new(client, dev_server, provider, standin,
                                                                        run_id, task_queue):
    """Past its history bound a run continues as new: the driver follows the chain (one run id, every key
    the same) and reads every turn of it."""
    seed_orders(provider.url, TWO_ORDERS)
    with TemporalDriver(dev_server, {"PROVIDER_URL": provider.url, **model_env(standin)}, queue=task_queue,
                        timeout=90) as temporal:
        worker = await temporal.start_worker()
        assert await temporal.submit_loop(run_id, TWO_TASK, EMAIL, history_bound=20)
        settled = await temporal.settle(run_id, worker)
        final = await temporal.loop_status(run_id)
        assert not await temporal.submit_loop(run_id, TWO_TASK, EMAIL)  # one run per run id, ever
    assert settled.completed and final is not None
    assert [t["turn"] for t in final["turns"]] == [1, 2, 3, 4, 5, 6] and final["turns"][-1]["final"]
    chain = await read_chain(client, run_id)
    assert len(chain.runs) >= 2, [r.history_length for r in chain.runs]


# ---------------------------------------------------------------- make loop-demo


@pytest.mark.process
def test_make_loop_demo_passes_its_checks_and_leaves_nothing_running(tmp_path):
    done = subprocess.run([sys.executable, "-m", "lab.loop_demo", "--port", "0", "--state-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    passed = re.findall(r"^\s+PASS (.*)$", out, re.M)
    assert len(passed) == 8 and "FAIL" not in out, out
    for engine, second in (("Temporal", "worker 2"), ("run record", "process 2")):
        assert f"{engine}: the kill landed between the refund and its record" in passed[0 if engine == "Temporal"
                                                                                       else 4]
        assert f"{engine}: each effect applied once at the provider (2 refunds, 2 emails, 1 ticket)" in passed
        assert f"{engine}: no recorded turn asked again (the stand-in was asked each of the 6 turns once)" in passed
        assert f"{engine}: the run completed in {second}, which ran no recorded step again" in passed
    assert "died by SIGKILL before the call's result was recorded" in out
    assert "was sent once under its key and applied once" in out
    # Everything the demo started is gone: the dev server (on the state dir), the provider and the stand-in.
    pids = [int(p) for p in re.findall(r"(?:provider|model stand-in) at \S+, pid (\d+)", out)]
    assert len(pids) == 2, out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout == "", leftovers.stdout
