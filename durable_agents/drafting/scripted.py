"""An offline model for the agent loop: it chooses its tools from the conversation, by a fixed script.

Not a model, a stand-in, as ``OfflineModel`` is for the draft: it lets the
loop run with no network, and decides only from what a real model would see,
the window it is given (never from a counter or a file), so a window that
lost a block shows in what it does next.

The script, for a task that names orders (``A-1001``: a capital letter, a
dash and 3-8 digits; in the task's order, each once):

1. nothing done yet (the newest message is the task): ``lookup_order`` of
   the first order;
2. after a lookup: an order with something left to refund gets two calls in
   one turn, ``issue_refund`` of what is left then ``send_email`` telling the
   customer; an order refunded already (or unknown) is passed over: the next
   order's lookup, or the ticket after the last order;
3. after a refund and its email: the next order's lookup, or after the last
   order ``create_ticket`` summing up;
4. after the ticket: the final answer, with no tool call.

So a task of k orders with something left to refund takes 2k + 2 turns. It
reads only the task (kept in the window: memory keeps an exchange's opening
user message, ``memory``'s rule 2) and the newest tool round, so it makes
progress whatever the window lost. A task with no order gets a final answer
at once.

Tool call ids: deterministic (a digest of the window and the call's place)
unless ``vary``; then, like a real model, random ids, and every answer's
words carry a number (``[answer 3]``), counting the answers this instance
gave: a turn asked again shows as different words.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from durable_agents.steps.limits import MAX_SUMMARY_CHARS
from durable_agents.steps.loop import AskedCall, ModelAnswer
from durable_agents.steps.refund_agent import REFUND_TOOLS

__all__ = ["ORDER_ID", "ScriptedModel", "orders_in"]

ORDER_ID = re.compile(r"\b[A-Z]-\d{3,8}\b")
LOOKUP, REFUND, EMAIL, TICKET = "lookup_order", "issue_refund", "send_email", "create_ticket"
"""The tools the script asks for, by the names the lab's agent declares them under (``REFUND_TOOLS``): a
tool renamed there without here stops this module at import, not a run at its first call."""
_UNDECLARED = [name for name in (LOOKUP, REFUND, EMAIL, TICKET) if name not in REFUND_TOOLS]
if _UNDECLARED:
    raise ImportError(f"durable_agents.drafting.scripted asks for {_UNDECLARED}, which "
                      "durable_agents.steps.refund_agent.REFUND_TOOLS does not "
                      f"declare (it declares {list(REFUND_TOOLS.names)}): rename them in "
                      "durable_agents/drafting/scripted.py too")
SUMMARY_CHARS = MAX_SUMMARY_CHARS - 20
"""The script's ticket summary, at most: the lab's agent declares 500 (``durable_agents.steps.refund_agent``), less room
for the tag of a varying script (`` [answer N]``)."""


def orders_in(task: str) -> list[str]:
    """The order ids a task names, in order, each once."""
    return list(dict.fromkeys(ORDER_ID.findall(task)))


class ScriptedModel:
    """The loop's offline model (see the module docstring). ``turn`` follows
    ``durable_agents.steps.ports.ToolModel``."""

    def __init__(self, *, vary: bool = False) -> None:
        self.vary = vary
        self.name = "scripted-varying" if vary else "scripted"
        self.answers = 0

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> ModelAnswer:
        return self.answer(messages)

    def answer(self, messages: list[dict]) -> ModelAnswer:
        """The script's answer to ``messages`` (synchronous: the stand-in server calls it in its thread)."""
        self.answers += 1
        tag = f" [answer {self.answers}]" if self.vary else ""
        task = _task(messages)
        orders = orders_in(task)
        round_ = _newest_round(messages)
        if round_ is None:
            if not orders:
                return ModelAnswer(f"I found no order number in your message, so I did nothing.{tag}")
            return self._calls(messages, [(LOOKUP, {"order_id": orders[0]})])
        names = [name for name, _, _ in round_]
        if TICKET in names:
            ticket = _field(round_, TICKET, "ticket_id") or "(no ticket)"
            # "Went through", not "handled": this script sees only the newest round, so it cannot tell an order
            # it refunded from one its lookup did not find (the record shows which).
            return ModelAnswer(f"Done: I went through the {_count(len(orders), 'order')} you named and recorded "
                               f"ticket {ticket}.{tag}")
        if names == [LOOKUP]:
            _, args, result = round_[0]
            order = args.get("order_id", "")
            total, refunded = result.get("total"), result.get("refunded")
            if isinstance(total, int) and isinstance(refunded, int) and total > refunded:
                left = total - refunded
                email = {"subject": f"Refund for order {order}{tag}",
                         "body": (f"Hello,\n\nWe refunded {_money(left)} for order {order}. It reaches your account "
                                  f"within a few days.{tag}\n\nKind regards,\nCustomer service")}
                return self._calls(messages, [(REFUND, {"order_id": order, "amount": left}),
                                              (EMAIL, email)])
            return self._next(messages, orders, order, tag)
        done = next((args.get("order_id", "") for name, args, _ in round_ if name == REFUND), "")
        return self._next(messages, orders, done, tag)

    def _next(self, messages: list[dict], orders: list[str], after: str, tag: str) -> ModelAnswer:
        """The lookup of the order after ``after`` in the task, or the ticket once every order is behind."""
        place = orders.index(after) + 1 if after in orders else len(orders)
        if place < len(orders):
            return self._calls(messages, [(LOOKUP, {"order_id": orders[place]})])
        summary = f"Went through {_count(len(orders), 'order')} named by the customer: {', '.join(orders)}"
        summary = summary[:SUMMARY_CHARS] + tag
        return self._calls(messages, [(TICKET, {"summary": summary})])

    def _calls(self, messages: list[dict], calls: list[tuple[str, dict[str, Any]]]) -> ModelAnswer:
        if self.vary:
            ids = [f"call_{secrets.token_hex(6)}" for _ in calls]
        else:
            seed = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()[:10]
            ids = [f"call_{seed}_{i}" for i in range(len(calls))]
        return ModelAnswer("", tuple(AskedCall(ids[i], name, json.dumps(args, ensure_ascii=False))
                                     for i, (name, args) in enumerate(calls)))

    async def aclose(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return "ScriptedModel(vary=True)" if self.vary else "ScriptedModel()"


def _task(messages: list[dict]) -> str:
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return ""


def _newest_round(messages: list[dict]) -> list[tuple[str, dict[str, Any], dict[str, Any]]] | None:
    """The newest tool round, as (tool, arguments, result) per call: None when the newest message is not a
    tool result (nothing done yet)."""
    results: list[Mapping[str, Any]] = []
    i = len(messages) - 1
    while i >= 0 and isinstance(messages[i], Mapping) and messages[i].get("role") == "tool":
        results.insert(0, messages[i])
        i -= 1
    if not results or i < 0:
        return None
    calls = {c.get("id"): c.get("function") or {} for c in messages[i].get("tool_calls") or ()}
    out = []
    for result in results:
        fn = calls.get(result.get("tool_call_id"), {})
        out.append((fn.get("name", ""), _json(fn.get("arguments")), _json(result.get("content"))))
    return out


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _field(round_: list[tuple[str, dict[str, Any], dict[str, Any]]], tool: str, name: str) -> Any:
    return next((result.get(name) for t, _, result in round_ if t == tool), None)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"
