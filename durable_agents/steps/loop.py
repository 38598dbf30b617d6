"""The agent loop: a model that chooses its tools, turn after turn, each tool effect once.

A run of the loop has a task and a customer (an email address). It repeats:
a **turn** (the model is asked, on the window of the conversation so far,
and answers with text and tool calls), then each **tool call** of that turn,
in the model's order; until a turn asks for no tool call (its text is the
final answer: the run completes) or the turn limit is reached with tools
still asked for (the run fails, naming the limit).

Every engine walks the loop through ``LoopPlan``: the plan of a loop run is
decided as the run goes, one turn at a time. Its steps are named
``turn-<n>`` (n from 1) and ``turn-<n>/call-<i>`` (i from 0, the call's
place in its turn); ``LoopPlan.after`` says which steps a recorded result
adds (a turn: its calls, then the next turn; a final turn: none), and
``LoopPlan.request`` builds any step's request from the run's inputs and the
recorded results, never from anything else, so a resumed or replayed run asks
and sends exactly what the first process would have.

The contract every engine keeps (CONVENTIONS.md, "An agent that loops"):

- **A turn is recorded before any of its tool calls runs, and a recorded turn
  is never asked for again.** A model is slow and never answers the same way
  twice; a turn asked again could choose other tools.
- **A tool call's key** (``tool_key``) comes from the run id, the turn number,
  the call's place in the turn and a digest of the call's id as the recorded
  turn holds it: the same on every retry, resume and replay of that call, and
  different for every other call. Never the attempt, never a fresh id. The id
  is the model's and untrusted: it enters the key only as a SHA-256 digest
  (whatever its length or characters), and the key does not rely on ids being
  unique, across turns or within one (the turn and the place tell calls apart).
- **Tool arguments and results are untrusted model output.** Arguments are
  parsed and checked by the tools' declaration (``TOOLBOX``, the lab's
  ``durable_agents.steps.refund_agent.REFUND_TOOLS``: each tool's pydantic model, holding the
  text rule of ``durable_agents.steps.limits``) before anything reaches a request, a header or a
  terminal; what is wrong (not JSON, an unknown tool, a missing or extra
  field, a control character, a refund the provider refuses) becomes the
  call's result, ``status="refused"``, given back to the model, and nothing
  is applied. The email goes to the run's customer, never to an address the
  model wrote.
- **The prompt is memory's window, derived from the record.** Each turn's
  prompt is the window that appending the run's messages in order
  (``LoopPlan.messages``: the system instructions, pinned; the task; every
  recorded turn and tool result) to a bounded memory gives, under the bounds
  the run recorded (``LoopInputs.window_tokens``, ``window_messages``). The
  engine builds it (``durable_agents.memory.DerivedWindow``; ``steps`` imports nothing
  outside itself, so the plan is handed the function); the record or history
  keeps every turn; a resume derives the same window again.

Crash points (``durable_agents.steps.crashpoints``), reached by the step functions on every engine:

=================================  ==================================================
``turn:after_answer``              the model answered a turn; it is not recorded
``tool:issue_refund:after_effect`` the provider applied the refund; the call's result
                                   is not recorded (likewise ``send_email``,
                                   ``create_ticket``)
=================================  ==================================================

and by each engine, ``<engine>:loop:between_calls`` (a call's result is
recorded and the next call of the same turn not started) and
``<engine>:loop:after_turn`` (a turn's last call is recorded, the next turn
not asked), ``<engine>`` being ``temporal`` or ``runrecord``; on Temporal also
``temporal:loop:continue_as_new`` (the run is about to continue as new).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from durable_agents.agent import Agent
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.errors import PermanentError
from durable_agents.steps.flow import StepDeps, pace
from durable_agents.steps.keys import KEY_PREFIX
from durable_agents.steps.limits import MAX_ARGUMENTS_CHARS, MAX_BODY_CHARS, InputError, check_text
from durable_agents.steps.refund_agent import MAX_LOOP_BODY_CHARS, REFUND_AGENT, REFUND_TOOLS
from durable_agents.steps.retry import SAME_ERROR_LIMIT
from durable_agents.tools import MAX_NAME_CHARS, Toolbox, ToolContext, ToolRefused

LOOP_SYSTEM_PROMPT = REFUND_AGENT.instructions
"""The refund agent's instructions (``durable_agents.steps.refund_agent.REFUND_PROMPT``), which runs recorded before
they recorded their own are asked with."""

DEFAULT_MAX_TURNS = 20
"""The turn limit a run gets unless it is given one: a turn that still asks for tools at the limit fails the run."""
MAX_TURNS_LIMIT = 10_000
DEFAULT_WINDOW_TOKENS = 2000
DEFAULT_WINDOW_MESSAGES = 40
"""The window's bounds a run gets unless given others (``durable_agents.memory.MemoryPolicy``'s ``max_tokens``,
``max_messages``); recorded with the run, so a resume derives its window under the same bounds."""
MAX_CALLS_PER_TURN = 8
"""At most this many tool calls run in a turn; a turn asking for more is refused back to the model whole
(``recorded_calls``)."""
MAX_CALL_ID_CHARS = 256
MAX_TOOL_NAME_CHARS = MAX_NAME_CHARS  # the adapter's rule for a tool's name
MAX_CONTENT_CHARS = MAX_BODY_CHARS
# MAX_ARGUMENTS_CHARS (durable_agents.steps.limits) and MAX_LOOP_BODY_CHARS (durable_agents.steps.refund_agent) are read
# here under these names too.
WINDOW_RESERVE_TOKENS = 160
CALL_RESERVE_TOKENS = 48
"""The prompt window's tokens (memory's estimate, ``durable_agents.memory.approx_tokens``) a turn's arguments may not
use: 160 for the pinned system instructions (106) and the turn's message without its calls (its role, and
memory's truncation marker as its text: memory cuts the text to fit), and 48 a call (41 at most: its
framing, a 64-character window id, a 64-character name, ``{}`` as arguments). tests/test_loop_steps.py
holds them at or above memory's count."""

# ---------------------------------------------------------------- what a payload may hold
#
# Temporal refuses a payload over 2 MiB (the server's blob size limit; the worker's SDK refuses the command
# first: PayloadLimitViolation, and the workflow task fails for good, the run parked). Every payload the loop
# makes is bounded here, in the bytes the SDK's JSON writes (``ensure_ascii``: a character outside ASCII is
# ``\\uXXXX``, 6 bytes, 12 for one beyond the BMP; ``"`` and ``\\`` are 2):
#
# - the margin: 1/8 of the limit (262,144 bytes) for the payload codec (AES-GCM's nonce and tag, 28 bytes;
#   the sealed payload's own metadata and the key and workflow ids, under 1 KB) and whatever the SDK and the
#   server count beside the JSON: ``PAYLOAD_BUDGET_BYTES`` = 1,835,008;
# - a prompt window of T tokens (memory's estimate, which the window never exceeds) is at most
#   ``WINDOW_BYTES_PER_TOKEN`` x T bytes: 8.02 at worst measured (backslashes, newlines, accented letters, a
#   message of one character; tests/test_loop_steps.py), 10 with room;
# - the largest payload is what continue-as-new carries (``durable_agents.workflows.loop_state.LoopCarried``): the
# window, ``KEPT_TURNS`` turn summaries of at most ``TURN_SUMMARY_BYTES`` (their texts cut to 200 characters; 8
#   calls; measured in the tests) and the rest (the task, 4,000 characters: 24,000 bytes at 6 a character;
#   the run's instructions, its prompt and tools, ``MAX_INSTRUCTIONS_CHARS`` characters of JSON: 24,000; the
#   address, the rule, the signature, the counts: under 4,000): ``CARRIED_REST_BYTES``, 52,000; so the
#   window may hold (1,835,008 - 52,000 - 20 x 40,000) // 10 = 98,300 tokens, rounded down to the thousand:
#   ``MAX_WINDOW_TOKENS``, 98,000 (docs/agent-loop.md gives the same arithmetic; tests/test_loop_steps.py
#   holds it to these constants);
# - a turn's request is that window and a few numbers; a turn's answer at most 20,000 characters of text
#   (240,000 bytes) and 8 calls of at most 8,000 characters of arguments, a 256-character id and a 64-character
#   name (8 x 99,840 bytes): 1,038,720 bytes; a tool's result a JSON text of its call's fields, a refusal's
#   reason cut to ``MAX_REASON_CHARS``: under 20,000 bytes; the run's result and its ``progress`` query the
#   newest ``KEPT_TURNS`` summaries and the answer: under 1,100,000 bytes. All within the budget.

PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
PAYLOAD_BUDGET_BYTES = PAYLOAD_LIMIT_BYTES - PAYLOAD_LIMIT_BYTES // 8
WINDOW_BYTES_PER_TOKEN = 10
KEPT_TURNS = 20
"""How many turn summaries a run carries to the next and shows in its status (the newest): bounded."""
TURN_SUMMARY_BYTES = 40_000
CARRIED_REST_BYTES = 52_000
MAX_WINDOW_TOKENS = (PAYLOAD_BUDGET_BYTES - CARRIED_REST_BYTES - KEPT_TURNS * TURN_SUMMARY_BYTES) \
    // WINDOW_BYTES_PER_TOKEN // 1000 * 1000
MAX_REASON_CHARS = 1000
MAX_INSTRUCTIONS_CHARS = 4000
"""A run's recorded system prompt and tools (their JSON) together, at most (``durable_agents.workflows.loop_state``)."""
WINDOW_TOKENS_BEFORE_CAP = 1_000_000
"""The most window tokens a run was accepted with before ``MAX_WINDOW_TOKENS``: such a run replays."""

# The tools: declared data (durable_agents.Tool), the lab's four in durable_agents.steps.refund_agent. What the loop
# reads of them is read from this toolbox; the names below are values derived from it, for the modules that import them.
TOOLBOX: Toolbox = REFUND_TOOLS
EFFECT_OF_TOOL: dict[str, str] = dict(TOOLBOX.effects)
"""Each tool with an effect and the provider's kind of it; ``lookup_order`` has none (read-only, no key)."""
TOOL_NAMES: tuple[str, ...] = TOOLBOX.names


def tool_specs() -> list[dict[str, Any]]:
    """The tools in the chat-completions form (``tools=``), from their arguments' JSON Schemas."""
    return TOOLBOX.specs()


# ---------------------------------------------------------------- shapes


@dataclass(frozen=True)
class AskedCall:
    """One tool call as the model asked for it: ``id`` (the model's, untrusted), the tool's ``name`` and its
    ``arguments`` as the JSON text the model wrote (parsed only when the call runs). ``refused``: why the
    turn refused the call as it was recorded (``recorded_calls``; its arguments then ``{}``), or empty.
    ``approval``: the call waits for a person's decision before it runs (its tool's ``Approval``, as
    ``Approval.recorded`` writes it: ``within`` seconds, ``on_expiry``), decided when the turn was recorded;
    None: it runs at once."""

    id: str
    name: str
    arguments: str = "{}"
    refused: str = ""
    approval: dict[str, Any] | None = None


@dataclass(frozen=True)
class ModelAnswer:
    """A model's answer to a turn: its text and the tool calls it asks for, in its order."""

    content: str
    tool_calls: tuple[AskedCall, ...] = ()


@dataclass(frozen=True)
class LoopInputs:
    """What a loop run was started with, fixed for its life (and carried across continue-as-new).

    ``email`` is the customer's address: the only one ``send_email`` writes to.
    ``start_id`` names this start of the run id (as ``durable_agents.steps.requests.RunInputs``). ``prompt`` and
    ``tools``: what the model is told, as the run recorded them at its start (``instructions``; None: this code's
    ``tool_specs``), so every turn of the run is asked with them whatever a later deploy's are. ``agent``: the
    name of the agent the run is run by ("" for the refund agent, as runs recorded before agents had names);
    ``params`` the run's parameters its tools read (``ToolContext.params``; the refund agent's ``email`` is
    the field above)."""

    run_id: str
    task: str
    email: str
    max_turns: int = DEFAULT_MAX_TURNS
    window_tokens: int = DEFAULT_WINDOW_TOKENS
    window_messages: int = DEFAULT_WINDOW_MESSAGES
    start_id: str = ""
    prompt: str = LOOP_SYSTEM_PROMPT
    tools: list[dict[str, Any]] | None = None
    agent: str = ""
    params: Mapping[str, str] | None = None


@dataclass(frozen=True)
class TurnRequest:
    run_id: str
    turn: int
    window: list[dict[str, Any]]  # the prompt: memory's window of the run's messages, system first
    max_turns: int
    window_tokens: int | None = None  # the run's bound: a turn's calls must fit it (None: not checked)
    tools: list[dict[str, Any]] | None = None  # the tools as the run recorded them (None: this code's)
    # The Temporal run that began this run's record (the first run's, kept by a reset; or the reset run this
    # one continued from while reusing): asked in another run, the turn may be recorded already
    # (durable_agents.activities.recorded_turns). None: ask the model.
    started_as: str | None = None
    agent: str = ""  # the run's agent (LoopInputs.agent)


@dataclass(frozen=True)
class TurnResult:
    """A recorded turn: what the model answered (its calls as asked, ids untrusted) and the prompt's size."""

    turn: int
    content: str
    calls: list[AskedCall] = field(default_factory=list)
    model: str = ""
    prompt_messages: int = 0
    # the record of an earlier run, read back after a reset (durable_agents.activities.recorded_turns)
    reused: bool = False


@dataclass(frozen=True)
class ToolRequest:
    run_id: str
    turn: int
    index: int  # the call's place in its turn, from 0
    call: AskedCall
    idempotency_key: str
    customer_email: str
    start_id: str = ""
    agent: str = ""  # the run's agent and its parameters (LoopInputs.agent, params)
    params: dict[str, str] | None = None


@dataclass(frozen=True)
class ToolResult:
    """A recorded tool call: ``content`` is what goes back to the model (JSON text); ``status`` ``ok`` or
    ``refused`` (nothing applied); for an effect, its ``kind``, the provider's id of it (``effect_id``) and
    whether the provider answered from its store (``replayed``: applied by an earlier attempt)."""

    turn: int
    index: int
    name: str
    status: Literal["ok", "refused"]
    content: str
    idempotency_key: str | None = None
    kind: str | None = None
    effect_id: str | None = None
    replayed: bool = False


# ---------------------------------------------------------------- names, keys, messages


def turn_step(turn: int) -> str:
    return f"turn-{turn}"


def call_step(turn: int, index: int) -> str:
    return f"turn-{turn}/call-{index}"


def parse_step(name: str) -> tuple[int, int | None]:
    """(turn, call index or None) of a loop step's name; ``ValueError`` for any other name."""
    head, _, tail = name.partition("/")
    if not head.startswith("turn-") or not head[5:].isdigit():
        raise ValueError(f"{name!r} is not a step of the agent loop (turn-<n> or turn-<n>/call-<i>)")
    if not tail:
        return int(head[5:]), None
    if not tail.startswith("call-") or not tail[5:].isdigit():
        raise ValueError(f"{name!r} is not a step of the agent loop (turn-<n> or turn-<n>/call-<i>)")
    return int(head[5:]), int(tail[5:])


def same_error_limit(name: str) -> int | None:
    """The ``durable_agents.steps.retry.StepLedger.same_error_limit`` of loop step ``name``, for every engine: a turn
    asks with the same window on every attempt, so an error that comes back word for word ``SAME_ERROR_LIMIT``
    times in a row is the model's answer to that window and stops the run; a call's request goes to the
    provider, whose errors keep the step's whole budget (None)."""
    return SAME_ERROR_LIMIT if parse_step(name)[1] is None else None


def call_id_digest(call_id: str) -> str:
    return hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def tool_key(run_id: str, turn: int, index: int, call_id: str) -> str:
    """The idempotency key of the ``index``-th call of turn ``turn`` (see the module docstring)::

        agentlab/<run id>/turn-<n>/call-<i>-<first 16 hex of sha256(call id)>

    At most 8 + 64 + 40 characters of printable ASCII: within the provider's key rule."""
    if not run_id or turn < 1 or index < 0:
        raise ValueError("tool_key needs a run id, a turn from 1 and a call index from 0")
    return f"{KEY_PREFIX}/{run_id}/{call_step(turn, index)}-{call_id_digest(call_id)}"


_SAFE_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def window_call_ids(turn: int, calls: Sequence[AskedCall]) -> list[str]:
    """The ids the window gives a turn's calls, and their results' ``tool_call_id``: the model's own when
    it is 1-64 characters of letters, digits, ``_`` and ``-`` and unique in its turn (so a real model sees
    its ids back), else ``call_<turn>_<index>``. Memory refuses a message whose calls share an id; the
    record keeps the ids as the model gave them."""
    seen = [c.id for c in calls]
    out = []
    for index, call in enumerate(calls):
        ok = 1 <= len(call.id) <= 64 and set(call.id) <= _SAFE_ID and seen.count(call.id) == 1
        out.append(call.id if ok else f"call_{turn}_{index}")
    return out


Chat = dict[str, Any]
WindowOf = Callable[["LoopInputs", Sequence[tuple[str, Chat]]], list[Chat]]
"""Given a run's inputs and its messages in order (``(message id, chat dict)``, the first pinned: the system
instructions), the prompt memory's window gives under the run's bounds. The engine supplies it."""


def system_message(prompt: str = LOOP_SYSTEM_PROMPT) -> tuple[str, Chat]:
    """The window's first message, pinned: the run's system instructions (this code's unless the run
    recorded its own)."""
    return "system", {"role": "system", "content": prompt}


def task_message(inputs: LoopInputs) -> tuple[str, Chat]:
    return "task", {"role": "user", "content": inputs.task}


def start_tokens(task: str, count: Callable[[Chat], int], prompt: str = LOOP_SYSTEM_PROMPT) -> int:
    """What a run's window holds before its first turn (the system instructions and the task), counted by
    ``count`` (the engine's: ``durable_agents.memory.chat_tokens``); ``check_loop_inputs``'s ``start_tokens``."""
    return count(system_message(prompt)[1]) + count({"role": "user", "content": task})


def turn_message(result: TurnResult | Mapping[str, Any]) -> tuple[str, Chat]:
    """A recorded turn as the window's assistant message (id ``turn-<n>``)."""
    turn, content, calls = _turn_fields(result)
    chat: Chat = {"role": "assistant", "content": content}
    if calls:
        ids = window_call_ids(turn, calls)
        chat = {"role": "assistant", "content": content or None, "tool_calls": [
            {"id": ids[i], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]}
    return turn_step(turn), chat


def result_message(turn: TurnResult | Mapping[str, Any], result: ToolResult | Mapping[str, Any]) -> tuple[str, Chat]:
    """A recorded tool result as the window's tool message (id ``turn-<n>/call-<i>``), answering its call's
    id as ``window_call_ids`` gave it."""
    number, _, calls = _turn_fields(turn)
    index = _get(result, "index")
    return call_step(number, index), {"role": "tool", "tool_call_id": window_call_ids(number, calls)[index],
                                      "content": _get(result, "content")}


def _get(value: Any, name: str) -> Any:
    return value[name] if isinstance(value, Mapping) else getattr(value, name)


def as_call(value: AskedCall | Mapping[str, Any]) -> AskedCall:
    return value if isinstance(value, AskedCall) else AskedCall(value["id"], value["name"], value["arguments"],
                                                                value.get("refused") or "", value.get("approval"))


def _turn_fields(result: TurnResult | Mapping[str, Any]) -> tuple[int, str, list[AskedCall]]:
    return _get(result, "turn"), _get(result, "content"), [as_call(c) for c in _get(result, "calls")]


# ---------------------------------------------------------------- the plan


class LoopPlan:
    """The steps of one loop run, decided as it goes (see the module docstring).

    ``results`` below maps a step's name to its recorded result (a ``TurnResult``/``ToolResult`` or its
    JSON dict: both read the same). Pure: no clock, no I/O (the Temporal workflow uses it in workflow code).
    """

    def __init__(self, inputs: LoopInputs, window_of: WindowOf) -> None:
        self.inputs = inputs
        self.window_of = window_of

    @staticmethod
    def first() -> str:
        return turn_step(1)

    @staticmethod
    def after(name: str, result: Any) -> list[str]:
        """The steps a recorded ``result`` of step ``name`` adds to the plan: a turn's calls then the next
        turn (none for a turn without calls: the run is complete); nothing for a call."""
        turn, index = parse_step(name)
        if index is not None:
            return []
        calls = _get(result, "calls")
        if not calls:
            return []
        return [call_step(turn, i) for i in range(len(calls))] + [turn_step(turn + 1)]

    def names(self, results: Mapping[str, Any]) -> list[str]:
        """Every step the recorded ``results`` have decided, in order (what a resume checks the record against)."""
        out = [self.first()]
        i = 0
        while i < len(out):
            name = out[i]
            if name in results:
                out.extend(self.after(name, results[name]))
            i += 1
        return out

    def messages(self, results: Mapping[str, Any], upto: str | None = None) -> list[tuple[str, Chat]]:
        """The run's messages in order, from the recorded results, stopping before step ``upto``."""
        out = [system_message(self.inputs.prompt), task_message(self.inputs)]
        turn_result: Any = None
        for name in self.names(results):
            if name == upto or name not in results:
                break
            turn, index = parse_step(name)
            if index is None:
                turn_result = results[name]
                out.append(turn_message(turn_result))
            else:
                out.append(result_message(turn_result, results[name]))
        return out

    def request(self, name: str, results: Mapping[str, Any]) -> TurnRequest | ToolRequest:
        """Step ``name``'s request, from the inputs and the recorded results before it."""
        turn, index = parse_step(name)
        if index is None:
            window = self.window_of(self.inputs, self.messages(results, upto=name))
            return TurnRequest(self.inputs.run_id, turn, window, self.inputs.max_turns, self.inputs.window_tokens,
                               self.inputs.tools, agent=self.inputs.agent)
        recorded = results[turn_step(turn)]
        return tool_request(self.inputs, turn, index, as_call(_get(recorded, "calls")[index]))

    @staticmethod
    def final_answer(results: Mapping[str, Any]) -> str | None:
        """The text of the last recorded turn when it asked for no tool (the run's answer), else None."""
        turns = [(parse_step(n)[0], r) for n, r in results.items() if parse_step(n)[1] is None]
        if not turns:
            return None
        _, last = max(turns, key=lambda t: t[0])
        return None if _get(last, "calls") else _get(last, "content")


def tool_request(inputs: LoopInputs, turn: int, index: int, call: AskedCall) -> ToolRequest:
    return ToolRequest(inputs.run_id, turn, index, call, tool_key(inputs.run_id, turn, index, call.id),
                       inputs.email, inputs.start_id, inputs.agent, dict(inputs.params) if inputs.params else None)


# ---------------------------------------------------------------- the two step functions


async def model_turn(req: TurnRequest, deps: StepDeps | None, agent: Agent | None = None) -> TurnResult:
    """Ask the model for turn ``req.turn`` on ``req.window``. No external effect. The answer is checked and
    recorded as ``recorded_calls`` says: a call the model got wrong is refused back to it, nothing applied.

    What fails the run instead (a ``PermanentError``, naming the turn):

    - the turn limit reached with tools still asked for (the run's stated end);
    - a call without a name or arguments as text: not the model's words but its client's parse of them
      (``durable_agents.drafting.openai_compat`` gives both as text), so a bug to fix, not a mistake to tell the model;
    - the answer's text breaking the multi-line text rule or over ``MAX_CONTENT_CHARS``: the loop gives
      the model back only its tool results, so a text has nothing to be refused through (refusing it would
      need a message of a new kind in every engine's record), and a model that writes terminal control
      sequences into its answer is broken or steered by what it read: an operator should look.

    ``agent``: the run's (None: the refund agent); its model asks, or the process's (``deps.agent``) for an
    agent declared without one."""
    toolbox = agent.tools if agent is not None else TOOLBOX
    model = agent.model if agent is not None and agent.model is not None else (deps.agent if deps else None)
    if model is None:
        raise PermanentError("this process has no model for the agent loop: declare the agent with one "
                             "(durable_agents.Agent(model=...)) or build the worker's dependencies with "
                             "durable_agents.wiring.deps_from_env (LLM_BASE_URL, LLM_MODEL)")
    if deps is not None:
        await pace(deps)  # LAB_STEP_SECONDS: slow enough to watch, or to kill by hand
    tools = req.tools if req.tools is not None else toolbox.specs()
    answer = await model.turn(req.window, tools, labels={"run": req.run_id, "turn": str(req.turn)})
    content = answer.content or ""
    where = f"the model's turn {req.turn} ({model.name}) was refused"
    for call in answer.tool_calls:
        if not isinstance(call.id, str) or not isinstance(call.name, str) or not isinstance(call.arguments, str):
            raise PermanentError(f"{where}: a tool call needs an id, a name and its arguments as text; the "
                                 f"model client ({model.name}) gave another type")
    try:
        check_text("the answer", content[:MAX_CONTENT_CHARS + 1], multiline=True, what_to_do="")
    except InputError as err:
        raise PermanentError(f"{where}: {err}") from None
    if len(content) > MAX_CONTENT_CHARS:
        raise PermanentError(f"{where}: its text is {len(content)} characters; at most {MAX_CONTENT_CHARS}")
    calls = recorded_calls([AskedCall(c.id, c.name, c.arguments) for c in answer.tool_calls], req.window_tokens,
                           toolbox)
    if calls and req.turn >= req.max_turns:
        asked = ", ".join(c.name for c in calls)
        raise PermanentError(f"{TURN_LIMIT} {req.max_turns} reached: the model still asked for tools ({asked}) "
                             f"at turn {req.turn}; none of them ran. Start a new run (a new RUN_ID) with a higher "
                             "turn limit, or give the model a task it can finish in fewer turns")
    # The model answered; nothing of it is recorded yet. A kill here: this turn is asked again.
    crash_point("turn:after_answer")
    return TurnResult(turn=req.turn, content=content, calls=calls, model=model.name,
                      prompt_messages=len(req.window))


def arguments_room(window_tokens: int, calls: int) -> int:
    """The UTF-8 bytes the arguments of a turn of ``calls`` calls may take together in a window of
    ``window_tokens``: what ``WINDOW_RESERVE_TOKENS`` and ``CALL_RESERVE_TOKENS`` leave. Memory's estimate
    of a text is never above its UTF-8 bytes (at most a token a character, and half a token an extra byte:
    ``durable_agents.memory.tokens``), so calls within the room always enter the window with the system instructions:
    memory's tool-call arguments are never cut, and a turn that cannot enter the window would stop the run."""
    return window_tokens - WINDOW_RESERVE_TOKENS - CALL_RESERVE_TOKENS * calls


def _json_text(text: str) -> bool:
    """No character in ``text`` that a JSON text may not hold raw: a control character other than tab, line
    feed and carriage return, or a lone surrogate."""
    if text.isascii() and text.isprintable():
        return True
    return not any((ord(c) < 0x20 and c not in "\t\n\r") or 0xD800 <= ord(c) <= 0xDFFF for c in text)


def recorded_calls(asked: Sequence[AskedCall], window_tokens: int | None = None,
                   tools: Toolbox = TOOLBOX) -> list[AskedCall]:
    """The calls of a turn as the record keeps them: bounded whatever the model wrote, and those it got
    wrong marked ``refused`` (their arguments ``{}``), to be answered ``refused`` with nothing applied
    (``run_tool``). A mistake in a call is the model's to correct, as a bad argument is:

    - more than ``MAX_CALLS_PER_TURN`` calls: the first 8 are kept, all refused (none runs: the model
      chooses again which 8 matter), the reason giving the count;
    - an id empty or over ``MAX_CALL_ID_CHARS``: refused, kept cut (it enters the key only as a digest);
    - a name over ``MAX_TOOL_NAME_CHARS`` or outside letters, digits, ``_`` and ``-``: no tool has it;
      refused and kept as ``unknown_tool`` (the reason quotes it);
    - arguments over ``MAX_ARGUMENTS_CHARS``;
    - with ``window_tokens`` (the run's window bound) given, arguments that with the turn's
      earlier calls' exceed ``arguments_room``: they could not enter the prompt window, so the run could
      not go on; refused, saying to send less."""
    refuse_all = ""
    if len(asked) > MAX_CALLS_PER_TURN:
        refuse_all = (f"this turn asks for {len(asked)} tool calls; at most {MAX_CALLS_PER_TURN} run in a "
                      f"turn, so none of this turn's calls ran: ask for at most {MAX_CALLS_PER_TURN} at a time")
    kept = asked[:MAX_CALLS_PER_TURN]
    room = None if window_tokens is None else arguments_room(window_tokens, len(kept))
    used = 0
    out = []
    for call in kept:
        call_id, name, size = call.id[:MAX_CALL_ID_CHARS], call.name, len(call.arguments)
        if not (len(name) <= MAX_TOOL_NAME_CHARS and name and set(name) <= _SAFE_ID):
            name = "unknown_tool"
        bytes_ = len(call.arguments.encode("utf-8", "surrogatepass"))
        if refuse_all:
            why = refuse_all
        elif not 1 <= len(call.id) <= MAX_CALL_ID_CHARS:
            why = f"a tool call id must be 1-{MAX_CALL_ID_CHARS} characters; this one has {len(call.id)}"
        elif name != call.name:
            why = tools.unknown(call.name)
        elif not _json_text(call.arguments):
            # No call's arguments; and such a character costs a payload more than memory counts of it.
            why = f"the arguments of {name} are not JSON (a control character or a lone surrogate); give a JSON object"
        elif size > MAX_ARGUMENTS_CHARS:
            why = (f"the arguments of {name} are {size} characters; at most {MAX_ARGUMENTS_CHARS} (an email's "
                   f"body at most {MAX_LOOP_BODY_CHARS}): nothing was applied; send less")
        elif room is not None and used + bytes_ > room:
            why = (f"the arguments of {name} ({bytes_} bytes) do not fit this run's prompt window of "
                   f"{window_tokens} tokens with this turn's other calls: at most {max(room, 0)} bytes of "
                   "arguments in a turn; nothing was applied; send less, or spread it over turns")
        else:
            used += bytes_
            out.append(AskedCall(call_id, name, call.arguments, approval=_approval_of(tools, name, call.arguments)))
            continue
        out.append(AskedCall(call_id, name, "{}", why))
    return out


def _approval_of(tools: Toolbox, name: str, arguments: str) -> dict[str, Any] | None:
    """What a call's turn records of its wait for a person: its tool's ``Approval`` when the rule says the
    call waits (asked of the checked arguments), else None; None for arguments its tool refuses (the call is
    refused when it runs, nothing to approve)."""
    tool = tools.get(name)
    if tool is None or tool.approval is None:
        return None
    try:
        checked = tools.check(name, arguments)
    except ToolRefused:
        return None
    return tool.approval.recorded() if tool.approval.applies(checked) else None


def refused_call(req: ToolRequest, reason: str) -> ToolResult:
    """The recorded result of a call refused back to the model with nothing applied: ``reason`` is what the
    model reads (a person's denial, a wait that expired, arguments its tool refused)."""
    return _refused(req, reason)


def _refused(req: ToolRequest, reason: str) -> ToolResult:
    return refused_result(req.turn, req.index, req.call.name, reason)


def refused_result(turn: int, index: int, name: str, reason: str) -> ToolResult:
    """A refused call's recorded result, as every engine writes it (and a history reader rebuilds it: a call a
    person denied is refused in workflow code, with no activity)."""
    return ToolResult(turn, index, name[:64], "refused", json.dumps({"error": reason[:MAX_REASON_CHARS]},
                                                                    ensure_ascii=False))


def checked_arguments(call: AskedCall, tools: Toolbox = TOOLBOX) -> dict[str, Any] | str:
    """The call's arguments, parsed and held to its tool's declaration (``TOOLBOX``: duplicate keys refused
    first, then its pydantic model); or the reason they are refused, said so the model can correct it (and
    safe to print: the model's text is quoted through ``repr``)."""
    try:
        return tools.check(call.name, call.arguments).model_dump()
    except ToolRefused as err:
        return err.reason


CALL_ATTEMPT: ContextVar[int | None] = ContextVar("call_attempt", default=None)
"""The engine's attempt number of the call running in this task, for an engine whose step functions take a
request and deps only (the run record's runner and DBOS set it around each attempt); ``run_tool``'s
``attempt`` wins when given (Temporal's activity)."""


async def run_tool(req: ToolRequest, deps: StepDeps | None, agent: Agent | None = None, services: Any = None,
                   attempt: int | None = None) -> ToolResult:
    """Run one recorded tool call through its declared handler (the tools of ``agent``, the run's; None: the
    refund agent's, ``TOOLBOX``). Refused arguments, an unknown tool and a request the tool's service refuses
    give a ``refused`` result, nothing applied; a transient failure raises (the engine retries with the same
    key); a key held by another request (``IdempotencyConflict``) fails the run. The handler is given
    ``services`` (the agent's, as the process built them; None: ``deps``), the run's parameters and the
    engine's ``attempt`` number when it has one (``CALL_ATTEMPT`` otherwise): a retry of a tool with a lookup
    asks its service first (``durable_agents.Toolbox.call``)."""
    if deps is not None:
        await pace(deps)
    if req.call.refused:
        return _refused(req, req.call.refused)
    toolbox = agent.tools if agent is not None else TOOLBOX
    name = req.call.name
    params = {**(req.params or {}), "start_id": req.start_id}
    if req.customer_email:
        params["email"] = req.customer_email
    context = ToolContext(req.run_id, req.turn, req.index, call_id=req.call.id,
                          attempt=attempt if attempt is not None else CALL_ATTEMPT.get(),
                          idempotency_key=req.idempotency_key, params=params,
                          services=services if services is not None else deps)
    try:
        out = await toolbox.call(name, req.call.arguments, context)
    except ToolRefused as err:
        return _refused(req, err.reason)
    kind = toolbox.effects.get(name)
    if kind is None:
        # A read-only call ran; its result is not recorded yet (a kill here runs it again: harmless only if it
        # really is read-only, which the kill matrix checks with the user's probe).
        crash_point(f"tool:{name}:after_call")
        # A read-only call's result, written as the loop always wrote it (ASCII JSON).
        return ToolResult(req.turn, req.index, name, "ok", json.dumps(out.content))
    # Applied (or replayed) at the provider; the call's result is not recorded yet.
    crash_point(f"tool:{name}:after_effect")
    return ToolResult(req.turn, req.index, name, "ok", json.dumps(out.content, ensure_ascii=False),
                      idempotency_key=req.idempotency_key, kind=kind, effect_id=out.effect_id,
                      replayed=out.replayed)


TURN_LIMIT = "turn limit of"
"""The words a run's error holds when it stopped at its turn limit (``model_turn``)."""


def reached_turn_limit(error: str | None) -> bool:
    """A run that failed this way stops again at the same turn under the same limit: a retry is refused."""
    return bool(error) and TURN_LIMIT in str(error)


ONE_ROUND_TOKENS = 200
"""Memory's estimate of one round at the least a run needs: a turn of one ``lookup_order`` call (its
framing with a 64-character id and name, a 64-character order id, the truncation marker as its text) and
the lookup's result (147 at most; tests/test_loop_steps.py holds it to memory's count)."""


MIN_WINDOW_TOKENS = 311
"""The fewest window tokens any run can start with: memory's count of this code's system instructions (106),
the shortest task (one character: 5) and one round (``ONE_ROUND_TOKENS``, 200). Stated, not counted here
(``steps`` imports nothing of memory); tests/test_loop_steps.py holds it to memory's count, so a longer
prompt moves it. A given task needs more: its own count (``check_loop_inputs``' ``start_tokens``)."""
MIN_WINDOW_TOKENS_BEFORE = 200
"""The floor the range check stated before ``MIN_WINDOW_TOKENS``, which the workflow keeps: its start check,
with the run's own prompt and task, refuses whatever the real floor would, and a floor that moved with this
code's prompt would decide a recorded run otherwise on replay."""


def check_loop_inputs(max_turns: Any, window_tokens: Any = DEFAULT_WINDOW_TOKENS,
                      window_messages: Any = DEFAULT_WINDOW_MESSAGES,
                      start_tokens: int | None = None,
                      max_window_tokens: int = MAX_WINDOW_TOKENS,
                      min_window_tokens: int = MIN_WINDOW_TOKENS) -> tuple[int, int, int]:
    """The loop's numbers, checked (``InputError`` saying what to give otherwise). ``start_tokens``: memory's
    count of the system instructions and the task (``system_message``, ``task_message``; the caller counts,
    ``steps`` imports nothing of memory). Given, the window must hold them and one round
    (``ONE_ROUND_TOKENS``): memory pins only the system instructions, so a window that cannot would evict
    the task before the model's first tool result, and a model that needs it would fail on every attempt.
    Whatever the task, the window tokens are at least ``min_window_tokens`` (``MIN_WINDOW_TOKENS``: what
    the shortest task needs; the workflow passes ``MIN_WINDOW_TOKENS_BEFORE``).
    ``max_window_tokens``: ``MAX_WINDOW_TOKENS`` (what a payload holds); a run recorded before that cap
    replays under the one it started with, ``WINDOW_TOKENS_BEFORE_CAP``."""
    for name, value, low, high in (("max turns", max_turns, 1, MAX_TURNS_LIMIT),
                                   ("window tokens", window_tokens, min_window_tokens, max_window_tokens),
                                   ("window messages", window_messages, 4, 100_000)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            why = ""
            if name == "window tokens" and isinstance(value, int) and not isinstance(value, bool) and value < low:
                why = (f": the window must hold the system instructions and the task ({low - ONE_ROUND_TOKENS} "
                       f"tokens at the least, a one-character task) and one round of a tool call and its result "
                       f"({ONE_ROUND_TOKENS}); give at least {low} window tokens, more for a longer task (the "
                       f"default is {DEFAULT_WINDOW_TOKENS})")
            raise InputError(f"{name} must be a whole number from {low} to {high}, got {value!r}{why}")
    if start_tokens is not None and start_tokens + ONE_ROUND_TOKENS > window_tokens:
        need = start_tokens + ONE_ROUND_TOKENS
        raise InputError(f"window tokens of {window_tokens} cannot hold the system instructions and the task "
                         f"({start_tokens} tokens) and one round of a tool call and its result "
                         f"({ONE_ROUND_TOKENS}): give at least {need} window tokens, or a shorter task")
    return max_turns, window_tokens, window_messages


# ---------------------------------------------------------------- what decides a run, recorded with it

def loop_signature(tools: Toolbox | None = None) -> tuple[str, ...]:
    """What identifies the loop's shape to a run in flight, computed from this module itself: the steps a
    turn with two calls then a final turn decide (how steps are named and follow one another), a call's key
    for fixed values (how keys derive), and each tool with its effect kind and fields. Every engine records
    it when a run starts (the run record in ``runs.loop``, DBOS in its inputs, Temporal in
    ``LoopInput.loop``) and a run whose recorded signature is not this code's does not go on under it
    (``loop_changed``): the run record and DBOS refuse to resume it, Temporal parks it, the message naming
    both signatures, until code of its signature runs it.

    Not the system prompt, nor the tools' descriptions, nor the text rules: they change the words the model
    is asked with, not what a recorded turn means, so a run keeps them instead: every engine records them
    at the start (``instructions``) and asks every turn of the run with those (``LoopInputs.prompt``,
    ``tools``); a change there is a new agent for new runs only."""
    two_calls = {"calls": [{"id": "a", "name": "t", "arguments": "{}"}] * 2}
    names = LoopPlan(LoopInputs("run", "task", "a@example.com"), lambda inputs, messages: []).names(
        {turn_step(1): two_calls, turn_step(2): {"calls": []}})
    tools = TOOLBOX if tools is None else tools  # the refund agent's, read when asked
    return ("steps " + " ".join(names), "key " + tool_key("run", 1, 0, "call"), *tools.signature())


def recorded_effects(signature: Any) -> dict[str, str]:
    """Each tool with an effect and its kind, read from a run's recorded signature (its ``tool NAME:KIND:...``
    lines): what a reader of a run needs of its agent's tools without having the agent. A run recorded
    before signatures: the refund agent's (``EFFECT_OF_TOOL``)."""
    if not isinstance(signature, (list, tuple)):
        return dict(EFFECT_OF_TOOL)
    out = {}
    for line in signature:
        if isinstance(line, str) and line.startswith("tool "):
            name, _, rest = line[5:].partition(":")
            kind = rest.partition(":")[0]
            if kind:
                out[name] = kind
    return out


def loop_digest(signature: tuple[str, ...] | None = None) -> str:
    return hashlib.sha256("\n".join(signature or loop_signature()).encode()).hexdigest()[:10]


def loop_changed(recorded: Any, tools: Toolbox | None = None, agent: str = "") -> str | None:
    """Why this code, whose agent (``agent``, the refund agent for "") has ``tools``, cannot run a loop run
    whose inputs recorded the signature ``recorded``, or None (None too for a run recorded before
    signatures: it runs as it did)."""
    code = list(loop_signature(tools))
    if recorded is None or list(recorded) == code:
        return None
    who = f"agent {agent}" if agent else "an agent loop"
    return (f"the run was started by {who} of version {loop_digest(tuple(recorded))} "
            f"({'; '.join(recorded)}), and this code's is version {loop_digest(tuple(code))} ({'; '.join(code)})")


def instructions(agent: Agent | None = None) -> dict[str, Any]:
    """What a loop run records of what the model is told, at its start: its agent's instructions and tools
    (None: the refund agent's)."""
    agent = agent or REFUND_AGENT
    return {"prompt": agent.instructions, "tools": agent.tools.specs()}


def with_instructions(inputs: LoopInputs, recorded: Any) -> LoopInputs:
    """``inputs`` told what the run recorded (``instructions``: its ``prompt`` and ``tools``); as they are
    (this code's prompt and tools) for a run that recorded none."""
    if not isinstance(recorded, Mapping):
        return inputs
    prompt, tools = recorded.get("prompt"), recorded.get("tools")
    if not isinstance(prompt, str) or not prompt.strip() or not isinstance(tools, list):
        return inputs
    return replace(inputs, prompt=prompt, tools=tools)
