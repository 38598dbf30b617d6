"""The agent loop's input, what one run carries to the next, and its status: shared by the workflow
(``durable_agents.workflows.agent_loop``) and its clients (``durable_agents.flowclient.loop``).

Kept out of the workflow's module for the reason ``durable_agents.workflows.state`` is: the
sandbox executes the workflow's module afresh whenever a worker builds a run
again, while this one is imported once and passed through. Pure: dataclasses
and functions of them, no clock, no I/O (``details_text`` runs in workflow code).

- ``LoopInput``: what a run is started with; ``carried`` is None on the first
  run of a chain and a ``LoopCarried`` on every run continued as new.
- ``LoopCarried``: what one run of the chain hands the next when it continues
  as new: the next turn's number, the prompt window's messages exactly as
  ``durable_agents.memory.DerivedWindow`` held them (ids and chat dicts, in order, the
  system instructions first and pinned), the start id of the chain's first
  run, the counts so far, and the summaries of the last ``KEPT_TURNS`` turns
  (the status of a long chain stays bounded; ``durable_agents.flowclient.loop`` reads every
  turn back from the chain's histories).
- ``LoopInstructions``: the prompt and the tools a run recorded at its start,
  which its turns are asked with.
- ``window_policy`` / ``derived_window``: the memory policy the window is
  derived under, one definition for the workflow and its readers.
- ``LoopProgress``: the ``progress`` query's answer and the run's result: the
  run's state in ``durable_agents.steps.runstate``'s words, the current turn, each turn with
  its calls, their keys and their status, the counts.

The field names are recorded in histories (inputs, results): add fields with
defaults, never rename one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_agents.memory.derived import chat_tokens, derive_window
from durable_agents.memory.policy import MemoryPolicy

# At run time, not only for mypy: the SDK reads these annotations to decode an input or a result.
from durable_agents.steps.loop import DEFAULT_MAX_TURNS, DEFAULT_WINDOW_MESSAGES, DEFAULT_WINDOW_TOKENS, start_tokens
from durable_agents.steps.loop import (
    KEPT_TURNS as KEPT_TURNS,  # re-exported: the status and the carried state are bounded by it
)
from durable_agents.steps.runstate import RunStateName, StepStateName

DEFAULT_HISTORY_BOUND = 1000
"""Events: past this many in a run's history, once a turn's calls are all recorded, the run continues as
new. Below Temporal's own suggestion (about 4,000 events) on purpose: a worker that lost the run from its
cache (a restart, an eviction; every task with ``--cache 0``) replays the whole history inside the 2 s
workflow task timeout, and ~1,300 events replay in under half of it (``durable_agents.steps.retry``,
docs/operations.md)."""
MIN_HISTORY_BOUND = 10
MAX_HISTORY_BOUND = 20_000
"""A run checks its bound only between turns, and one turn of 8 calls, each with up to 50 attempts and
their backoff timers, can add some 4,000 events: the ceiling leaves that room below the 51,200 events at
which Temporal terminates a run."""
HISTORY_BYTES_BOUND = 10 * 1024 * 1024
"""Bytes: past this in a run's history, the run continues as new, between turns and, before another
attempt, within a turn's retries (each attempt records its request, the whole window: up to a megabyte,
``durable_agents.steps.loop``'s payload budget). Temporal warns at 10 MB and terminates a run at 50 MB; one attempt adds
at most its request and its answer (about 2 MB), so the history stays far below the end."""
SHOWN_CHARS = 200
"""A turn's text and a refused call's reason are cut to this in the status (the history keeps them whole)."""


@dataclass
class CarriedMessage:
    """One message of the prompt window: its id (``system``, ``task``, ``turn-<n>``, ``turn-<n>/call-<i>``)
    and its chat-format dict, as ``durable_agents.memory.DerivedWindow`` holds it (truncated there, if it was)."""

    id: str
    chat: dict[str, Any]


@dataclass
class LoopCounts:
    """Counts of a chain so far: turns recorded, tool calls recorded, effects (calls of a tool with an
    effect whose result is ``ok``: applied, or replayed by the provider) and refused calls."""

    turns: int = 0
    tool_calls: int = 0
    effects: int = 0
    refused: int = 0


@dataclass
class CallState:
    """One tool call of a turn: ``key`` is its idempotency key (None for ``lookup_order``, which reads);
    ``outcome`` ``ok`` or ``refused`` once recorded (``note`` then says why it was refused)."""

    index: int
    name: str
    key: str | None = None
    status: StepStateName = "pending"
    attempts: int = 0
    crashes: int = 0
    outcome: str | None = None
    effect_id: str | None = None
    replayed: bool = False
    last_error: str | None = None
    next_try_at: str | None = None
    note: str | None = None


@dataclass
class TurnState:
    """One turn: its status and attempts, the model's text (cut to ``SHOWN_CHARS``), and its calls."""

    turn: int
    status: StepStateName = "pending"
    attempts: int = 0
    crashes: int = 0
    answer: str | None = None
    calls: list[CallState] = field(default_factory=list)
    last_error: str | None = None
    next_try_at: str | None = None
    note: str | None = None


@dataclass
class LoopCarried:
    """What a run hands the next when it continues as new (see the module docstring). ``runs``: how many
    runs of the chain came before the one this input starts."""

    next_turn: int
    messages: list[CarriedMessage]
    start_id: str
    counts: LoopCounts = field(default_factory=LoopCounts)
    turns: list[TurnState] = field(default_factory=list)
    runs: int = 1
    step: dict[str, Any] | None = None
    """Continued as new within a turn's retries (the history past its bound): what the turn's attempts have
    spent (``durable_agents.steps.retry.StepLedger``'s counts), so the next run goes on with them, the turn still
    unasked for good; None between turns."""
    started_as: str | None = None
    """Continued as new from a run a reset made while it was still reusing its base's turns: that run's id,
    the next run's ``TurnRequest.started_as`` (``durable_agents.workflows.agent_loop.LOOP_RESET_PATCH``)."""


@dataclass
class LoopInstructions:
    """What the model is told of its job: the system prompt and the tools (``durable_agents.steps.loop.tool_specs``)."""

    prompt: str
    tools: list[dict[str, Any]]


@dataclass
class LoopInput:
    """A loop run's input. ``run_id`` must be the workflow id (the keys derive from it); ``retry`` is the
    run's ``durable_agents.steps.retry.RetryRule.to_dict()`` (``durable_agents.flowclient.loop.start_loop`` fills it);
    ``history_bound`` is in events (``DEFAULT_HISTORY_BOUND``); ``carried``: None on the first run of the chain."""

    run_id: str
    task: str
    email: str
    max_turns: int = DEFAULT_MAX_TURNS
    window_tokens: int = DEFAULT_WINDOW_TOKENS
    window_messages: int = DEFAULT_WINDOW_MESSAGES
    retry: dict[str, Any] | None = None
    history_bound: int = DEFAULT_HISTORY_BOUND
    carried: LoopCarried | None = None
    loop: list[str] | None = None
    """The loop's shape the run started under (``durable_agents.steps.loop.loop_signature``): code of another shape
    parks the run rather than run it (``durable_agents.steps.loop.loop_changed`` names both). None: a run started before
    it."""
    instructions: LoopInstructions | None = None
    """The system prompt and the tools as the model is told of them, recorded at the start: every turn of
    the run (and of its chain) is asked with these, whatever a later deploy's are. None: this code's."""
    agent: str = ""
    """The name of the agent the run is run by (``durable_agents.steps.served``); "": the refund agent (runs recorded
    before agents had names, and its own runs' ``email``)."""
    params: dict[str, str] | None = None
    """The run's parameters, which its agent declares and its tools read (``durable_agents.Agent.params``)."""
    agent_spec: str = ""
    """The import string the run's agent was started by (``starter.py loop --agent``), for the commands that load
    it again (``starter.py settle``); "" when none was given (the refund agent, a run started from code). The
    workflow never reads it."""


@dataclass
class LoopProgress:
    """A loop run's status, from the workflow itself (its ``progress`` query and its result).

    ``turns``: the summaries carried from earlier runs of the chain (the newest ``KEPT_TURNS``), then this
    run's; ``earlier_turns`` counts the chain's turns left out. ``run_in_chain``: 1 for the first run,
    2 after one continue-as-new, ... ``window_messages``/``window_tokens``: the prompt window now (its
    token estimate, ``durable_agents.memory.approx_tokens``, never above the run's ``window_tokens`` bound)."""

    run_id: str
    status: RunStateName
    turn: int
    max_turns: int
    counts: LoopCounts = field(default_factory=LoopCounts)
    turns: list[TurnState] = field(default_factory=list)
    earlier_turns: int = 0
    run_in_chain: int = 1
    answer: str | None = None
    error: str | None = None
    detail: str | None = None
    window_messages: int = 0
    window_tokens: int = 0


def window_policy(window_tokens: int, window_messages: int) -> MemoryPolicy:
    """The memory policy a loop run's prompt window is derived under, from the bounds the run recorded:
    one definition for the workflow (which builds the window) and its readers (which derive it again)."""
    return MemoryPolicy(max_tokens=window_tokens, max_messages=window_messages)


def derived_window(window_tokens: int, window_messages: int,
                   messages: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The prompt window of a loop run's messages in order (``durable_agents.steps.loop``'s: the system instructions,
    pinned, the task, every recorded turn and tool result) under the run's bounds."""
    return derive_window(window_policy(window_tokens, window_messages), messages, pinned=1)


def shown(text: str | None) -> str | None:
    """``text`` cut to ``SHOWN_CHARS`` for a status line."""
    if text is None or len(text) <= SHOWN_CHARS:
        return text
    return text[: SHOWN_CHARS - 3] + "..."


def _call_line(call: CallState) -> str:
    key = f" [{call.key}]" if call.key else ""
    more = f", attempt {call.attempts}" if call.status in ("running", "retrying") else ""
    outcome = f" ({call.outcome})" if call.outcome else ""
    return f"call-{call.index} {call.name}{key}: {call.status}{outcome}{more}"


def details_text(progress: LoopProgress, shown_turns: int = 3) -> str:
    """The run's current details for the Temporal UI (``workflow.set_current_details``): its state, the
    counts, and the newest ``shown_turns`` turns with each call's key and status."""
    c = progress.counts
    lines = [
        f"turn {progress.turn} of at most {progress.max_turns} (run {progress.run_in_chain} of the chain): "
        f"{progress.status}" + (f": {progress.error}" if progress.error else ""),
        f"{c.turns} turn(s), {c.tool_calls} tool call(s), {c.effects} effect(s), {c.refused} refused; "
        f"window {progress.window_messages} message(s), ~{progress.window_tokens} tokens",
    ]
    for turn in progress.turns[-shown_turns:]:
        more = f", attempt {turn.attempts}" if turn.status in ("running", "retrying") else ""
        when = f", next try at {turn.next_try_at}" if turn.status == "retrying" else ""
        lines.append(f"turn-{turn.turn}: {turn.status}{more}{when}")
        lines.extend(f"  {_call_line(call)}" for call in turn.calls)
    return "\n".join(lines)


def start_tokens_of(task: str, prompt: str | None = None) -> int:
    """Memory's count of what a run's window holds before its first turn (``durable_agents.steps.loop.start_tokens``;
    with its agent's instructions, ``prompt``: None, the refund agent's), for the loop's clients, which import no
    memory of their own."""
    return start_tokens(task, chat_tokens) if prompt is None else start_tokens(task, chat_tokens, prompt)
