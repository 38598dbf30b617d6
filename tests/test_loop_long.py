"""Hundreds of turns: the agent loop over 202 turns on Temporal and on the run record, real processes, a kill
at turn 150 on each.

The task names 100 seeded orders, each with something left to refund, so the scripted model takes
2 * 100 + 2 = 202 turns (a lookup; the refund and its email in one turn; ... the ticket; the final answer):
301 tool calls, 201 effects. The window's bounds (1,000 tokens, 12 messages) are small on purpose: the
message bound binds at turns 50 and 150, the token bound at 202 (the ticket names every order), and the
last prompt holds 9 of the 504 messages recorded before it: the system instructions, the task and the
newest three tool rounds.

The model stand-in runs in this process (``durable_agents.testing.standin.ModelStandIn``, reached over TCP by the worker
and runrecord processes through ``LLM_BASE_URL``), extended here only to keep the prompt it is asked with
for each turn and to hold the first request of turn 150 in flight: it is counted when it arrives (the
stand-in's rule), the test sees it held and SIGKILLs the process that asked, then lets it go. A fresh
process resumes at turn 150. Shown on each engine:

- every prompt (on Temporal the one recorded in the chain's histories, on the record the window derived
  from it for each turn) is within both bounds, equals what the model was sent, and the record or the
  chain holds all 202 turns; memory evicted most of it (checked, and the figures printed with ``-s``);
- the stand-in's counts: turns 1..149 asked once (never again after the kill), turn 150 twice (its
  answer died with the killed process), 151..202 once;
- the provider, the judge: 100 refunds, 100 emails, 1 ticket, each applied once and requested once
  (the kill fell on a turn, which has no effect), 100 lookups;
- Temporal: each run of the chain has at most ``history_bound`` events before its last turn, and that
  turn adds at most one turn's events; the measured maximum is printed.

docs/memory.md ("The agent loop: what the model loses when a block is evicted") quotes the figures:
``.venv/bin/python -m pytest -q -s tests/test_loop_long.py`` prints them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_agents.activities.loop import MODEL_TURN
from durable_agents.flowclient.loop import loop_status, read_chain, start_loop
from durable_agents.memory import DerivedWindow, Message, approx_tokens
from durable_agents.providerclient import fetch_effects, lookup_counts, seed_orders
from durable_agents.runrecord import RunRecord
from durable_agents.runrecord.plans import LoopRunPlan, loop_inputs
from durable_agents.steps.loop import TurnRequest, parse_step, turn_step
from durable_agents.steps.startedline import parse_started, started_in
from durable_agents.testing.standin import ModelStandIn
from durable_agents.workflows.loop_state import window_policy
from lab.processes import Proc
from tests import loop_support
from tests.support import EMAIL, finished, poll_until, poll_until_sync

ORDERS = {f"A-{1001 + i}": 1000 + 10 * i for i in range(100)}  # each with all of its total left to refund
TASK = "Please refund every one of these broken orders: " + ", ".join(ORDERS) + "."
TURNS = 2 * len(ORDERS) + 2
KILL_AT = 150
WINDOW_TOKENS = 1000
WINDOW_MESSAGES = 12
HISTORY_BOUND = 500
"""Events: small enough that the 202 turns (~3,000 events) continue as new several times."""
EVENTS_PER_ACTIVITY = 6
"""Scheduled, started, completed, and the workflow task that reads the completion (scheduled, started,
completed)."""
ONE_TURN_EVENTS = 1 + 3 * EVENTS_PER_ACTIVITY + 1
"""The most events a run's last turn adds after the run checked its length: the completion of the workflow
task that checked it, the model turn and its two calls, and the continue-as-new event that closes the run."""
SHOWN_TURNS = (50, KILL_AT, TURNS)


class HoldingStandIn(ModelStandIn):
    """The stand-in, keeping every prompt it is asked with (by run and turn, in order of arrival) and holding
    the first request of one (run, turn) in flight, counted, until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
        self._holds: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}

    def hold(self, run: str, turn: int) -> threading.Event:
        """Hold the first request of ``turn`` of ``run``; the event is set once it is held."""
        held, release = threading.Event(), threading.Event()
        self._holds[(run, str(turn))] = (held, release)
        return held

    def release(self, run: str, turn: int) -> None:
        self._holds.pop((run, str(turn)))[1].set()

    def complete(self, request: Any, run: str, turn: str) -> dict[str, Any]:
        if isinstance(request, dict) and request.get("tools") and isinstance(request.get("messages"), list):
            self.prompts.setdefault((run, turn), []).append(request["messages"])
        return super().complete(request, run, turn)

    def count(self, run: str, turn: str) -> None:
        super().count(run, turn)  # counted first: a held request counts as asked, as any request in flight
        hold = self._holds.get((run, turn))
        if hold is not None and not hold[0].is_set():
            hold[0].set()
            hold[1].wait(timeout=120)

    def stop(self) -> None:
        for _, release in self._holds.values():
            release.set()  # a request still held (a test that failed before its kill) ends now
        super().stop()

    def asked(self, run: str) -> dict[str, int]:
        return dict(self.counts(run)["turns"])


@pytest.fixture(scope="module")
def standin() -> Iterator[HoldingStandIn]:
    with HoldingStandIn() as server:
        yield server


def model_env(standin: ModelStandIn) -> dict[str, str]:
    return {**loop_support.model_env(standin.url), "LAB_STEP_SECONDS": "0"}


def first_step_started(proc: Proc) -> str:
    """The step whose started line ``proc`` printed first (waited for as it prints)."""
    started = parse_started(proc.wait_for_line(" started: run ", timeout=60))
    assert started is not None
    return started.step


def turns_started(proc: Proc, run_id: str) -> list[int]:
    """The turns of the steps ``proc`` began executing, among the lines it kept."""
    return [parse_step(s.step)[0] for s in started_in(proc.output()) if s.run_id == run_id]


def expected_asks() -> dict[str, int]:
    """Every turn asked once but the one the kill interrupted, asked again by the fresh process."""
    return {str(n): 2 if n == KILL_AT else 1 for n in range(1, TURNS + 1)}


def assert_each_effect_once(provider_url: str, run_id: str) -> None:
    effects = fetch_effects(provider_url, run_id=run_id)
    assert Counter(e.kind for e in effects) == {"refund": 100, "email": 100, "ticket": 1}, Counter(
        e.kind for e in effects)
    # Applied once each, and requested once: the kill fell on a turn, so no effect was ever in doubt.
    assert all(e.effects_applied == 1 and e.requests == 1 for e in effects), [
        (e.key, e.effects_applied, e.requests) for e in effects if (e.effects_applied, e.requests) != (1, 1)]
    lookups = lookup_counts(provider_url, run_id)
    assert lookups["lookups"] == len(ORDERS) and lookups["by_order"] == dict.fromkeys(ORDERS, 1), lookups


def effects_at_kill(provider_url: str, run_id: str) -> Counter[str]:
    return Counter(e.kind for e in fetch_effects(provider_url, run_id=run_id) if e.effects_applied == 1)


# ---------------------------------------------------------------- the window, derived and measured


def prompt_tokens(prompt: Sequence[Mapping[str, Any]]) -> int:
    return sum(approx_tokens(Message.from_chat(m, id=f"m{i}")) for i, m in enumerate(prompt))


@dataclass(frozen=True)
class WindowFigures:
    """The prompt of one turn, against the record before it. A block is the task or one turn with its tool
    results (memory's units: ``memory.__init__``); the system instructions are pinned, not counted."""

    turn: int
    messages: int
    tokens: int
    record_messages: int
    record_blocks: int
    evicted_blocks: int
    held_turns: tuple[int, ...]
    task_held: bool

    def row(self) -> str:
        held = ", ".join(map(str, self.held_turns))
        return (f"| {self.turn} | {self.messages} | {self.tokens} | {self.record_messages} | "
                f"{self.evicted_blocks} of {self.record_blocks} | {'task, ' if self.task_held else ''}turns {held} |")


def figures(turn: int, messages: Sequence[tuple[str, dict[str, Any]]], prompt: list[dict[str, Any]]) -> WindowFigures:
    """Derive the window of ``messages`` (the run's, before ``turn``) again, check it is ``prompt`` and within
    both bounds, and measure it."""
    window = DerivedWindow(window_policy(WINDOW_TOKENS, WINDOW_MESSAGES))
    for place, (message_id, chat) in enumerate(messages):
        window.add(message_id, chat, pin=place == 0)
    assert window.prompt() == prompt, f"turn {turn}: the prompt is not the window derived from the record"
    stats = window.stats()
    tokens = prompt_tokens(prompt)
    assert tokens == stats.tokens, (turn, tokens, stats.tokens)
    assert len(prompt) <= WINDOW_MESSAGES and tokens <= WINDOW_TOKENS, (turn, len(prompt), tokens)
    assert prompt[0]["role"] == "system", turn  # pinned
    ids = window.ids()
    held = tuple(sorted({parse_step(i)[0] for i in ids if i.startswith("turn-")}))
    blocks = 1 + (turn - 1)  # the task, and each turn before this one with its results
    return WindowFigures(turn, len(prompt), tokens, len(messages), blocks,
                         blocks - len(held) - ("task" in ids), held, "task" in ids)


def check_windows(all_figures: dict[int, WindowFigures], engine: str) -> None:
    """Eviction really happened, as the rule says, and print what the model saw (``-s``)."""
    assert sorted(all_figures) == list(range(1, TURNS + 1))
    # The task, opening the one exchange, is kept in every prompt while older tool rounds go (rule 2).
    assert all(f.task_held for f in all_figures.values())
    # What the prompt holds of the turns is always the newest ones, whole: the oldest rounds went first.
    for turn, f in all_figures.items():
        assert f.held_turns == tuple(range(turn - len(f.held_turns), turn)), f
    last = all_figures[TURNS]
    # Most of the record is not in the last prompt: 3 of its 201 tool rounds; the newest ones, whole.
    assert last.record_messages == 2 + (TURNS - 1) + 3 * len(ORDERS) + 1, last
    assert last.messages * 10 < last.record_messages, last
    assert last.held_turns == tuple(range(TURNS - len(last.held_turns), TURNS)), last
    assert last.evicted_blocks >= TURNS - 5, last
    # The message bound binds at 50 and 150; at 202 the token bound (the ticket's summary names 100 orders).
    assert all_figures[50].messages == all_figures[KILL_AT].messages == WINDOW_MESSAGES
    assert last.messages < WINDOW_MESSAGES and last.tokens > WINDOW_TOKENS - 200, last
    print(f"\n{engine}: the prompt window (bounds {WINDOW_TOKENS} tokens, {WINDOW_MESSAGES} messages)")
    print("| turn | messages | tokens (estimate) | record messages before it | blocks evicted | the prompt holds |")
    print("|---:|---:|---:|---:|---:|---|")
    for turn in SHOWN_TURNS:
        print(all_figures[turn].row())
    print(f"over all {TURNS} prompts: at most {max(f.tokens for f in all_figures.values())} tokens and "
          f"{max(f.messages for f in all_figures.values())} messages")


def check_asked_prompts(standin: HoldingStandIn, run_id: str, prompts: Mapping[int, list[dict[str, Any]]]) -> None:
    """What the model was sent, every time, is the prompt the record says (the killed ask and its retry alike)."""
    for turn in range(1, TURNS + 1):
        sent = standin.prompts[(run_id, str(turn))]
        assert len(sent) == (2 if turn == KILL_AT else 1), (turn, len(sent))
        assert all(s == prompts[turn] for s in sent), f"turn {turn}: the model was sent another prompt"


# ---------------------------------------------------------------- Temporal


def turn_of_activity(activity_id: str) -> int:
    return int(activity_id.partition("/")[0].removeprefix("turn-"))


async def history_figures(client: Client, run_id: str, temporal_run_id: str) -> tuple[int, int, int]:
    """(events in the run's history, events before its last turn was scheduled, that last turn's number)."""
    history = await client.get_workflow_handle(run_id, run_id=temporal_run_id).fetch_history()
    last_turn, first_event = 0, 0
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            if a.activity_type.name == MODEL_TURN and turn_of_activity(a.activity_id) > last_turn:
                last_turn, first_event = turn_of_activity(a.activity_id), ev.event_id
    # The run checked its length in the workflow task that read the previous turn's last completion: the
    # events up to that task's start, which the task's completion and this scheduling follow.
    return len(history.events), first_event - 2, last_turn


async def test_two_hundred_turns_on_temporal_killed_at_turn_150(client, workers, provider, run_id, task_queue,
                                                                 standin):
    seed_orders(provider.url, ORDERS)
    held = standin.hold(run_id, KILL_AT)
    env = model_env(standin)
    first = workers(extra_env=env)
    began = time.monotonic()
    created, _ = await start_loop(client, run_id, TASK, EMAIL, task_queue=task_queue, max_turns=TURNS,
                                  window_tokens=WINDOW_TOKENS, window_messages=WINDOW_MESSAGES,
                                  history_bound=HISTORY_BOUND)
    assert created
    await poll_until(held.is_set, timeout=240, interval=0.02,
                     what=f"turn {KILL_AT} asked (asked so far: {len(standin.asked(run_id))} turns)")
    first.kill()  # SIGKILL, while turn 150's request is in flight
    standin.release(run_id, KILL_AT)
    killed = time.monotonic()

    # At the kill: 149 turns recorded with all their calls, turn 150 asked and not recorded.
    assert standin.asked(run_id) == {str(n): 1 for n in range(1, KILL_AT + 1)}
    before = await loop_status(client, run_id)
    assert before["status"] == "running" and len(before["turns"]) == KILL_AT, before["turns"][-2:]
    assert all(t["status"] == "completed" for t in before["turns"][:-1])
    assert before["turns"][-1]["status"] == "running" and before["turns"][-1]["calls"] == [], before["turns"][-1]
    assert effects_at_kill(provider.url, run_id) == {"refund": 74, "email": 74}

    second = workers(extra_env=env)
    # The fresh worker resumes at turn 150 (read as printed: a process keeps its last 2,000 lines).
    assert first_step_started(second) == turn_step(KILL_AT)
    result = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), timeout=240)
    done = time.monotonic()
    assert result["status"] == "completed", result
    assert result["answer"].startswith("Done: I went through the 100 orders you named"), result
    assert min(turns_started(second, run_id)) == KILL_AT  # no step of an earlier turn began there
    # The witness: turns 1..149 never asked again; 150 asked again once; the rest once.
    assert standin.asked(run_id) == expected_asks()
    assert_each_effect_once(provider.url, run_id)

    chain = await read_chain(client, run_id)
    assert len(chain.turns()) == TURNS and chain.turns()[-1][0]["calls"] == []
    status = await loop_status(client, run_id)
    assert status["counts"] == {"turns": TURNS, "tool_calls": 3 * len(ORDERS) + 1, "effects": 2 * len(ORDERS) + 1,
                                "refused": 0}, status["counts"]
    killed_turn = next(t for t in status["turns"] if t["turn"] == KILL_AT)
    assert (killed_turn["attempts"], killed_turn["crashes"]) == (2, 1), killed_turn

    # Every prompt, as its run's history recorded it, is the window derived from every turn of the chain.
    prompts: dict[int, list[dict[str, Any]]] = {}
    for run in chain.runs:
        assert not set(run.prompts) & set(prompts), "a turn asked in two runs of the chain"
        prompts.update(run.prompts)
    all_figures = {turn: figures(turn, chain.messages(turn), prompt) for turn, prompt in prompts.items()}
    check_windows(all_figures, "Temporal")
    check_asked_prompts(standin, run_id, prompts)
    for next_turn, carried in chain.carried():
        assert carried == chain.window(next_turn), next_turn

    # Each run's history: at most the bound before its last turn, and that turn's events on top.
    assert len(chain.runs) >= 5, [r.history_length for r in chain.runs]
    rows = [await history_figures(client, run_id, run.temporal_run_id) for run in chain.runs]
    for place, (events, before_last, _) in enumerate(rows):
        if place < len(rows) - 1:  # continued as new: past the bound once its last turn was done
            assert before_last <= HISTORY_BOUND < events, (place, rows)
        # (The killed attempt's events fall inside a run, never in its last turn: a run here spans ~33 turns.)
        assert events - before_last <= ONE_TURN_EVENTS, (place, rows)
        assert events <= HISTORY_BOUND + ONE_TURN_EVENTS, (place, rows)
    print(f"\nTemporal: {len(chain.runs)} runs in the chain, events per run {[r[0] for r in rows]}, "
          f"largest {max(r[0] for r in rows)} (bound {HISTORY_BOUND}); most added by one run's last turn "
          f"{max(r[0] - r[1] for r in rows)}; the runs end at turns {[r[2] for r in rows]}")
    print(f"Temporal: wall time {killed - began:.1f} s to the kill at turn {KILL_AT}, {done - killed:.1f} s "
          f"from the kill to the end ({done - began:.1f} s in all)")


# ---------------------------------------------------------------- the run record


def test_two_hundred_turns_on_the_run_record_killed_at_turn_150(runrecord, provider, db, run_id, standin):
    seed_orders(provider.url, ORDERS)
    held = standin.hold(run_id, KILL_AT)
    env = model_env(standin)
    began = time.monotonic()
    first = runrecord("loop", run_id, TASK, "--email", EMAIL, "--max-turns", str(TURNS),
                      "--window-tokens", str(WINDOW_TOKENS), "--window-messages", str(WINDOW_MESSAGES), env=env)
    poll_until_sync(held.is_set, timeout=240, interval=0.02,
                    describe=lambda: f"turns asked so far: {len(standin.asked(run_id))}; {first.last_lines(5)}")
    first.kill()  # SIGKILL, while turn 150's request is in flight
    standin.release(run_id, KILL_AT)
    killed = time.monotonic()

    assert standin.asked(run_id) == {str(n): 1 for n in range(1, KILL_AT + 1)}
    with RunRecord(db) as record:
        run = record.load(run_id)
    assert run.status == "running" and run.steps[run.position].name == turn_step(KILL_AT), run.position
    assert run.steps[run.position].attempt_open
    assert effects_at_kill(provider.url, run_id) == {"refund": 74, "email": 74}

    second = runrecord("resume", run_id, env=env)
    # Read as printed: the process keeps its last 2,000 lines, and the status printed at the end (a line
    # per turn) pushes these out.
    assert f"at step {turn_step(KILL_AT)};" in second.wait_for_line("resuming run", timeout=60)
    assert first_step_started(second) == turn_step(KILL_AT)
    assert finished(second, timeout=240) == 0, second.output()[-3000:]
    done = time.monotonic()
    assert min(turns_started(second, run_id), default=KILL_AT) >= KILL_AT
    assert standin.asked(run_id) == expected_asks()
    assert_each_effect_once(provider.url, run_id)

    with RunRecord(db) as record:
        run = record.load(run_id)
    assert run.status == "completed", run.error
    results = run.results()
    turns = [s for s in run.steps if "/" not in s.name]
    assert len(turns) == TURNS and all(s.status == "completed" for s in turns)
    assert len(run.steps) == TURNS + 3 * len(ORDERS) + 1
    killed_step = next(s for s in run.steps if s.name == turn_step(KILL_AT))
    assert (killed_step.attempts, killed_step.crashes) == (2, 1), killed_step
    # Every other step ran once: nothing recorded before the kill ran again.
    assert all(s.attempts == 1 for s in run.steps if s is not killed_step), [
        (s.name, s.attempts) for s in run.steps if s.attempts != 1]

    # Each turn's prompt: the window derived from the record before it (what the runner sends).
    plan = LoopRunPlan(loop_inputs(run)).plan
    prompts: dict[int, list[dict[str, Any]]] = {}
    all_figures = {}
    for turn in range(1, TURNS + 1):
        request = plan.request(turn_step(turn), results)
        assert isinstance(request, TurnRequest)
        prompts[turn] = request.window
        all_figures[turn] = figures(turn, plan.messages(results, upto=turn_step(turn)), request.window)
    check_windows(all_figures, "run record")
    check_asked_prompts(standin, run_id, prompts)
    print(f"run record: wall time {killed - began:.1f} s to the kill at turn {KILL_AT}, {done - killed:.1f} s "
          f"from the kill to the end ({done - began:.1f} s in all)")
