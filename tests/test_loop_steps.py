"""The agent loop's engine-agnostic core (durable_agents.steps.loop), in process: the plan, the keys, hostile model
output, and the window derived from a record. The engines' proofs under kills are
tests/test_loop_temporal.py and tests/test_loop_runrecord.py."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from durable_agents.drafting.scripted import ScriptedModel, orders_in
from durable_agents.memory import TRUNCATION_MARKER, MemoryPolicy, Message, approx_tokens, chat_tokens, derive_window
from durable_agents.payloadcodec import data_converter_from_env
from durable_agents.steps.errors import IdempotencyConflict, PermanentError, Refused
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.limits import MAX_SUBJECT_CHARS, MAX_TASK_CHARS, InputError, check_task
from durable_agents.steps.loop import (
    CALL_RESERVE_TOKENS,
    CARRIED_REST_BYTES,
    DEFAULT_WINDOW_TOKENS,
    KEPT_TURNS,
    MAX_ARGUMENTS_CHARS,
    MAX_CALL_ID_CHARS,
    MAX_CALLS_PER_TURN,
    MAX_CONTENT_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_LOOP_BODY_CHARS,
    MAX_TURNS_LIMIT,
    MAX_WINDOW_TOKENS,
    MIN_WINDOW_TOKENS,
    MIN_WINDOW_TOKENS_BEFORE,
    ONE_ROUND_TOKENS,
    PAYLOAD_BUDGET_BYTES,
    PAYLOAD_LIMIT_BYTES,
    TURN_SUMMARY_BYTES,
    WINDOW_BYTES_PER_TOKEN,
    WINDOW_RESERVE_TOKENS,
    AskedCall,
    LoopInputs,
    LoopPlan,
    ModelAnswer,
    ToolRequest,
    TurnRequest,
    TurnResult,
    call_step,
    check_loop_inputs,
    checked_arguments,
    instructions,
    loop_changed,
    loop_signature,
    model_turn,
    parse_step,
    recorded_calls,
    run_tool,
    start_tokens,
    system_message,
    tool_key,
    tool_request,
    tool_specs,
    turn_message,
    window_call_ids,
    with_instructions,
)
from durable_agents.steps.models import to_jsonable
from durable_agents.steps.retry import RetryRule
from durable_agents.workflows import loop_state as state
from tests.record_histories import FIXTURE_KEY, FIXTURE_KEY_ID

CUSTOMER = "customer@example.com"


@dataclass
class Receipt:
    refund_id: str = ""
    message_id: str = ""
    ticket_id: str = ""
    replayed: bool = False


@dataclass
class Order:
    order_id: str
    total: int
    refunded: int = 0
    currency: str = "EUR"


@dataclass
class FakeProvider:
    """Applies by key once, caps refunds at the order's total, refuses unknown orders: the rules the real
    provider keeps (tests/test_provider_orders.py proves those on the process)."""

    orders: dict[str, Order] = field(default_factory=dict)
    applied: dict[str, dict] = field(default_factory=dict)
    receipts: dict[str, Receipt] = field(default_factory=dict)
    lookups: int = 0

    async def lookup_order(self, order_id, *, run_id=None):
        self.lookups += 1
        return self.orders.get(order_id)

    def _apply(self, key, body, receipt):
        if key in self.applied:
            if self.applied[key] != body:
                raise IdempotencyConflict(f"key {key} holds another request")
            return Receipt(**{**self.receipts[key].__dict__, "replayed": True})
        self.applied[key], self.receipts[key] = body, receipt
        return receipt

    async def issue_refund(self, *, idempotency_key, run_id, order_id, amount, metadata=None):
        order = self.orders.get(order_id)
        if order is None:
            raise Refused(f"no order {order_id}", code="order_not_found")
        if idempotency_key not in self.applied and order.refunded + amount > order.total:
            raise Refused(f"refund of {amount} exceeds what is left of {order.total}", code="refund_exceeds_total")
        if idempotency_key not in self.applied:
            order.refunded += amount
        return self._apply(idempotency_key, {"order_id": order_id, "amount": amount},
                           Receipt(refund_id=f"rfd_{len(self.applied)}"))

    async def send_email(self, *, idempotency_key, run_id, to, subject, body, metadata=None):
        return self._apply(idempotency_key, {"to": to, "subject": subject, "body": body},
                           Receipt(message_id=f"msg_{len(self.applied)}"))

    async def create_ticket(self, *, idempotency_key, run_id, summary, email_message_id, metadata=None):
        return self._apply(idempotency_key, {"summary": summary}, Receipt(ticket_id=f"tkt_{len(self.applied)}"))


class FixedModel:
    """Answers every turn with the same calls: for hostile answers."""

    name = "fixed"

    def __init__(self, *calls: AskedCall, content: str = "") -> None:
        self.answer = ModelAnswer(content, calls)

    async def turn(self, messages, tools, *, labels=None):
        return self.answer


def window_of(policy_inputs: LoopInputs, messages):
    return derive_window(MemoryPolicy(max_tokens=policy_inputs.window_tokens,
                                      max_messages=policy_inputs.window_messages), messages)


def walk(inputs: LoopInputs, deps: StepDeps, *, stop_after: str | None = None, results=None):
    """Drive the plan in process as an engine would: each step's request from the recorded results."""
    plan = LoopPlan(inputs, window_of)
    results = {} if results is None else results
    prompts = []

    async def go():
        while True:
            pending = [n for n in plan.names(results) if n not in results]
            if not pending:
                return
            name = pending[0]
            request = plan.request(name, results)
            if isinstance(request, TurnRequest):
                prompts.append(request.window)
                results[name] = await model_turn(request, deps)
            else:
                results[name] = await run_tool(request, deps)
            if name == stop_after:
                return

    asyncio.run(go())
    return plan, results, prompts


def test_the_scripted_loop_refunds_each_order_once_and_answers():
    provider = FakeProvider({o: Order(o, 2500) for o in ("A-1001", "A-1002")})
    deps = StepDeps(provider=provider, llm=None, agent=ScriptedModel())
    plan, results, _ = walk(LoopInputs("r1", "Refund orders A-1001 and A-1002, both broken.", CUSTOMER), deps)
    turns = [n for n in results if parse_step(n)[1] is None]
    assert len(turns) == 6  # 2 orders x (lookup, refund + email) + ticket + answer
    assert [len(results[t].calls) for t in turns] == [1, 2, 1, 2, 1, 0]
    assert [o.refunded for o in provider.orders.values()] == [2500, 2500]
    assert sorted(b.get("amount", 0) for b in provider.applied.values()) == [0, 0, 0, 2500, 2500]
    assert plan.final_answer(results).startswith("Done: I went through the 2 orders you named")
    assert all(r.status == "ok" for n, r in results.items() if "/" in n)


def test_the_script_stops_at_import_when_a_tool_it_asks_for_is_renamed(monkeypatch):
    """The script names the lab agent's tools: a tool renamed in the declaration alone is an ImportError
    that says which, not a run whose first call the toolbox refuses."""
    import dataclasses
    import importlib.util

    import durable_agents.drafting.scripted as scripted
    import durable_agents.steps.refund_agent as refund_agent
    from durable_agents import Toolbox

    renamed = Toolbox(dataclasses.replace(t, name="refund_order") if t.name == "issue_refund" else t
                      for t in refund_agent.REFUND_TOOLS)
    monkeypatch.setattr(refund_agent, "REFUND_TOOLS", renamed)
    spec = importlib.util.spec_from_file_location("scripted_renamed", scripted.__file__)
    assert spec and spec.loader
    with pytest.raises(ImportError, match=r"asks for \['issue_refund'\], which .*REFUND_TOOLS does not declare"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_keys_are_stable_distinct_and_within_the_provider_rule():
    hostile = "x" * 300 + "\u202e\n\x00 id"
    key = tool_key("run-1", 3, 1, hostile)
    assert key == tool_key("run-1", 3, 1, hostile)
    assert len(key) <= 255 and all("\x21" <= ch <= "\x7e" for ch in key)
    # The same id in two turns, or twice in one turn, still gives distinct keys.
    assert len({tool_key("run-1", t, i, "call_1") for t in (1, 2) for i in (0, 1)}) == 4
    assert tool_key("run-1", 1, 0, "a") != tool_key("run-1", 1, 0, "b")
    assert tool_key("run-1", 1, 0, "a") != tool_key("run-2", 1, 0, "a")


def test_a_request_is_built_from_the_recorded_turn_only():
    inputs = LoopInputs("r1", "Refund A-1001", CUSTOMER, start_id="s1")
    call = AskedCall("call_x", "issue_refund", '{"order_id": "A-1001", "amount": 5}')
    recorded = {"turn-1": json.loads(json.dumps(TurnResult(1, "", [call]).__dict__, default=lambda c: c.__dict__))}
    request = LoopPlan(inputs, window_of).request(call_step(1, 0), recorded)
    assert request == tool_request(inputs, 1, 0, call)
    assert request.idempotency_key == tool_key("r1", 1, 0, "call_x") and request.customer_email == CUSTOMER


@pytest.mark.parametrize(("name", "arguments", "says"), [
    ("drop_database", "{}", "unknown tool 'drop_database'"),
    ("issue_refund", '{"order_id": "A-1001"}', "issue_refund needs 'amount'"),
    ("issue_refund", '{"order_id": "A-1001", "amount": -5}', "amount of issue_refund: input should be greater than 0"),
    ("issue_refund", '{"order_id": "A-1001", "amount": true}', "amount of issue_refund: input should be a valid int"),
    ("issue_refund", '{"order_id": "A-1001", "amount": 1e3}', "valid integer, got 1000.0"),
    ("issue_refund", '{"order_id": "A-1001", "amount": "5"}', "valid integer, got '5'"),
    ("issue_refund", '{"order_id": "A-1001", "amount": NaN}', "are not JSON"),
    ("issue_refund", '{"order_id": "A-1001 ", "amount": 5, "amount": 5}', "more than once"),
    ("lookup_order", '{"order_id": "   "}', "order_id must be a non-empty string"),
    ("lookup_order", '{"order_id": 1001}', "order_id of lookup_order: input should be a valid string"),
    ("lookup_order", json.dumps({"order_id": "A" * 65}), "string should have at most 64 characters"),
    ("send_email", '{"subject": "Hi", "body": "b\\u001b[2J"}', "body holds U+001B (ESC) at position 2"),
    ("send_email", '{"subject": "Hi", "body": "b", "to": "x@evil"}', "send_email takes subject, body; it has no 'to'"),
    ("issue_refund", '{"order_id": "A-1001", "amount": 5, "to": "x@evil"}', "it has no 'to'"),
    ("send_email", '{"subject": "Hi\\r\\nBcc: x@evil", "body": "b"}', "subject"),
    ("send_email", '{"subject": "Hi \\u202e", "body": "b"}', "subject"),
    ("lookup_order", "not json", "not JSON"),
    ("issue_refund", '{"order_id": "A-1001", "amount": 5, "amount": 999}', "give 'amount' more than once"),
    ("issue_refund", '{"order_id": "A-1001", "order_id": "A-1002", "amount": 5}', "give 'order_id' more than"),
    ("lookup_order", "[1]", "must be a JSON object"),
])
def test_bad_arguments_are_answered_and_nothing_is_applied(name, arguments, says):
    assert says in checked_arguments(AskedCall("c", name, arguments))
    provider = FakeProvider({"A-1001": Order("A-1001", 2500)})
    request = ToolRequest("r1", 1, 0, AskedCall("c", name, arguments), tool_key("r1", 1, 0, "c"), CUSTOMER)
    result = asyncio.run(run_tool(request, StepDeps(provider=provider, llm=None)))
    assert result.status == "refused" and says in json.loads(result.content)["error"]
    assert provider.applied == {} and provider.orders["A-1001"].refunded == 0


def test_a_refund_over_the_total_is_answered_refused_by_the_provider():
    provider = FakeProvider({"A-1001": Order("A-1001", 2500, refunded=2000)})
    call = AskedCall("c", "issue_refund", '{"order_id": "A-1001", "amount": 600}')
    result = asyncio.run(run_tool(tool_request(LoopInputs("r1", "t", CUSTOMER), 1, 0, call),
                                  StepDeps(provider=provider, llm=None)))
    assert result.status == "refused" and "the provider refused it" in result.content
    assert provider.applied == {} and provider.orders["A-1001"].refunded == 2000


def test_a_call_run_twice_is_applied_once_and_a_conflict_fails():
    provider = FakeProvider({"A-1001": Order("A-1001", 2500)})
    deps = StepDeps(provider=provider, llm=None)
    request = tool_request(LoopInputs("r1", "t", CUSTOMER), 2, 0,
                           AskedCall("c", "issue_refund", '{"order_id": "A-1001", "amount": 100}'))
    first, again = (asyncio.run(run_tool(request, deps)) for _ in range(2))
    assert (first.replayed, again.replayed) == (False, True) and first.effect_id == again.effect_id
    assert provider.orders["A-1001"].refunded == 100
    other = ToolRequest(**{**request.__dict__, "call": AskedCall("c", "issue_refund",
                                                                  '{"order_id": "A-1001", "amount": 7}')})
    with pytest.raises(IdempotencyConflict):
        asyncio.run(run_tool(other, deps))


def test_the_turn_limit_fails_naming_it_and_runs_no_tool():
    provider = FakeProvider({"A-1001": Order("A-1001", 2500)})
    model = FixedModel(AskedCall("c", "lookup_order", '{"order_id": "A-1001"}'))
    with pytest.raises(PermanentError, match="turn limit of 3 reached"):
        walk(LoopInputs("r1", "Look at A-1001 forever", CUSTOMER, max_turns=3),
             StepDeps(provider=provider, llm=None, agent=model))
    assert provider.lookups == 2  # turns 1 and 2 ran their call; turn 3 was refused before any


def test_an_unusable_text_fails_the_turn():
    class Model:
        name = "hostile"

        async def turn(self, messages, tools, *, labels=None):
            return ModelAnswer("done \x1b[2J")

    with pytest.raises(PermanentError, match="the answer"):
        asyncio.run(model_turn(TurnRequest("r1", 1, [], 5), StepDeps(provider=None, llm=None, agent=Model())))


class SequenceModel:
    """Answers each turn with the next answer it was given, then a final text."""

    name = "sequence"

    def __init__(self, *answers: ModelAnswer) -> None:
        self.answers = list(answers)
        self.prompts: list[list[dict]] = []

    async def turn(self, messages, tools, *, labels=None):
        self.prompts.append(messages)
        return self.answers.pop(0) if self.answers else ModelAnswer("Done.")


def email_call(body: str, call_id: str = "c1") -> AskedCall:
    return AskedCall(call_id, "send_email", json.dumps({"subject": "Your refund", "body": body}))


def refused_reasons(results, turn: int = 1) -> list[str]:
    return [json.loads(r.content)["error"] for n, r in results.items()
            if parse_step(n)[0] == turn and "/" in n and r.status == "refused"]


def test_a_long_email_body_is_refused_back_to_the_model_and_the_run_goes_on():
    provider = FakeProvider()
    model = SequenceModel(ModelAnswer("", (email_call("x" * 20_000),)), ModelAnswer("", (email_call("Refunded."),)))
    plan, results, _ = walk(LoopInputs("r1", "Tell the customer", CUSTOMER), StepDeps(provider, None, agent=model))
    assert refused_reasons(results) == [f"the arguments of send_email are 20038 characters; at most "
                                        f"{MAX_ARGUMENTS_CHARS} (an email's body at most {MAX_LOOP_BODY_CHARS}): "
                                        "nothing was applied; send less"]
    assert results["turn-1"].calls[0].arguments == "{}"  # the record stays bounded
    assert [b["body"] for b in provider.applied.values()] == ["Refunded."]  # turn 2's email, once
    assert plan.final_answer(results) == "Done."
    # The model saw its call refused: the window of turn 2 holds the refusal as the call's result.
    assert "20038 characters" in model.prompts[1][-1]["content"]


def test_turns_the_model_got_wrong_are_refused_call_by_call_and_nothing_applied():
    many = tuple(AskedCall(f"c{i}", "create_ticket", '{"summary": "s"}') for i in range(9))
    cases = [
        (ModelAnswer("", many), ["this turn asks for 9 tool calls"] * 8),
        (ModelAnswer("", (AskedCall("", "create_ticket", '{"summary": "s"}'),)), ["a tool call id must be 1-256"]),
        (ModelAnswer("", (AskedCall("x" * 300, "create_ticket", '{"summary": "s"}'),)), ["this one has 300"]),
        (ModelAnswer("", (AskedCall("c", "drop\u202e" + "x" * 90, "{}"),)), ["unknown tool 'drop"]),
    ]
    for answer, says in cases:
        provider = FakeProvider()
        _, results, _ = walk(LoopInputs("r1", "t", CUSTOMER), StepDeps(provider, None, agent=SequenceModel(answer)))
        reasons = refused_reasons(results)
        assert len(reasons) == len(says) and all(w in r for w, r in zip(says, reasons, strict=True)), reasons
        assert provider.applied == {}
        calls = results["turn-1"].calls
        assert all(len(c.id) <= 256 and len(c.name) <= 64 and c.arguments == "{}" for c in calls)


def test_the_field_caps_agree_with_the_arguments_cap():
    """The longest subject and body the field rule accepts, written with the short escapes at their
    longest (every character one), fit the arguments cap: a valid email is never refused for its length."""
    call = AskedCall("c", "send_email", json.dumps({"subject": '"' * MAX_SUBJECT_CHARS,
                                                     "body": "b" + "\n" * (MAX_LOOP_BODY_CHARS - 1)}))
    assert len(call.arguments) <= MAX_ARGUMENTS_CHARS
    assert not isinstance(checked_arguments(call), str)
    assert recorded_calls([call], DEFAULT_WINDOW_TOKENS * 10)[0].refused == ""
    too_long = AskedCall("c", "send_email", json.dumps({"subject": "s", "body": "b" * (MAX_LOOP_BODY_CHARS + 1)}))
    assert "body of send_email: string should have at most 3768 characters" in checked_arguments(too_long)


@pytest.mark.parametrize("calls", range(1, MAX_CALLS_PER_TURN + 1))
def test_the_reserve_holds_memorys_count_of_the_system_and_a_turns_framing(calls):
    system = Message.from_chat(system_message()[1], id="system", pinned=True)
    asked = [{"id": f"{i}" + "a" * 63, "type": "function", "function": {"name": "b" * 64, "arguments": "{}"}}
             for i in range(calls)]
    framing = Message.from_chat({"role": "assistant", "tool_calls": asked, "content": TRUNCATION_MARKER.format(
        removed=MAX_CONTENT_CHARS, total=MAX_CONTENT_CHARS)}, id="turn-10000")
    assert approx_tokens(system) + approx_tokens(framing) <= WINDOW_RESERVE_TOKENS + CALL_RESERVE_TOKENS * calls


@pytest.mark.parametrize("text", ["a" * 3000, ":" * 3000, '"' * 1500, "\u00e9" * 1000, "\U0001f600" * 700])
def test_a_turn_the_loop_records_always_enters_its_window(text):
    """Whatever the arguments' text (dense punctuation, non-ASCII: memory's estimate is at its highest),
    the calls ``recorded_calls`` keeps enter a window of the run's bound with the system instructions, and
    the ones that would not are refused: the run never stops on a window it cannot build."""
    for window_tokens in (300, 700, DEFAULT_WINDOW_TOKENS, 4000):
        asked = [AskedCall(f"c{i}", "create_ticket", json.dumps({"summary": text}, ensure_ascii=False))
                 for i in range(MAX_CALLS_PER_TURN)]
        calls = recorded_calls(asked, window_tokens)
        result = TurnResult(1, "x" * MAX_CONTENT_CHARS, calls)
        window = derive_window(MemoryPolicy(max_tokens=window_tokens, max_messages=40),
                               [system_message(), turn_message(result)])
        assert window[0]["role"] == "system"
        kept = [c for c in calls if not c.refused]
        refused = [c for c in calls if c.refused]
        assert all("do not fit this run's prompt window" in c.refused for c in refused)
        if window_tokens == 4000 and text == "a" * 3000:
            assert len(kept) == 1 and len(refused) == 7


def test_ids_the_window_gives_are_the_models_own_unless_unusable():
    calls = [AskedCall("call_a", "x"), AskedCall("dup", "x"), AskedCall("dup", "x"), AskedCall("bad id!", "x")]
    assert window_call_ids(4, calls) == ["call_a", "call_4_1", "call_4_2", "call_4_3"]


def test_every_prompt_stays_in_the_window_while_the_record_keeps_every_turn():
    orders = [f"A-{1000 + i}" for i in range(40)]
    provider = FakeProvider({o: Order(o, 1000 + i) for i, o in enumerate(orders)})
    inputs = LoopInputs("r1", "Refund " + ", ".join(orders), CUSTOMER, max_turns=200,
                        window_tokens=900, window_messages=24)
    plan, results, prompts = walk(inputs, StepDeps(provider=provider, llm=None, agent=ScriptedModel()))
    assert len([n for n in results if "/" not in n]) == 82 and plan.final_answer(results)
    for prompt in prompts:
        messages = [Message.from_chat(m, id=str(i)) for i, m in enumerate(prompt)]
        assert sum(approx_tokens(m) for m in messages) <= 900 and len(messages) <= 24
    assert max(len(p) for p in prompts) > 10  # the window was used, not emptied
    assert all(o.refunded == o.total for o in provider.orders.values())


def test_a_resume_derives_the_same_window_as_the_run_that_was_not_interrupted():
    provider = FakeProvider({o: Order(o, 900) for o in orders_in("A-1001 A-1002 A-1003")})
    inputs = LoopInputs("r1", "Refund A-1001 A-1002 A-1003", CUSTOMER, window_tokens=600, window_messages=10)
    deps = StepDeps(provider=provider, llm=None, agent=ScriptedModel())
    _, whole, prompts = walk(inputs, deps)
    # Stop after turn 4's first call, keep only what a record would hold (JSON), go on in a "new process".
    provider2 = FakeProvider({o: Order(o, 900) for o in orders_in("A-1001 A-1002 A-1003")})
    deps2 = StepDeps(provider=provider2, llm=None, agent=ScriptedModel())
    _, part, _ = walk(inputs, deps2, stop_after="turn-4/call-0")
    recorded = json.loads(json.dumps({n: r.__dict__ for n, r in part.items()}, default=lambda c: c.__dict__))
    _, resumed, prompts2 = walk(inputs, deps2, results=recorded)
    assert prompts2 == prompts[4:]
    assert len(resumed) == len(whole)


def test_a_window_that_cannot_hold_the_start_and_one_round_is_refused_naming_what_it_needs():
    task = "Refund order A-1001: " + "it arrived broken. " * 150
    start = start_tokens(task, chat_tokens)
    need = start + ONE_ROUND_TOKENS
    with pytest.raises(InputError, match=f"window tokens of {need - 1} cannot hold .* give at least {need} "):
        check_loop_inputs(20, need - 1, 40, start)
    assert check_loop_inputs(20, need, 40, start) == (20, need, 40)
    assert check_loop_inputs(20, DEFAULT_WINDOW_TOKENS, 40, start_tokens("Refund A-1001", chat_tokens))


def test_the_least_window_stated_is_the_least_any_task_can_start_with():
    """``MIN_WINDOW_TOKENS`` is memory's count of the system instructions, the shortest task the rules accept
    and one round: one token under is refused whatever the task, saying what to give; at it, the shortest
    task starts. (It was 200, which no task could start with.)"""
    shortest = check_task("x")
    assert MIN_WINDOW_TOKENS == start_tokens(shortest, chat_tokens) + ONE_ROUND_TOKENS
    under = MIN_WINDOW_TOKENS - 1
    for start in (None, start_tokens(shortest, chat_tokens)):
        with pytest.raises(InputError, match=rf"window tokens must be a whole number from {MIN_WINDOW_TOKENS} to "
                                             rf"{MAX_WINDOW_TOKENS}, got {under}: .* give at least "
                                             rf"{MIN_WINDOW_TOKENS} window tokens"):
            check_loop_inputs(20, under, 40, start)
        assert check_loop_inputs(20, MIN_WINDOW_TOKENS, 40, start) == (20, MIN_WINDOW_TOKENS, 40)
    page = (Path(__file__).resolve().parent.parent / "docs" / "agent-loop.md").read_text()
    assert f"`--window-tokens` is at least {MIN_WINDOW_TOKENS} (`MIN_WINDOW_TOKENS`" in " ".join(page.split())
    # The workflow keeps the floor it always checked: a recorded run is decided as it was.
    assert check_loop_inputs(20, MIN_WINDOW_TOKENS_BEFORE, 40, None, MAX_WINDOW_TOKENS, MIN_WINDOW_TOKENS_BEFORE)


def test_one_round_holds_memorys_count_of_a_lookup_and_its_result():
    call = {"id": "c" * 64, "type": "function", "function": {"name": "n" * 64,
                                                             "arguments": json.dumps({"order_id": "O" * 64})}}
    turn = {"role": "assistant", "tool_calls": [call], "content": TRUNCATION_MARKER.format(
        removed=MAX_CONTENT_CHARS, total=MAX_CONTENT_CHARS)}
    result = {"role": "tool", "tool_call_id": "c" * 64, "content": json.dumps(
        {"order_id": "O" * 64, "total": 10**12, "refunded": 10**12, "currency": "EUR"})}
    assert chat_tokens(turn) + chat_tokens(result) <= ONE_ROUND_TOKENS



# ---------------------------------------------------------------- payloads within Temporal's limit

def _worst_turn(number: int) -> state.TurnState:
    text = "\u00e9" * state.SHOWN_CHARS  # 6 bytes a character in the SDK's JSON
    calls = [state.CallState(i, "\u00e9" * 64, "agentlab/" + "r" * 64 + f"/turn-{number}/call-{i}-" + "f" * 16,
                       "retrying", 50, 9, "refused", "\u00e9" * 64, True, text, "2026-12-02T06:00:00.000Z", text)
             for i in range(MAX_CALLS_PER_TURN)]
    return state.TurnState(number, "completed", 50, 9, text, calls, text, "2026-12-02T06:00:00.000Z", text)


def _encoded(value) -> int:
    """The bytes of ``value`` as the worker sends it: the SDK's JSON, sealed by the payload codec."""
    converter = data_converter_from_env({"LAB_CODEC_KEY": FIXTURE_KEY, "LAB_CODEC_KEY_ID": FIXTURE_KEY_ID})
    payloads = converter.payload_converter.to_payloads([value])
    sealed = asyncio.run(converter.payload_codec.encode(payloads))
    return sum(p.ByteSize() for p in sealed)


def _fullest_window(text: str) -> list[dict]:
    """A window at ``MAX_WINDOW_TOKENS``, of messages of ``text`` (the costliest characters per token)."""
    messages = [system_message()] + [(f"m{i}", {"role": "user", "content": text}) for i in range(2000)]
    return derive_window(MemoryPolicy(max_tokens=MAX_WINDOW_TOKENS, max_messages=100_000), messages)


def test_a_turn_summary_is_within_its_share():
    assert len(json.dumps(to_jsonable(_worst_turn(10_000)), separators=(",", ":"))) <= TURN_SUMMARY_BYTES


@pytest.mark.parametrize("text", ["\\" * 900, "\n" * 900, "\u00e9" * 900, "x", "\U0001f600" * 300])
def test_a_window_costs_at_most_its_bytes_per_token(text):
    window = _fullest_window(text)
    tokens = sum(chat_tokens(m) for m in window)
    assert tokens <= MAX_WINDOW_TOKENS
    assert len(json.dumps(window, separators=(",", ":"))) <= WINDOW_BYTES_PER_TOKEN * tokens


def test_no_payload_the_loop_can_make_is_over_temporals_limit():
    """The largest of each kind, at every cap at once: what continue-as-new carries, a turn's request, a
    turn's answer, the run's result. Sealed by the codec, each under the 2 MiB Temporal refuses."""
    window = _fullest_window("\\" * 900)
    turns = [_worst_turn(n) for n in range(1, KEPT_TURNS + 1)]
    messages = [state.CarriedMessage(f"turn-{i}", m) for i, m in enumerate(window)]
    carried = state.LoopInput("r" * 64, "\u00e9" * MAX_TASK_CHARS, "a" * 240 + "@example.com", MAX_TURNS_LIMIT,
                              MAX_WINDOW_TOKENS, 100_000, RetryRule().to_dict(), state.MAX_HISTORY_BOUND,
                              state.LoopCarried(MAX_TURNS_LIMIT, messages, "s" * 64, state.LoopCounts(), turns,
                                                10_000),
                              list(loop_signature()),
                              state.LoopInstructions("\u00e9" * (MAX_INSTRUCTIONS_CHARS - 2), []))
    asked = [AskedCall("\U0001f600" * MAX_CALL_ID_CHARS, "send_email", "\U0001f600" * MAX_ARGUMENTS_CHARS)
             for _ in range(MAX_CALLS_PER_TURN)]
    answer = TurnResult(MAX_TURNS_LIMIT, "\U0001f600" * MAX_CONTENT_CHARS, recorded_calls(asked), "m" * 64, 100_000)
    assert all(not c.refused for c in answer.calls)  # kept whole: the largest answer the loop records
    result = state.LoopProgress("r" * 64, "completed", MAX_TURNS_LIMIT, MAX_TURNS_LIMIT, state.LoopCounts(), turns,
                          answer="\U0001f600" * MAX_CONTENT_CHARS, error="\U0001f600" * state.SHOWN_CHARS)
    sizes = {"carried": _encoded(carried), "request": _encoded(TurnRequest("r" * 64, 1, window, 20, 100_000)),
             "answer": _encoded(answer), "result": _encoded(result)}
    assert all(size <= PAYLOAD_LIMIT_BYTES for size in sizes.values()), sizes
    assert sizes["carried"] > PAYLOAD_LIMIT_BYTES // 2, sizes  # the budget is used, not wasted


def _figures(text: str) -> list[int]:
    """The numbers written with thousands commas in ``text`` (``1,835,008``), in order."""
    return [int(n.replace(",", "")) for n in re.findall(r"\b\d{1,3}(?:,\d{3})+\b", text)]


def test_the_window_cap_in_docs_agent_loop_is_the_codes_arithmetic():
    """docs/agent-loop.md's table and the sentence after it give ``MAX_WINDOW_TOKENS`` step by step, as
    ``durable_agents.steps.loop`` computes it: each figure the code's, the division and the rounding down to the
    thousand."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "agent-loop.md").read_text()
    table = page.partition("### What a payload may hold")[2].partition("<!-- window-cap-arithmetic -->")
    rows = {line.split("|")[1].strip(): _figures(line.split("|")[2]) for line in table[0].splitlines()
            if line.startswith("| ") and line.split("|")[2].strip()[:1].isdigit()}
    summaries = KEPT_TURNS * TURN_SUMMARY_BYTES
    left = PAYLOAD_BUDGET_BYTES - CARRIED_REST_BYTES - summaries
    assert list(rows.values()) == [
        [PAYLOAD_LIMIT_BYTES], [PAYLOAD_LIMIT_BYTES // 8], [PAYLOAD_BUDGET_BYTES], [summaries],
        [CARRIED_REST_BYTES], [left]], rows
    sentence = table[2].partition(";")[0]
    assert _figures(sentence) == [left, left // WINDOW_BYTES_PER_TOKEN, MAX_WINDOW_TOKENS, PAYLOAD_BUDGET_BYTES,
                                  CARRIED_REST_BYTES, TURN_SUMMARY_BYTES, 1000, 1000], sentence
    assert f"{left:,} / {WINDOW_BYTES_PER_TOKEN} = {left // WINDOW_BYTES_PER_TOKEN:,} tokens" in sentence
    assert f"- {KEPT_TURNS} x {TURN_SUMMARY_BYTES:,}) // {WINDOW_BYTES_PER_TOKEN} // 1,000 x 1,000" in sentence
    assert MAX_WINDOW_TOKENS == left // WINDOW_BYTES_PER_TOKEN // 1000 * 1000


def test_a_window_over_what_a_payload_holds_is_refused():
    with pytest.raises(InputError, match=f"window tokens must be a whole number from {MIN_WINDOW_TOKENS} to "
                                         f"{MAX_WINDOW_TOKENS}"):
        check_loop_inputs(20, 1_000_000, 40)


def test_arguments_json_cannot_hold_are_refused_at_the_turn():
    calls = recorded_calls([AskedCall("c", "create_ticket", '{"summary": "a\x00b"}'),
                            AskedCall("d", "create_ticket", '{"summary": "\ud800"}'),
                            AskedCall("e", "create_ticket", '{\n\t"summary": "fine"\r\n}')])
    assert [bool(c.refused) for c in calls] == [True, True, False]
    assert "not JSON" in calls[0].refused and calls[0].arguments == "{}"


def test_a_run_recorded_under_another_loop_is_told_apart_naming_both():
    code = list(loop_signature())
    assert loop_changed(None) is None and loop_changed(code) is None  # before signatures; the same loop
    without_tickets = [line for line in code if not line.startswith("tool create_ticket:")]
    why = loop_changed(without_tickets)
    assert why is not None and "was started by an agent loop of version" in why
    assert "tool create_ticket:ticket:summary=string" in why  # this code's loop, named, has what the run's lacks


def test_every_turn_is_asked_with_what_the_run_recorded_it_is_told():
    """The plan every engine walks asks each turn with the run's own prompt and tools (``LoopInputs``), not
    this code's: a deploy that changed them changes new runs only."""
    prompt, tools = "You are the run's own agent.", tool_specs()[:1]
    model = SequenceModel(ModelAnswer("", (AskedCall("c", "lookup_order", '{"order_id": "A-1001"}'),)))
    seen = []

    async def turn(messages, given, *, labels=None):
        seen.append((messages[0]["content"], given))
        return await SequenceModel.turn(model, messages, given, labels=labels)

    model.turn = turn  # type: ignore[method-assign]
    inputs = with_instructions(LoopInputs("r1", "t", CUSTOMER), {"prompt": prompt, "tools": tools})
    walk(inputs, StepDeps(FakeProvider({"A-1001": Order("A-1001", 1)}), None, agent=model))
    assert seen == [(prompt, tools)] * 2
    assert with_instructions(LoopInputs("r1", "t", CUSTOMER), None) == LoopInputs("r1", "t", CUSTOMER)
    assert LoopInputs("r1", "t", CUSTOMER).prompt == instructions()["prompt"]


def test_the_run_record_keeps_a_runs_instructions_and_refuses_another_loop(tmp_path):
    from durable_agents.runrecord import FlowChanged, RunRecord
    from durable_agents.runrecord.plans import loop_inputs, plan_for
    from durable_agents.runrecord.runner import DEFAULT_FLOW, check_plan
    from durable_agents.runrecord.store import NextAttempt

    told = {"prompt": "The run's own.", "tools": tool_specs()[:2]}
    other = [line for line in loop_signature() if not line.startswith("tool create_ticket:")]
    with RunRecord(tmp_path / "record.db") as record:
        for run_id, signature in (("same", list(loop_signature())), ("other", other)):
            record.create_run(run_id, "t", CUSTOMER, run_id, ["turn-1"], "me", 30, NextAttempt(0, 1, None),
                              start_id="s", retry_rule=RetryRule().to_dict(),
                              loop={"max_turns": 5, "window_tokens": 2000, "window_messages": 40,
                                    "signature": signature, "instructions": told})
        same, changed = record.load("same"), record.load("other")
    inputs = loop_inputs(same)
    assert (inputs.prompt, inputs.tools, inputs.max_turns) == (told["prompt"], told["tools"], 5)
    check_plan(same, plan_for(same, DEFAULT_FLOW))
    with pytest.raises(FlowChanged, match="was not resumed: the run was started by an agent loop of version"):
        check_plan(changed, plan_for(changed, DEFAULT_FLOW))
