"""The agent loop on Temporal (``durable_agents.workflows.agent_loop``), proved with real processes: the session's dev
server, a provider process (the judge of effects, with the orders the task names seeded), the model
stand-in as its own process (``durable_agents.testing.standin``: the scripted model behind the OpenAI-compatible API,
counting every request by run and turn: the witness that a recorded turn is never asked again), and
worker processes SIGKILLed at a crash point (``CRASH_AT``) and replaced by one without it.

The task names two orders with something left to refund: six turns (lookup; refund and email in one
turn; lookup; refund and email; ticket; the answer). For each crash point of the loop (docs/crashpoints.md)
the run completes; the provider applied each effect once (2 refunds, 2 emails, 1 ticket); the stand-in
was asked each turn once, but the turn whose answer died with its worker (``turn:after_answer``), asked
twice. Then, in process with a model written for the test: a bad tool call is answered with a refused
result and nothing applied; the turn limit ends the run FAILED naming it. Last, thirty turns (14 orders)
through continue-as-new: the window each run carried, and every prompt any run asked with, equal the window
derived from every recorded turn of the chain, within the memory bound.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import Replayer, Worker

from durable_agents.activities.loop import LoopActivities
from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.loop import LoopChain, loop_progress, loop_status, read_chain, start_loop
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.memory import Message, approx_tokens
from durable_agents.providerclient import ProviderClient, fetch_effects, seed_orders
from durable_agents.steps.errors import TransientError
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.loop import AskedCall, ModelAnswer
from durable_agents.steps.retry import RetryRule
from durable_agents.testing.processes import run_in_thread
from durable_agents.testing.standin import turns_asked
from durable_agents.workflows.agent_loop import AgentLoop
from durable_agents.workflows.loop_state import KEPT_TURNS
from tests.loop_support import loop_matrix, model_env
from tests.support import EMAIL

TWO_ORDERS = {"A-1001": 2500, "A-1002": 4000}
TASK = "Order A-1001 arrived broken and so did A-1002: please refund both."
SIX_TURNS = {str(n): 1 for n in range(1, 7)}

POINTS = [
    "turn:after_answer@1",
    "tool:issue_refund:after_effect@1",
    "temporal:loop:between_calls@1",
    "temporal:loop:after_turn@1",
    "temporal:loop:continue_as_new@1",
]
SMALL_BOUND = 20
"""Events: a run continues as new after its first turn with a call past this (after turn 2 here)."""


def started(proc_output: str, run_id: str, step: str) -> int:
    """Executions of a loop step a process began (its started lines: ``step turn-2/call-1 started: ...``)."""
    return proc_output.count(f"step {step} started: run {run_id} attempt")


def effects_by_kind(provider_url: str, run_id: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for effect in fetch_effects(provider_url, run_id=run_id):
        out.setdefault(effect.kind, []).append(effect)
    return out


async def result_of(client: Client, run_id: str, timeout: float = 120) -> dict[str, Any]:
    """The run's result once it completes (following its continue-as-new chain); its error if it fails."""
    return await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=timeout)


def check_chain_windows(chain: LoopChain, window_tokens: int) -> int:
    """Every prompt of every run equals the window derived from every recorded turn of the chain before
    it, within the memory bound; each carried window equals the derived one. Returns the prompts checked."""
    checked = 0
    for run in chain.runs:
        for turn, prompt in run.prompts.items():
            assert prompt == chain.window(turn), (run.temporal_run_id, turn)
            tokens = sum(approx_tokens(Message.from_chat(m, id=f"m{i}")) for i, m in enumerate(prompt))
            assert tokens <= window_tokens, (turn, tokens)
            checked += 1
    for next_turn, carried in chain.carried():
        assert carried == chain.window(next_turn), next_turn
    return checked


# ---------------------------------------------------------------- a worker killed at each point


def test_a_worker_killed_at_each_point_is_replaced_and_each_effect_applies_once(kill_matrix, dev_server, provider):
    """The loop through the kill matrix (``durable_agents.testing``, the one mechanism a user runs too): a worker
    armed with each point on a queue of the run's own, SIGKILLed there, a standby worker on the same queue; the
    matrix judges the end, each effect through its lookup and the turns at its stand-in; the hooks read the
    history at the kill and what the standby did. Every run continues as new after turn 2 (``SMALL_BOUND``)."""

    def at_kill(k) -> None:
        before = k.status()  # from history: no worker needed
        assert before["status"] == "running", before
        at_kill = effects_by_kind(provider.url, k.run_id)
        name = k.point.partition("@")[0]
        if name == "turn:after_answer":
            assert k.turns() == {"1": 1} and before["turns"][0]["status"] != "completed", before
        elif name == "tool:issue_refund:after_effect":
            # Applied at the provider, not recorded: the call's attempt died with its worker.
            assert len(at_kill.get("refund", [])) == 1 and not at_kill.get("email"), at_kill
            assert before["turns"][1]["calls"][0]["status"] != "completed", before["turns"][1]
        elif name == "temporal:loop:between_calls":
            # The refund of turn 2 is recorded; the email of the same turn is not even scheduled.
            turn2 = before["turns"][1]
            assert [c["status"] for c in turn2["calls"]] == ["completed", "pending"], turn2
            assert len(at_kill.get("refund", [])) == 1 and not at_kill.get("email"), at_kill
        elif name == "temporal:loop:after_turn":
            assert [t["status"] for t in before["turns"]] == ["completed"], before["turns"]
            assert before["turns"][0]["calls"][0]["status"] == "completed"
            assert k.turns() == {"1": 1}
        else:
            assert len(before["runs"]) == 1 and before["turns"][-1]["status"] == "completed", before

    def at_end(k) -> None:
        status = k.status()
        assert status["answer"].startswith("Done: I went through the 2 orders you named"), status["answer"]
        assert len(status["turns"]) == 6 and status["counts"] == {"turns": 6, "tool_calls": 7, "effects": 5,
                                                                   "refused": 0}, status["counts"]
        # The judge: each effect applied once, by kind, for this run; each key sent once: the refund whose answer
        # died with its worker too, its retry having asked the provider by its key (the tool's lookup) and taken
        # the applied refund's answer.
        effects = effects_by_kind(provider.url, k.run_id)
        assert {kind: len(found) for kind, found in effects.items()} == {"refund": 2, "email": 2, "ticket": 1}
        assert all(e.effects_applied == 1 for found in effects.values() for e in found), effects
        requests = {e.key: e.requests for found in effects.values() for e in found}
        assert set(requests.values()) == {1}, requests
        # The witness: every turn asked once; a turn recorded before the kill was never asked again.
        assert k.turns() == {**SIX_TURNS, **({"1": 2} if k.point == "turn:after_answer@1" else {})}, k.turns()
        name = k.point.partition("@")[0]
        if name == "temporal:loop:between_calls":
            assert started(k.takeover_output, k.run_id, "turn-2/call-0") == 0, k.takeover_output
            assert started(k.takeover_output, k.run_id, "turn-2/call-1") == 1, k.takeover_output
        if name in ("turn:after_answer", "tool:issue_refund:after_effect"):
            crashed = status["turns"][0] if name == "turn:after_answer" else status["turns"][1]["calls"][0]
            assert (crashed["attempts"], crashed["crashes"]) == (2, 1), crashed

        async def chain() -> LoopChain:
            client = await connect({"TEMPORAL_ADDRESS": dev_server.address, "TEMPORAL_NAMESPACE": "default"})
            return await read_chain(client, k.run_id)

        found = run_in_thread(chain())
        assert len(found.runs) >= 2, [r.history_length for r in found.runs]  # continued as new after turn 2
        check_chain_windows(found, found.first_input["window_tokens"])

    report = loop_matrix(kill_matrix, provider.url, "temporal", POINTS, at_kill=at_kill, at_end=at_end,
                         temporal_address=dev_server.address, temporal_start={"history_bound": SMALL_BOUND})
    assert {r.status for r in report.rows} == {"completed"}


# ---------------------------------------------------------------- bad model output, the turn limit (in process)


class OneBadTurn:
    """Asks, in its first turn, for a tool that does not exist and a refund over the order's total; then,
    seeing their results, answers. A model's choices are untrusted: both must come back refused."""

    name = "one-bad-turn"

    async def turn(self, messages: list[dict], tools: list[dict], *, labels: Any = None) -> ModelAnswer:
        if messages[-1]["role"] == "tool":
            return ModelAnswer("Both were refused; I did nothing.")
        return ModelAnswer("", (AskedCall("c1", "wire_money", json.dumps({"to": "me"})),
                                AskedCall("c2", "issue_refund", json.dumps({"order_id": "B-2001", "amount": 999_999}))))


class AlwaysMore:
    """Never done: every turn asks for another lookup (of an order nobody seeded)."""

    name = "always-more"

    async def turn(self, messages: list[dict], tools: list[dict], *, labels: Any = None) -> ModelAnswer:
        return ModelAnswer("", (AskedCall(f"c{len(messages)}", "lookup_order", json.dumps({"order_id": "Z-999"})),))


class FlakyAtFirst:
    """Unavailable twice (a 503), then done: no tool needed."""

    name = "flaky-at-first"

    def __init__(self) -> None:
        self.asked = 0

    async def turn(self, messages: list[dict], tools: list[dict], *, labels: Any = None) -> ModelAnswer:
        self.asked += 1
        if self.asked <= 2:
            raise TransientError("503 the model is overloaded (test)")
        return ModelAnswer("Nothing to do.")


class Stuck:
    """Never answers: the turn's attempt runs until something stops it."""

    name = "stuck"

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def turn(self, messages: list[dict], tools: list[dict], *, labels: Any = None) -> ModelAnswer:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@asynccontextmanager
async def loop_worker(client: Client, provider_url: str, model: Any) -> AsyncIterator[str]:
    """An in-process worker of the loop (the shipped options: sandbox, no cache) whose model is ``model``;
    its task queue. Stopping it cancels any attempt still running."""
    queue = f"loop-{uuid.uuid4().hex[:10]}"
    api = ProviderClient(provider_url)
    deps = StepDeps(provider=api, llm=None, agent=model)  # type: ignore[arg-type]  # the loop needs no drafter
    try:
        async with Worker(client, task_queue=queue, workflows=[AgentLoop], activities=LoopActivities(deps).all(),
                          **worker_options(cache=0)):
            yield queue
    finally:
        await api.aclose()


async def run_in_process(client: Client, provider_url: str, model: Any, run_id: str, **start: Any) -> Any:
    """A loop run on an in-process worker whose model is ``model``: its result, or its failure's cause."""
    async with loop_worker(client, provider_url, model) as queue:
        created, _ = await start_loop(client, run_id, TASK, EMAIL, task_queue=queue,
                                      rule=RetryRule(budget_seconds=5, initial_interval=0.1, jitter=0.0), **start)
        assert created
        try:
            return await result_of(client, run_id, timeout=60)
        except WorkflowFailureError as failed:
            return failed.cause


async def test_a_bad_tool_call_is_answered_refused_and_nothing_is_applied(client, provider, run_id):
    seed_orders(provider.url, {"B-2001": 2500})
    result = await run_in_process(client, provider.url, OneBadTurn(), run_id)
    assert result["status"] == "completed" and result["answer"] == "Both were refused; I did nothing.", result
    calls = result["turns"][0]["calls"]
    assert [(c["name"], c["outcome"]) for c in calls] == [("wire_money", "refused"), ("issue_refund", "refused")]
    assert "unknown tool 'wire_money'" in calls[0]["note"], calls[0]
    assert "refused" in calls[1]["note"] and calls[1]["effect_id"] is None, calls[1]
    assert result["counts"] == {"turns": 2, "tool_calls": 2, "effects": 0, "refused": 2}, result["counts"]
    assert sum(e.effects_applied for e in fetch_effects(provider.url, run_id=run_id)) == 0


async def test_the_turn_limit_ends_the_run_failed_naming_it(client, provider, run_id):
    error = await run_in_process(client, provider.url, AlwaysMore(), run_id, max_turns=3)
    assert isinstance(error, ApplicationError), error
    assert "step turn-3 failed" in error.message and "turn limit of 3 reached" in error.message, error.message
    status = await loop_status(client, run_id)
    assert status["status"] == "failed" and "turn limit of 3" in status["error"], status
    assert [t["status"] for t in status["turns"]] == ["completed", "completed", "failed"], status["turns"]
    # The limit's turn ran none of the calls it asked for.
    assert status["turns"][2]["calls"] == [] and status["counts"]["tool_calls"] == 2, status


# ---------------------------------------------------------------- thirty turns through continue-as-new


async def test_thirty_turns_continue_as_new_and_carry_the_window_memory_derives(
        client, workers, provider, run_id, task_queue, standin):
    orders = {f"A-{1001 + i}": 1000 + 100 * i for i in range(14)}
    seed_orders(provider.url, orders)
    workers(extra_env=model_env(standin))
    task = "Please refund every one of my orders: " + ", ".join(orders) + "."
    window_tokens = 1500
    created, _ = await start_loop(client, run_id, task, EMAIL, task_queue=task_queue, max_turns=30,
                                  window_tokens=window_tokens, history_bound=150)
    assert created
    result = await result_of(client, run_id)
    assert result["status"] == "completed", result
    assert result["answer"].startswith("Done: I went through the 14 orders you named"), result

    chain = await read_chain(client, run_id)
    assert len(chain.runs) >= 3, f"continued as new {len(chain.runs) - 1} time(s), not at least twice"
    for run in chain.runs:  # what a worker that lost the run from its cache does: replay each history
        history = await client.get_workflow_handle(run_id, run_id=run.temporal_run_id).fetch_history()
        await Replayer(workflows=[AgentLoop]).replay_workflow(history)
    assert len(chain.turns()) == 30
    assert check_chain_windows(chain, window_tokens) == 30
    # The bound held: the prompt of the last turn is not the whole conversation (memory evicted).
    assert len(chain.window(30)) < len(chain.messages(30))

    effects = effects_by_kind(provider.url, run_id)
    assert {kind: len(found) for kind, found in effects.items()} == {"refund": 14, "email": 14, "ticket": 1}
    assert all(e.effects_applied == 1 and e.requests == 1 for found in effects.values() for e in found)
    assert turns_asked(standin, run_id) == {str(n): 1 for n in range(1, 31)}

    # Status across the chain: every turn from the histories; the workflow's own, the newest KEPT_TURNS
    # carried plus the last run's, and the same counts.
    status = await loop_status(client, run_id)
    assert [t["turn"] for t in status["turns"]] == list(range(1, 31))
    assert status["runs"] == [r.temporal_run_id for r in chain.runs]
    assert {t["run"] for t in status["turns"]} == set(range(len(chain.runs)))
    counts = {"turns": 30, "tool_calls": 43, "effects": 29, "refused": 0}
    assert status["counts"] == result["counts"] == counts, (status["counts"], result["counts"])
    assert result["run_in_chain"] == len(chain.runs)
    assert result["earlier_turns"] + len(result["turns"]) == 30 and len(result["turns"]) <= KEPT_TURNS + 30
    assert [t["turn"] for t in result["turns"]] == list(range(31 - len(result["turns"]), 31))
    refund_keys = [c["key"] for t in status["turns"] for c in t["calls"] if c["name"] == "issue_refund"]
    assert refund_keys == [e.key for e in sorted(effects["refund"], key=lambda e: e.first_seen)]
    progress = await loop_progress(client, run_id)
    assert progress["status"] == "completed" and progress["counts"] == counts
    assert progress["window_tokens"] <= window_tokens
    assert Counter(c["status"] for t in status["turns"] for c in t["calls"]) == {"completed": 43}
    # What the Temporal UI shows of the run (workflow.set_current_details): its state, counts, newest turns.
    meta = await client.get_workflow_handle(run_id).query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert meta.current_details.startswith(f"turn 30 of at most 30 (run {len(chain.runs)} of the chain): completed")
    assert "30 turn(s), 43 tool call(s), 29 effect(s), 0 refused" in meta.current_details, meta.current_details


async def test_a_reused_run_id_is_refused_and_attaches(client, provider, run_id):
    """One run per run id, ever (its keys derive from it): a second start attaches to the closed run."""
    result = await run_in_process(client, provider.url, OneBadTurn(), run_id)
    assert result["status"] == "completed"
    created, existing = await start_loop(client, run_id, TASK, EMAIL, task_queue="unused")
    assert not created and existing is not None, existing
    assert existing["status"] == "completed" and existing["answer"] == result["answer"], existing


async def test_a_transient_model_error_is_retried_on_a_durable_timer(client, provider, run_id):
    model = FlakyAtFirst()
    result = await run_in_process(client, provider.url, model, run_id)
    assert result["status"] == "completed" and result["answer"] == "Nothing to do.", result
    turn = result["turns"][0]
    assert (turn["attempts"], turn["crashes"], turn["last_error"]) == (3, 0, "503 the model is overloaded (test)")
    history = await client.get_workflow_handle(run_id).fetch_history()
    timers = [ev.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
              for ev in history.events if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert timers == [0.1, 0.2], timers  # durable_agents.steps.retry's backoff, no jitter: 0.1 s doubling


async def test_a_cancel_ends_the_run_during_a_turn(client, provider, run_id):
    model = Stuck()
    async with loop_worker(client, provider.url, model) as queue:
        await start_loop(client, run_id, TASK, EMAIL, task_queue=queue, rule=RetryRule())
        await asyncio.wait_for(model.asked.wait(), timeout=30)
        progress = await loop_progress(client, run_id)
        assert progress["status"] == "running" and progress["turns"][0]["status"] == "running", progress
        await client.get_workflow_handle(run_id).cancel()
        with pytest.raises(WorkflowFailureError) as failed:
            await result_of(client, run_id, timeout=30)
    assert isinstance(failed.value.cause, CancelledError), repr(failed.value.cause)
    status = await loop_status(client, run_id)
    assert status["status"] == "failed" and status["error"] == "canceled", status
    # A model's turn has no effect: stopped mid-attempt it failed; nothing is in doubt.
    assert status["turns"][0]["status"] == "failed", status["turns"]
