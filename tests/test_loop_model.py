"""The agent loop's model side: ``durable_agents.drafting.OpenAIChatModel.turn`` through the real ``openai`` client,
against the lab's model stand-in (``durable_agents.testing.standin``: in this process, and as its own process) and
against the scripted fake server (tests/fake_openai_server.py) for what a server may send wrong; the scripted model's
script itself (``durable_agents.drafting.scripted``); and which model the environment gives the loop
(``durable_agents.drafting.agent_from_env``, ``durable_agents.wiring.deps_from_env``).

The tool results fed back are fake (no provider): the messages around them are built as ``durable_agents.steps.loop``
builds a window (``turn_message``, ``result_message``), so the model sees what the loop would show it."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from durable_agents.drafting import OfflineModel, OpenAIChatModel, ScriptedModel, agent_from_env
from durable_agents.drafting.openai_compat import AnswerError, parse_answer
from durable_agents.drafting.scripted import orders_in
from durable_agents.steps.errors import PermanentError, TransientError
from durable_agents.steps.loop import (
    AskedCall,
    LoopInputs,
    ModelAnswer,
    ToolResult,
    TurnResult,
    result_message,
    system_message,
    task_message,
    tool_specs,
    turn_message,
)
from durable_agents.testing.standin import READY, ModelStandIn, start_model_standin
from durable_agents.wiring import deps_from_env, preload
from tests.fake_openai_server import FakeOpenAIServer, completion, error, tool_call, tool_completion

SECRET = "sk-test-7e57c0de-not-a-real-key"
TWO_ORDERS = "Please refund my orders A-1001 and B-2002, they arrived broken."
# The fake world the tool results come from: order -> (total, refunded), in cents.
ORDERS = {"A-1001": (5000, 0), "B-2002": (1250, 0), "C-3003": (800, 800), "D-4004": (900, 0), "E-5005": (300, 100)}


def window(task: str) -> list[dict[str, Any]]:
    inputs = LoopInputs(run_id="r", task=task, email="customer@example.com")
    return [system_message()[1], task_message(inputs)[1]]


def fake_result(call: AskedCall) -> dict[str, Any]:
    """What a tool would answer (the shapes of ``durable_agents.steps.loop.run_tool``'s results)."""
    args = json.loads(call.arguments)
    if call.name == "lookup_order":
        if args["order_id"] not in ORDERS:
            return {"error": f"no order {args['order_id']!r}"}
        total, refunded = ORDERS[args["order_id"]]
        return {"order_id": args["order_id"], "total": total, "refunded": refunded, "currency": "EUR"}
    if call.name == "issue_refund":
        return {"refund_id": f"rf-{args['order_id']}", "order_id": args["order_id"], "amount": args["amount"]}
    if call.name == "send_email":
        return {"message_id": "msg-1", "to": "customer@example.com"}
    return {"ticket_id": "T-77"}


async def walk(model: Any, task: str, run: str = "run-1", max_turns: int = 20) -> list[TurnResult]:
    """The loop without an engine: ask a turn, feed back each call's (fake) result, until a turn asks for no
    tool. The turns, in order."""
    messages = [system_message()[1], task_message(LoopInputs(run_id=run, task=task, email="c@example.com"))[1]]
    turns: list[TurnResult] = []
    for number in range(1, max_turns + 1):
        answer = await model.turn(list(messages), tool_specs(), labels={"run": run, "turn": str(number)})
        turn = TurnResult(number, answer.content, list(answer.tool_calls))
        turns.append(turn)
        messages.append(turn_message(turn)[1])
        if not turn.calls:
            return turns
        for index, call in enumerate(turn.calls):
            result = ToolResult(number, index, call.name, "ok", json.dumps(fake_result(call)))
            messages.append(result_message(turn, result)[1])
    raise AssertionError(f"no final answer in {max_turns} turns: {[[c.name for c in t.calls] for t in turns]}")


def tools_of(turns: list[TurnResult]) -> list[list[str]]:
    return [[c.name for c in t.calls] for t in turns]


@pytest.fixture
def standin() -> Iterator[ModelStandIn]:
    with ModelStandIn() as server:
        yield server


@pytest.fixture
async def model(standin: ModelStandIn) -> AsyncIterator[OpenAIChatModel]:
    m = OpenAIChatModel(standin.url, "scripted", timeout=10.0)
    yield m
    await m.aclose()


# ---------------------------------------------------------------- the real client against the stand-in


async def test_a_first_turn_looks_up_the_first_order_and_is_counted_under_its_run_and_turn(standin, model):
    messages = window(TWO_ORDERS)
    answer = await model.turn(messages, tool_specs(), labels={"run": "run-1", "turn": "1"})
    assert isinstance(answer, ModelAnswer) and answer.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == [("lookup_order", {"order_id": "A-1001"})]
    # The transport loses nothing: the answer is the scripted model's own to the same window, id included.
    assert answer == ScriptedModel().answer(messages)
    assert standin.counts("run-1") == {"run": "run-1", "requests": 1, "turns": {"1": 1}}


async def test_two_calls_in_one_turn_come_back_in_the_models_order(model):
    messages = window(TWO_ORDERS)
    first = await model.turn(messages, tool_specs(), labels={"run": "run-2", "turn": "1"})
    turn = TurnResult(1, first.content, list(first.tool_calls))
    messages += [turn_message(turn)[1],
                 result_message(turn, ToolResult(1, 0, "lookup_order", "ok",
                                                 json.dumps(fake_result(turn.calls[0]))))[1]]
    second = await model.turn(messages, tool_specs(), labels={"run": "run-2", "turn": "2"})
    assert [c.name for c in second.tool_calls] == ["issue_refund", "send_email"]
    assert json.loads(second.tool_calls[0].arguments) == {"order_id": "A-1001", "amount": 5000}
    assert "A-1001" in json.loads(second.tool_calls[1].arguments)["subject"]
    assert len({c.id for c in second.tool_calls}) == 2, second.tool_calls


async def test_labels_are_counted_per_run_and_turn_and_read_back_over_http(standin, model):
    odd = "run/ü 1"  # a run id no header could carry as it is: it travels percent-encoded
    for run, turn in (("run-a", "1"), ("run-a", "1"), ("run-a", "2"), (odd, "1")):
        await model.turn(window(TWO_ORDERS), tool_specs(), labels={"run": run, "turn": turn})
    await model.turn(window(TWO_ORDERS), tool_specs())  # no labels: counted as run "-", turn "-"
    assert standin.counts("run-a") == {"run": "run-a", "requests": 3, "turns": {"1": 2, "2": 1}}
    assert standin.counts(odd) == {"run": odd, "requests": 1, "turns": {"1": 1}}
    assert standin.counts("never-ran") == {"run": "never-ran", "requests": 0, "turns": {}}
    async with httpx.AsyncClient() as http:
        one = (await http.get(f"{standin.url}/counts", params={"run": "run-a"})).json()
        every = (await http.get(f"{standin.url}/counts")).json()
    assert one == standin.counts("run-a")
    assert every["requests"] == 5 and set(every["runs"]) == {"run-a", odd, "-"}
    assert every["runs"]["-"] == {"requests": 1, "turns": {"-": 1}}


async def test_the_script_runs_end_to_end_to_a_final_answer(standin, model):
    turns = await walk(model, TWO_ORDERS, run="run-e2e")
    assert tools_of(turns) == [["lookup_order"], ["issue_refund", "send_email"], ["lookup_order"],
                               ["issue_refund", "send_email"], ["create_ticket"], []]
    assert "T-77" in turns[-1].content and "2 orders" in turns[-1].content
    # Each turn asked once: what the loop's engines will be held to under kills.
    assert standin.counts("run-e2e") == {"run": "run-e2e", "requests": 6,
                                         "turns": {str(n): 1 for n in range(1, 7)}}


async def test_vary_gives_other_words_and_ids_when_a_turn_is_asked_again():
    async def twice(standin: ModelStandIn) -> tuple[ModelAnswer, ModelAnswer, ModelAnswer, ModelAnswer]:
        async with OpenAIChatModel(standin.url, "scripted", timeout=10.0) as m:
            first = [await m.turn(window(TWO_ORDERS), tool_specs()) for _ in range(2)]
            finals = [await m.turn(window("Where is my parcel?"), tool_specs()) for _ in range(2)]
        return first[0], first[1], finals[0], finals[1]

    with ModelStandIn(vary=True) as varying, ModelStandIn() as fixed:
        a, b, final_a, final_b = await twice(varying)
        assert [c.name for c in a.tool_calls] == [c.name for c in b.tool_calls] == ["lookup_order"]
        assert a.tool_calls[0].id != b.tool_calls[0].id, "a varying model gives a new id when asked again"
        assert not final_a.tool_calls and final_a.content != final_b.content, (final_a, final_b)
        same_a, same_b, same_final_a, same_final_b = await twice(fixed)
        assert same_a == same_b and same_final_a == same_final_b, "without vary the stand-in is deterministic"
        async with OpenAIChatModel(varying.url, "scripted", timeout=10.0) as m:
            drafts = [await m.draft(window("Where is my parcel?")) for _ in range(2)]
        assert drafts[0].subject != drafts[1].subject


async def test_a_request_without_tools_gets_the_offline_draft(standin, model):
    messages = [{"role": "system", "content": "Write short emails."},
                {"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"},
                {"role": "user", "content": "Confirm the refund of A-1001"}]
    draft = await model.draft(messages)
    assert draft == await OfflineModel().draft(messages)
    assert standin.counts("-") == {"run": "-", "requests": 1, "turns": {"-": 1}}


async def test_a_tool_request_is_counted_when_it_arrives_before_the_delay_ends():
    """What lets a test kill a worker during a model request: the count rises while the answer is held."""
    with ModelStandIn(delay=2.0) as slow:
        async with OpenAIChatModel(slow.url, "scripted", timeout=10.0) as m:
            asking = asyncio.create_task(m.turn(window(TWO_ORDERS), tool_specs(), labels={"run": "r", "turn": "1"}))
            deadline, seen = time.monotonic() + 10, slow.counts("r")
            while seen["requests"] == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                seen = slow.counts("r")
            assert seen["turns"] == {"1": 1}, f"the request was never counted; last seen {seen}"
            assert not asking.done(), "the answer came before the delay was over"
            answer = await asking
    assert [c.name for c in answer.tool_calls] == ["lookup_order"]


async def test_bad_requests_get_a_400_with_an_openai_error_body_and_are_not_counted(standin):
    chat = f"{standin.url}/chat/completions"
    async with httpx.AsyncClient() as http:
        for body in (b"not json", b'{"model": "m"}', b'{"messages": []}', b'["a list"]',
                     b'{"messages": [{"role": "user", "content": "A-1001"}], "tools": "all"}',
                     b'{"messages": ["hello"]}'):
            answer = await http.post(chat, content=body, headers={"X-Lab-Run": "bad", "X-Lab-Turn": "1"})
            assert answer.status_code == 400, (body, answer.text)
            assert answer.json()["error"]["message"].startswith("bad request: "), answer.text
        missing = await http.post(f"{standin.url}/embeddings", json={"messages": []})
        assert missing.status_code == 404 and "error" in missing.json()
        assert (await http.get(standin.url.removesuffix("/v1") + "/healthz")).status_code == 200
    assert standin.counts() == {"requests": 0, "runs": {}}


# ---------------------------------------------------------------- what a server may send wrong


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def on_fake(fake: FakeOpenAIServer) -> AsyncIterator[OpenAIChatModel]:
    m = OpenAIChatModel(fake.base_url, "fake-model", api_key=SECRET, timeout=5.0)
    yield m
    await m.aclose()


async def test_a_turn_sends_the_tools_and_labels_and_no_json_mode(fake, on_fake):
    fake.push(tool_completion(tool_call("lookup_order", '{"order_id": "A-1001"}', id="call_b"),
                              tool_call("create_ticket", '{"summary": "x"}', id="call_a")))
    messages = window(TWO_ORDERS)
    before = json.dumps(messages)
    answer = await on_fake.turn(messages, tool_specs(), labels={"run": "run 9", "turn": "3"})
    assert answer == ModelAnswer("", (AskedCall("call_b", "lookup_order", '{"order_id": "A-1001"}'),
                                      AskedCall("call_a", "create_ticket", '{"summary": "x"}')))
    sent = fake.requests[0]
    assert sent.body["tools"] == tool_specs() and "response_format" not in sent.body
    assert sent.body["messages"] == messages, "the window goes as given: no JSON instruction is added"
    assert (sent.headers["x-lab-run"], sent.headers["x-lab-turn"]) == ("run%209", "3")
    assert json.dumps(messages) == before, "the caller's messages are not modified"


async def test_a_malformed_tool_call_is_asked_again_once_then_refused(fake, on_fake):
    no_id = tool_completion(tool_call("lookup_order", '{"order_id": "A-1001"}', id=None))
    fake.push(no_id, no_id)
    with pytest.raises(PermanentError) as refused:
        await on_fake.turn(window(TWO_ORDERS), tool_specs())
    assert fake.request_count == 2, "asked once more, then no more"
    assert "tool call 0 has no id" in str(refused.value) and "LLM_MODEL" in str(refused.value)
    correction = fake.requests[1].body["messages"][-1]
    assert correction["role"] == "user" and "tool call 0 has no id" in correction["content"]
    assert "tool_calls" not in fake.requests[1].body["messages"][-2], "a malformed call is shown back as text"


async def test_an_answer_corrected_on_the_second_request_is_taken(fake, on_fake):
    fake.push(tool_completion(tool_call(None, '{"order_id": "A-1001"}')),  # a call without a name
              tool_completion(tool_call("lookup_order", '{"order_id": "A-1001"}', id="call_9")))
    answer = await on_fake.turn(window(TWO_ORDERS), tool_specs())
    assert answer.tool_calls == (AskedCall("call_9", "lookup_order", '{"order_id": "A-1001"}'),)
    assert fake.request_count == 2 and "no function name" in fake.requests[1].body["messages"][-1]["content"]


async def test_an_empty_answer_is_asked_again_and_text_is_a_final_answer(fake, on_fake):
    fake.push(completion(""), completion("All done: order A-1001 is refunded."))
    answer = await on_fake.turn(window(TWO_ORDERS), tool_specs())
    assert answer == ModelAnswer("All done: order A-1001 is refunded.", ())
    assert "neither text nor a tool call" in fake.requests[1].body["messages"][-1]["content"]


async def test_a_server_error_is_transient_and_a_refused_key_is_permanent_naming_llm_api_key(fake, on_fake):
    fake.push(error(500, "overloaded", headers={"retry-after": "3"}))
    with pytest.raises(TransientError) as transient:
        await on_fake.turn(window(TWO_ORDERS), tool_specs())
    assert transient.value.retry_after == 3.0
    fake.push(error(401, f"Incorrect API key provided: {SECRET}"))
    with pytest.raises(PermanentError) as permanent:
        await on_fake.turn(window(TWO_ORDERS), tool_specs())
    assert "LLM_API_KEY" in str(permanent.value) and SECRET not in str(permanent.value)
    assert fake.request_count == 2, "no retry inside the model: retries are the engine's"


async def test_a_model_without_tool_support_is_told_apart(fake, on_fake):
    fake.push(error(400, "registry.ollama.ai/library/gemma:2b does not support tools"))
    with pytest.raises(PermanentError, match="supports tool calling: check LLM_MODEL"):
        await on_fake.turn(window(TWO_ORDERS), tool_specs())


async def test_a_call_without_a_type_or_with_object_arguments_still_runs_through_the_client(fake, on_fake):
    fake.push(tool_completion(tool_call("lookup_order", {"order_id": "A-1001"}, type=None, id="c1"),
                              tool_call("create_ticket", None, id="c2")))
    answer = await on_fake.turn(window(TWO_ORDERS), tool_specs())
    assert answer.tool_calls == (AskedCall("c1", "lookup_order", '{"order_id": "A-1001"}'),
                                 AskedCall("c2", "create_ticket", "{}"))


def test_parse_answer_reads_what_servers_send_and_refuses_what_cannot_run():
    def body(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
        return {"choices": [{"message": {"role": "assistant", "content": content, "tool_calls": list(calls)}}]}

    # Some servers leave out the type, or send the arguments as an object: both still run.
    untyped = {"id": "c1", "function": {"name": "lookup_order", "arguments": {"order_id": "A-1001"}}}
    assert parse_answer(body(untyped)) == ModelAnswer("", (AskedCall("c1", "lookup_order",
                                                                     '{"order_id": "A-1001"}'),))
    assert parse_answer(body(tool_call("create_ticket", None))).tool_calls[0].arguments == "{}"
    for wrong, why in ((body(tool_call("x", type="custom")), "'custom' call"),
                       (body(tool_call("x", id="")), "has no id"),
                       (body(content="  "), "neither text nor a tool call"),
                       ({"choices": []}, "no choice")):
        with pytest.raises(AnswerError, match=why):
            parse_answer(wrong)


# ---------------------------------------------------------------- the stand-in as its own process


@pytest.mark.process
async def test_the_process_form_prints_its_line_answers_counts_and_stops_on_sigterm():
    proc, url = start_model_standin()
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), url
        async with OpenAIChatModel(url, "scripted", timeout=10.0) as m:
            answer = await m.turn(window(TWO_ORDERS), tool_specs(), labels={"run": "p-1", "turn": "1"})
        assert [c.name for c in answer.tool_calls] == ["lookup_order"]
        async with httpx.AsyncClient() as http:
            counted = (await http.get(f"{url}/counts", params={"run": "p-1"})).json()
        assert counted == {"run": "p-1", "requests": 1, "turns": {"1": 1}}
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.output()
        assert proc.output().splitlines() == [f"{READY} {url}"], "one line, and nothing else, not even a traceback"
    finally:
        proc.kill()


# ---------------------------------------------------------------- the script


def test_orders_in_finds_each_order_once_in_the_tasks_order():
    task = "Refund B-22334455, then A-1001, and A-1001 again; not a-1001, AB-1234, A-12 or A-123456789."
    assert orders_in(task) == ["B-22334455", "A-1001"]
    assert orders_in("Where is my parcel?") == []


async def test_a_task_with_no_order_gets_a_final_answer_at_once():
    turns = await walk(ScriptedModel(), "Where is my parcel?")
    assert tools_of(turns) == [[]] and "no order number" in turns[0].content


async def test_an_order_refunded_already_or_unknown_is_passed_over():
    turns = await walk(ScriptedModel(), "Orders C-3003, Z-9999 and D-4004 please.")
    assert tools_of(turns) == [["lookup_order"], ["lookup_order"], ["lookup_order"],
                               ["issue_refund", "send_email"], ["create_ticket"], []]
    looked_up = [json.loads(t.calls[0].arguments)["order_id"] for t in turns[:3]]
    assert looked_up == ["C-3003", "Z-9999", "D-4004"]
    refund = json.loads(turns[3].calls[0].arguments)
    assert refund == {"order_id": "D-4004", "amount": 900}


@pytest.mark.parametrize("orders", [["A-1001"], ["A-1001", "B-2002"], ["A-1001", "B-2002", "E-5005"]])
async def test_k_orders_with_something_left_take_2k_plus_2_turns(orders):
    turns = await walk(ScriptedModel(), f"Please refund {', '.join(orders)}.")
    assert len(turns) == 2 * len(orders) + 2, tools_of(turns)
    refunded = [json.loads(t.calls[0].arguments) for t in turns if t.calls and t.calls[0].name == "issue_refund"]
    assert refunded == [{"order_id": o, "amount": ORDERS[o][0] - ORDERS[o][1]} for o in orders]


# ---------------------------------------------------------------- the model the environment gives the loop


def test_agent_from_env_is_scripted_offline_and_the_server_model_with_a_base_url():
    offline = agent_from_env({})
    assert isinstance(offline, ScriptedModel) and not offline.vary
    varying = agent_from_env({"LLM_OFFLINE_VARY": "1"})
    assert isinstance(varying, ScriptedModel) and varying.vary
    with pytest.raises(ValueError, match="LLM_OFFLINE_VARY"):
        agent_from_env({"LLM_OFFLINE_VARY": "yes"})
    served = agent_from_env({"LLM_BASE_URL": "http://127.0.0.1:9/v1", "LLM_MODEL": "llama3.1", "LLM_TIMEOUT": "7"})
    assert isinstance(served, OpenAIChatModel) and served.model == "llama3.1" and served.timeout == 7.0
    with pytest.raises(ValueError, match="LLM_MODEL"):
        agent_from_env({"LLM_BASE_URL": "http://127.0.0.1:9/v1"})


async def test_deps_from_env_gives_the_loop_one_instance_with_the_draft_when_a_server_answers():
    offline = deps_from_env({"MEMORY_DB": "off"})
    served = deps_from_env({"MEMORY_DB": "off", "LLM_BASE_URL": "http://127.0.0.1:9/v1", "LLM_MODEL": "m"})
    try:
        assert isinstance(offline.agent, ScriptedModel) and isinstance(offline.llm, OfflineModel)
        assert isinstance(served.llm, OpenAIChatModel) and served.agent is served.llm, "one client, one preload"
        preload(served)
        assert served.llm._client is not None
    finally:
        for deps in (offline, served):
            await deps.provider.aclose()
        assert isinstance(served.llm, OpenAIChatModel)
        await served.llm.aclose()
