"""Lab step 4: bounded conversation memory and its eviction rule, watched.

    python -m lesson.memory_demo [--max-tokens N] [--max-messages N]

Appends a long support conversation (a pinned system message, then exchanges
with tool calls, ending in an agent loop of several tool rounds) to a small
``durable_agents.memory.InMemoryStore`` and prints, per append, what the rule evicted and
why; then the window that would go into the next prompt, and checks on it.

The rule (``durable_agents/memory/__init__.py``, docs/memory.md), in short: the oldest whole
exchange goes first; then, inside the newest exchange, its oldest block (a tool
call and its results are one block, never split), keeping the exchange's user
message while anything else but the newest block can go; pinned messages never
go. Exit code 0 if every check on the final window holds.
"""

from __future__ import annotations

import argparse
import json
import sys

from durable_agents.memory import EvictionEvent, InMemoryStore, MemoryPolicy, Message, ToolCall
from durable_agents.steps.controls import printable

CONVERSATION = "order-1234"


def conversation() -> list[Message]:
    """Four short exchanges, each with one tool round, then one long agent loop."""
    out: list[Message] = []
    for n in range(1, 5):
        call = f"call_{n}"
        out += [
            Message(f"t{n}/user", "user", f"Question {n}: where is the refund for order 123{n}?"),
            Message(f"t{n}/call", "assistant", "",
                    (ToolCall(call, "lookup_order", json.dumps({"order": 1230 + n})),)),
            Message(f"t{n}/result", "tool", json.dumps({"order": 1230 + n, "refund": "sent", "days": n}),
                    tool_call_id=call),
            Message(f"t{n}/reply", "assistant", f"The refund for order 123{n} was sent {n} day(s) ago."),
        ]
    out.append(Message("t5/user", "user", "Check every order I placed this year and refund the late ones."))
    for r in range(1, 5):
        call = f"call_5_{r}"
        out += [
            Message(f"t5/call{r}", "assistant", "", (ToolCall(call, "lookup_order", json.dumps({"page": r})),)),
            Message(f"t5/result{r}", "tool", json.dumps({"page": r, "orders": [1000 * r + i for i in range(8)]}),
                    tool_call_id=call),
        ]
    out.append(Message("t5/reply", "assistant", "All orders checked; two late refunds were issued."))
    return out


def no_orphans(window: list[Message]) -> bool:
    calls = {c.id for m in window for c in m.tool_calls}
    answered = {m.tool_call_id for m in window if m.role == "tool"}
    return answered <= calls and calls <= answered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lesson.memory_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=300, help="the window's token budget (default 300)")
    parser.add_argument("--max-messages", type=int, default=12, help="the window's message cap (default 12)")
    args = parser.parse_args(argv)

    events: list[EvictionEvent] = []
    policy = MemoryPolicy(max_tokens=args.max_tokens, max_messages=args.max_messages)
    store = InMemoryStore(policy, on_evict=events.append)
    print(f"policy: max_tokens={policy.max_tokens}, max_messages={policy.max_messages} (pinned included)")
    store.pin(CONVERSATION, Message("sys", "system", "You answer customers about their orders."))
    print("pinned  sys (system): never evicted")
    for message in conversation():
        events.clear()
        result = store.append(CONVERSATION, message)
        evicted = "; ".join(f"{e.reason}: {', '.join(e.message_ids)}" for e in events)
        print(f"append  {message.id:<11} {message.role:<9} {result.tokens:>4} tokens"
              + (f"  -> evicted ({evicted})" if evicted else ""))

    window = store.window(CONVERSATION)
    stats = store.stats(CONVERSATION)
    print(f"\nwindow for the next prompt ({stats.messages} messages, {stats.tokens} tokens):")
    for m in window:
        shown = m.content or ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        print(printable(f"  {m.id:<11} {m.role:<9} {shown[:70]}"))
    print(f"evicted in total: {stats.evicted_messages} messages, {stats.evicted_tokens} tokens, "
          f"in {stats.evictions} evictions")

    checks = [
        ("within both bounds", stats.tokens <= policy.max_tokens and stats.messages <= policy.max_messages),
        ("the pinned system message is first", bool(window) and window[0].id == "sys"),
        ("no tool result without its call, no call without its result", no_orphans(window)),
        ("the newest exchange kept its user message", any(m.id == "t5/user" for m in window)),
        ("the oldest exchange went first", all(not m.id.startswith("t1/") for m in window)),
    ]
    for label, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'} {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
