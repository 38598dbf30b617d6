"""Exercise 4's long exchange, played against the learner's ``BoundedMemory``
in a process of its own, with the rule checked after every append.

    python -m grader.memory_probe PATH/bounded_memory.py [--max-tokens N] [--appends N] [--seed S]

Prints one JSON object: ``{"ok": true, ...}`` with what was played, or
``{"ok": false, "rule": ..., "headline": ..., "expected": ..., "seen": ...,
"todo": ...}`` for the first breach. The grader (``grader.check_memory``) turns it
into its report. The learner's object is only called (``append``,
``window``); every judgement is made here from what those calls return,
counted with the lab's counter (``durable_agents.memory.tokens.approx_tokens``).

The exchange (seeded): a pinned system message, then thousands of user
messages, replies and tool rounds (an assistant message with one to three
calls, then each result), one user message larger than the whole budget, one
round pushed over the budget by a result, and ids appended a second time,
kept and evicted ones alike. A quarter of the rounds get their last result
late, blocks afterwards, often after the round was evicted (it must go on
arrival). A larger system message replaces the first (the rest is evicted
down to the budget), and a later one that would leave no room beside it is
refused (``ValueError``, the window as it was): the lab's rule for pinned
messages (``durable_agents.memory.window``, ``pin``).

The lab's own ``memory`` package is imported before the learner's module,
so ``durable_agents.memory.messages`` and ``durable_agents.memory.tokens`` import as usual; the learner's
module, and the object it builds, must not use the lab's finished window
(``durable_agents.memory.window``, ``durable_agents.memory.stores``, ``durable_agents.memory.sqlite_store``,
``durable_agents.memory.reader``): the exercise is to write it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import traceback
import types
from dataclasses import dataclass, field
from typing import Any

import durable_agents.memory  # noqa: F401 - loaded first, so the learner's imports of its messages find it
from durable_agents.memory.messages import Message, ToolCall
from durable_agents.memory.tokens import approx_tokens

FORBIDDEN = ("durable_agents.memory.window", "durable_agents.memory.stores", "durable_agents.memory.sqlite_store",
             "durable_agents.memory.reader", "durable_agents.runrecord")
ALLOWED = ("import Message and ToolCall from durable_agents.memory.messages, "
           "and approx_tokens from durable_agents.memory.tokens")


class Breach(Exception):
    def __init__(self, rule: str, headline: str, expected: str, seen: str, todo: int) -> None:
        super().__init__(headline)
        self.report = {"ok": False, "rule": rule, "headline": headline, "expected": expected, "seen": seen,
                       "todo": todo}


# ---------------------------------------------------------------- the finished answer is refused


def _forbidden(value: Any) -> str | None:
    """The forbidden module ``value`` comes from, if any."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
        return name if name == "memory" or name.startswith(FORBIDDEN) else None
    module = getattr(type(value) if not isinstance(value, type | types.FunctionType) else value, "__module__", "")
    return module if isinstance(module, str) and module.startswith(FORBIDDEN) else None


def refuse_finished_answer(module: types.ModuleType) -> None:
    for name, value in vars(module).items():
        source = _forbidden(value)
        if source and not name.startswith("__"):
            what = "the package `memory`, which holds the finished window" if source == "memory" else source
            raise Breach("finished-answer", f"bounded_memory.py uses `{name}` from {what}: the lab's finished "
                         "memory. Exercise 4 asks you to write the window yourself",
                         expected=ALLOWED, seen=f"`{name}` in bounded_memory.py", todo=7)


def refuse_finished_parts(obj: Any, path: str = "the memory", depth: int = 0) -> None:
    """No attribute of the learner's object (to a few levels) is a piece of the finished memory."""
    source = _forbidden(obj)
    if source:
        raise Breach("finished-answer", f"{path} is a {type(obj).__name__} from {source}: the lab's finished "
                     "memory. Exercise 4 asks you to write the window yourself", expected=ALLOWED,
                     seen=f"{path}: {type(obj).__module__}.{type(obj).__name__}", todo=7)
    if depth >= 3:
        return
    if isinstance(obj, dict):
        for key, value in list(obj.items())[:50]:
            refuse_finished_parts(value, f"{path}[{key!r}]", depth + 1)
    elif isinstance(obj, list | tuple | set):
        for i, value in enumerate(list(obj)[:50]):
            refuse_finished_parts(value, f"{path}[{i}]", depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type | types.ModuleType | types.FunctionType):
        for key, value in vars(obj).items():
            refuse_finished_parts(value, f"{path}.{key}", depth + 1)


# ---------------------------------------------------------------- the exchange


@dataclass
class Block:
    number: int
    messages: list[Message] = field(default_factory=list)  # appended so far
    refused: bool = False  # too large to keep on its own: never in the window

    def tokens(self) -> int:
        return sum(approx_tokens(m) for m in self.messages)


def words(rng: random.Random, low: int, high: int) -> str:
    n = rng.randint(low, high)
    return " ".join(rng.choice(("refund", "order", "ticket", "email", "customer", "please", "shipping",
                                "the", "a", "of", "status", "thanks")) for _ in range(n))


@dataclass(frozen=True)
class Step:
    """One append of the exchange: the message, the block it belongs to (0: a system message), and whether it
    is a repeat of an id appended before."""

    message: Message
    block: int
    repeat: bool = False


def sized(id: str, text: str, tokens: int) -> Message:
    """A pinned system message of exactly ``tokens`` (the lab's counter): padded one character at a time."""
    message = Message(id=id, role="system", content=text, pinned=True)
    while approx_tokens(message) < tokens:
        message = Message(id=id, role="system", content=message.content + "!", pinned=True)
    return message


def exchange(rng: random.Random, appends: int, budget: int) -> list[Step]:
    """The appends, in order. Beside the everyday messages: a larger system message replacing the first one, a
    later one that would leave no room (``refused_system``), and some tool results held back until blocks
    later, often after their round was evicted."""
    out = [Step(Message(id="sys", role="system", content="You are a support agent. " + words(rng, 5, 15),
                        pinned=True), 0)]
    block = 0
    oversize_at, push_over_at = appends // 2, (appends * 2) // 3
    replace_at, refuse_at = appends // 4, (appends * 3) // 4
    held: list[tuple[int, Step]] = []  # (the block after which it arrives, the late result)
    while len(out) < appends:
        block += 1
        for due in [h for h in held if h[0] <= block]:
            held.remove(due)
            out.append(due[1])
        kind = rng.random()
        if len(out) >= replace_at and replace_at:  # a larger system message replaces the first
            for i in range(40):  # short messages first: the window then sits within one of them of the budget
                out.append(Step(Message(id=f"m{block}-short{i}", role="user", content=words(rng, 3, 5)), block))
                block += 1
            out.append(Step(Message(id="sys-2", role="system", content="You are a support agent. "
                                    + words(rng, 40, 60), pinned=True), 0))
            replace_at = 0
        elif len(out) >= refuse_at and refuse_at:  # one that would leave no room: refused
            out.append(Step(sized("sys-too-large", "You are a support agent. " + words(rng, 5, 15), budget), 0))
            refuse_at = 0
        elif len(out) >= oversize_at and oversize_at:  # one user message larger than the whole budget
            out.append(Step(Message(id=f"m{block}-huge", role="user", content=words(rng, budget, budget + 50)),
                            block))
            oversize_at = 0
        elif kind < 0.35:
            out.append(Step(Message(id=f"m{block}-user", role="user", content=words(rng, 3, 60)), block))
        elif kind < 0.6:
            out.append(Step(Message(id=f"m{block}-reply", role="assistant", content=words(rng, 3, 80)), block))
        else:
            calls = tuple(ToolCall(id=f"c{block}-{i}", name=rng.choice(("lookup_order", "refund", "search")),
                                   arguments=json.dumps({"q": words(rng, 1, 8)})) for i in range(rng.randint(1, 3)))
            out.append(Step(Message(id=f"m{block}-call", role="assistant", content="", tool_calls=calls), block))
            late = rng.random() < 0.25  # its last result arrives blocks later, its round often evicted by then
            for i, call in enumerate(calls):
                push = len(out) >= push_over_at and push_over_at and i == len(calls) - 1
                size = (budget, budget + 20) if push else (2, 50)
                result = Step(Message(id=f"m{block}-result{i}", role="tool", content=words(rng, *size),
                                      tool_call_id=call.id), block)
                if late and not push and i == len(calls) - 1:
                    held.append((block + rng.randint(1, 25), result))
                else:
                    out.append(result)
                if push:
                    push_over_at = 0
        if rng.random() < 0.01 and len(out) > 10:  # an id appended a second time
            again = out[rng.randrange(1, len(out) - 1)]
            if not again.message.pinned:
                out.append(Step(again.message, again.block, repeat=True))
    out += [h[1] for h in held]  # every late result arrives
    return out


# ---------------------------------------------------------------- the rule, after every append


def describe(window: list[Message]) -> str:
    ids = [m.id for m in window]
    return f"{len(ids)} message(s): {', '.join(ids[:6])}{' ...' if len(ids) > 6 else ''}"


def refuse_pinned(mem: Any, message: Message, before: list[Message], where: str, budget: int) -> None:
    """A pinned message that would leave no room under the budget (the lab's rule, ``durable_agents.memory.window``'s
    ``pin``): refused with ValueError, the window left as it was."""
    tokens = approx_tokens(message)
    try:
        mem.append(message)
    except ValueError:
        pass
    except Exception as err:  # noqa: BLE001 - the learner's code raised something else: say what
        raise Breach("pinned-refused", f"after {where}, a pinned message of {tokens} tokens under a budget of "
                     f"{budget}, append raised {type(err).__name__}: {err}", expected="a pinned message that would "
                     "leave no room for anything else refused with ValueError, the window left as it was",
                     seen=f"{type(err).__name__}: {err}", todo=7) from None
    else:
        raise Breach("pinned-refused", f"after {where}, a pinned message of {tokens} tokens, which leaves no room "
                     f"under the budget of {budget}, was accepted", expected="refused with ValueError, the window "
                     "left as it was (durable_agents/memory/window.py refuses such a pin)",
                     seen=describe(list(mem.window())),
                     todo=7)
    window = list(mem.window())
    if [m.id for m in window] != [m.id for m in before]:
        raise Breach("pinned-refused", f"after {where}, a pinned message was refused (ValueError) but the window "
                     "changed", expected=f"the window as it was: {describe(before)}", seen=describe(window), todo=7)


def play(memory_cls: Any, budget: int, appends: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    stream = exchange(rng, appends, budget)
    mem = memory_cls(budget)
    blocks: dict[int, Block] = {}
    gone: set[str] = set()  # ids that were in the window and left it
    before: list[Message] = []
    system = stream[0].message
    room = budget - approx_tokens(system)
    counts = {"appends": 0, "tool rounds": 0, "late results": 0, "evicted": 0}
    for index, step in enumerate(stream, start=1):
        message, number, repeat = step.message, step.block, step.repeat
        where = f"append #{index} ({message.role} {message.id}{', appended a second time' if repeat else ''})"
        if message.pinned and not repeat and approx_tokens(message) >= budget:
            refuse_pinned(mem, message, before, where, budget)
            counts["appends"] += 1
            continue
        late_of = None  # a tool result arriving after its round left the window
        if not repeat and number > 0:
            block = blocks.setdefault(number, Block(number))
            if message.role == "tool" and (block.refused or any(m.id in gone for m in block.messages)):
                late_of = block
                counts["late results"] += 1
            block.messages.append(message)
            if block.tokens() > room:
                block.refused = True
            counts["tool rounds"] += bool(message.tool_calls)
        replaced = system if message.pinned and not repeat and message.id != system.id else None
        if replaced is not None:
            system, room = message, budget - approx_tokens(message)
        try:
            returned = mem.append(message)
        except Exception as err:
            if late_of is None:
                raise
            raise Breach("late", f"after {where}, a result of call {message.tool_call_id} whose round "
                         f"({late_of.messages[0].id}) had already been evicted, append raised {type(err).__name__}: "
                         f"{err}", expected="a late result of an evicted round evicted on arrival (rules 3 and 5), "
                         "its id returned by append", seen=f"{type(err).__name__}: {err}", todo=7) from None
        window = list(mem.window())
        counts["appends"] += 1
        ids = [m.id for m in window]
        total = sum(approx_tokens(m) for m in window)
        if late_of is not None and message.id in ids:
            raise Breach("late", f"after {where}, the window holds {message.id}, a result of call "
                         f"{message.tool_call_id}, whose round ({late_of.messages[0].id}) had already been evicted: "
                         "a result kept without its call", expected="a late result of an evicted round evicted on "
                         "arrival (rules 3 and 5), its id returned by append", seen=describe(window), todo=7)
        if replaced is not None and total > budget:
            raise Breach("pinned-evicts", f"after {where}, a larger system message replacing {replaced.id}, the "
                         f"window holds {total} tokens, over the budget of {budget}: a pinned message evicts the "
                         "rest down to the budget", expected=f"whole blocks evicted, oldest first, until the window "
                         f"fits {budget} tokens with the new system message", seen=describe(window), todo=8)
        if total > budget:
            raise Breach("budget", f"after {where}, the window holds {total} tokens; the budget is {budget}",
                         expected=f"at most {budget} tokens (durable_agents.memory.tokens.approx_tokens), "
                                  "after every append",
                         seen=describe(window), todo=8)
        if not window or window[0].id != system.id:
            raise Breach("pinned", f"after {where}, the pinned system message ({system.id}) is not first in the "
                         "window", expected="the newest pinned system message first, never evicted (a later one "
                         "replaces it)", seen=describe(window), todo=7 if replaced is not None else 8)
        for m in window:
            if m.role == "tool" and not any(m.tool_call_id in {c.id for c in w.tool_calls} for w in window):
                raise Breach("split", f"after {where}, the window holds tool result {m.id} without its call "
                             f"{m.tool_call_id}: a tool call and its results were split",
                             expected="a call and its results kept or evicted together",
                             seen=describe(window), todo=7)
        kept_blocks = []
        for b in blocks.values():
            present = [m.id for m in b.messages if m.id in ids]
            if present and len(present) != len(b.messages):
                missing = [m.id for m in b.messages if m.id not in ids]
                raise Breach("split", f"after {where}, the window holds {', '.join(present)} but not "
                             f"{', '.join(missing)} of the same tool round: a block was split",
                             expected="a call and its results kept or evicted together", seen=describe(window),
                             todo=7)
            if present:
                kept_blocks.append(b)
        back = [i for i in ids if i in gone]
        if back:
            raise Breach("once", f"after {where}, {', '.join(back)} is back in the window after it was evicted",
                         expected="an evicted message never returned again (an id appended again is ignored)",
                         seen=describe(window), todo=8)
        refused_kept = [b for b in kept_blocks if b.refused]
        if refused_kept:
            b = refused_kept[0]
            raise Breach("oversize", f"after {where}, the window keeps {b.messages[0].id}, a block of "
                         f"{b.tokens()} tokens: more than the budget leaves beside the system message ({room})",
                         expected="a block too large to keep on its own evicted at once", seen=describe(window),
                         todo=8)
        accepted = [b for b in blocks.values() if not b.refused]
        k = len(kept_blocks)
        if kept_blocks != accepted[len(accepted) - k:]:
            older = kept_blocks[0].messages[0].id
            raise Breach("oldest-first", f"after {where}, the window keeps {older} but a newer block went",
                         expected="whole blocks evicted oldest first: the window keeps the newest blocks that fit",
                         seen=describe(window), todo=8)
        left = [m.id for m in before if m.id not in ids]
        arriving = blocks.get(number) if number > 0 and not repeat else None
        went = [b for b in blocks.values() if b is not arriving and any(m.id in left for m in b.messages)]
        if arriving is not None and arriving.refused and went:
            raise Breach("too-much", f"after {where}, {went[0].messages[0].id} was evicted for a block too large "
                         f"to keep ({arriving.tokens()} tokens, more than the {room} the budget leaves)",
                         expected="a block too large to keep goes alone, at once: nothing older goes for it",
                         seen=describe(window), todo=8)
        # The last block evicted (oldest first: the newest of those that went, the arriving one's round included
        # when it went for the budget) must have been needed: put back, it would not fit.
        evicted_blocks = [b for b in blocks.values() if any(m.id in left for m in b.messages)
                          or (b is arriving and late_of is None and not b.refused and message.id not in ids)]
        last = evicted_blocks[-1] if evicted_blocks else None
        if last is not None and total + last.tokens() <= budget:
            raise Breach("too-much", f"after {where}, {last.messages[0].id} ({last.tokens()} tokens) "
                         f"was evicted although it fits: the window holds {total} of {budget}",
                         expected="blocks evicted only while the window is over the budget",
                         seen=describe(window), todo=8)
        said = list(returned or [])
        arrived_and_went = [] if repeat or message.id in ids else [message.id]
        if sorted(said) != sorted(left + arrived_and_went):
            missing = sorted(set(left + arrived_and_went) - set(said))
            extra = sorted(set(said) - set(left + arrived_and_went))
            raise Breach("returned", f"after {where}, append returned {said[:6]} but "
                         f"{sorted(left + arrived_and_went)[:6]} left the window"
                         + (f"; not returned: {missing[:6]}" if missing else "")
                         + (f"; returned but still there (or never in): {extra[:6]}" if extra else ""),
                         expected="append returns the ids it evicted, the arriving one included if it went",
                         seen=f"returned {said[:6]}", todo=8)
        gone.update(left + arrived_and_went)
        counts["evicted"] += len(left) + len(arrived_and_went)
        before = window
    refuse_finished_parts(mem)
    return {"ok": True, "budget": budget, "seed": seed, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.memory_probe", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    try:
        spec = importlib.util.spec_from_file_location("bounded_memory", args.path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bounded_memory"] = module
        spec.loader.exec_module(module)
        refuse_finished_answer(module)
        result = play(module.BoundedMemory, args.max_tokens, args.appends, args.seed)
    except Breach as breach:
        result = breach.report
    except Exception:  # noqa: BLE001 - the learner's code raised: hand its traceback to the grader
        result = {"ok": False, "rule": "exception", "traceback": traceback.format_exc()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
