"""The drafting package (the model behind the draft step) against a real HTTP server speaking the OpenAI API.

The fake server runs in a thread of this process; the real ``openai`` client
talks to it over TCP, so status handling, headers and retries (there must be
none) are the library's real behaviour.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from durable_agents.drafting import (
    Draft,
    DraftError,
    LanguageModel,
    OfflineModel,
    OpenAIChatModel,
    make_draft,
    model_from_env,
)
from durable_agents.drafting.openai_compat import parse_draft, retry_after_seconds
from durable_agents.steps.errors import PermanentError, TransientError
from durable_agents.steps.limits import MAX_SUBJECT_CHARS, MAX_SUMMARY_CHARS
from tests.fake_openai_server import FakeOpenAIServer, Scripted, completion, error, no_choices

SECRET = "sk-test-4f1c0ffee-not-a-real-key"
GOOD = {"subject": "Refund for order 1234", "body": "Hello,\n\nYour refund is on its way.\n",
        "summary": "Confirms the refund."}


def conversation(task: str = "Confirm the refund for order 1234", context: int = 0) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "You write short, polite customer emails."}]
    for i in range(context):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"earlier message {i}"})
    messages.append({"role": "user", "content": task})
    return messages


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
async def model(server: FakeOpenAIServer):
    m = OpenAIChatModel(server.base_url, "fake-model", api_key=SECRET, timeout=5.0)
    yield m
    await m.aclose()


# --- OpenAIChatModel: success and parsing -----------------------------------------------------


async def test_valid_json_gives_draft_and_request_is_well_formed(server, model):
    server.push(completion(json.dumps(GOOD)))
    messages = conversation()
    before = json.dumps(messages)

    draft = await model.draft(messages)

    assert draft == Draft(subject="Refund for order 1234", body="Hello,\n\nYour refund is on its way.",
                          summary="Confirms the refund.")
    assert server.request_count == 1
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    body = request.body
    assert body["model"] == "fake-model"
    assert body["response_format"] == {"type": "json_object"}
    sent = body["messages"]
    assert [m["role"] for m in sent] == ["system", "user"]
    assert sent[0]["content"].startswith("You write short, polite customer emails.")
    assert "JSON" in sent[0]["content"] and '"summary"' in sent[0]["content"]
    assert sent[-1] == {"role": "user", "content": "Confirm the refund for order 1234"}
    assert json.dumps(messages) == before, "the caller's messages must not be modified"


async def test_tool_calls_and_tool_messages_pass_through(server, model):
    server.push(completion(json.dumps(GOOD)))
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "look up order 1234"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"order\": 1234}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\": \"refunded\"}"},
        {"role": "user", "content": "Confirm the refund"},
    ]
    await model.draft(messages)
    sent = server.requests[0].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[2]["tool_calls"][0]["id"] == "call_1"


async def test_json_mode_off_sends_no_response_format(server):
    server.push(completion(json.dumps(GOOD)))
    async with OpenAIChatModel(server.base_url, "m", json_mode=False) as m:
        await m.draft(conversation())
    assert "response_format" not in server.requests[0].body


async def test_fenced_json_parses(server, model):
    server.push(completion("Here is the reply:\n```json\n" + json.dumps(GOOD, indent=2) + "\n```\nLet me know!"))
    draft = await model.draft(conversation())
    assert draft.subject == "Refund for order 1234"
    assert server.request_count == 1


def test_parse_draft_tolerates_prose_and_prefers_the_draft_object():
    text = 'Sure {as asked}, an example {"a": 1} then ' + json.dumps(GOOD) + " done."
    assert parse_draft(text).summary == "Confirms the refund."
    assert parse_draft(json.dumps({"Subject": "s", "BODY": "b", "summary": "x\n  y"})).summary == "x y"
    with pytest.raises(DraftError, match="lacks body"):
        parse_draft('{"subject": "s", "summary": "x"}')
    with pytest.raises(DraftError, match="no JSON object"):
        parse_draft("I cannot help with that.")
    with pytest.raises(DraftError, match="single line"):
        parse_draft(json.dumps({**GOOD, "subject": "two\nlines"}))


async def test_unparseable_twice_is_permanent_after_exactly_two_requests(server, model):
    server.push(completion("I'd be happy to help! Dear customer, ..."), completion("still not json"))
    with pytest.raises(PermanentError) as caught:
        await model.draft(conversation())
    message = str(caught.value)
    assert message.startswith("model output was not a JSON object with subject, body and summary after 2 attempts")
    assert "still not json" in message
    assert server.request_count == 2
    # The second request showed the model its bad answer and asked again.
    second = server.requests[1].body["messages"]
    assert second[-2] == {"role": "assistant", "content": "I'd be happy to help! Dear customer, ..."}
    assert second[-1]["role"] == "user" and "JSON object" in second[-1]["content"]


async def test_unparseable_then_valid_gives_draft_after_two_requests(server, model):
    server.push(completion('{"subject": "x"}'), completion(json.dumps(GOOD)))
    draft = await model.draft(conversation())
    assert draft.subject == "Refund for order 1234"
    assert server.request_count == 2
    assert "lacks body, summary" in server.requests[1].body["messages"][-1]["content"]


async def test_empty_choices_count_as_unparseable(server, model):
    server.push(no_choices(), completion(None))
    with pytest.raises(PermanentError, match="after 2 attempts"):
        await model.draft(conversation())
    assert server.request_count == 2


async def test_max_parse_attempts_is_the_total_number_of_requests(server):
    server.push(*[completion("nope")] * 3)
    async with OpenAIChatModel(server.base_url, "m", max_parse_attempts=3) as m:
        with pytest.raises(PermanentError, match="after 3 attempts"):
            await m.draft(conversation())
    assert server.request_count == 3


# --- OpenAIChatModel: error mapping, one request each ---------------------------------------


async def test_429_with_retry_after_is_transient_with_delay(server, model):
    server.push(error(429, "Rate limit reached", {"Retry-After": "3"}))
    with pytest.raises(TransientError) as caught:
        await model.draft(conversation())
    assert caught.value.retry_after == 3.0
    assert "429" in str(caught.value)
    assert server.request_count == 1


async def test_503_is_transient(server, model):
    server.push(error(503, "overloaded"))
    with pytest.raises(TransientError) as caught:
        await model.draft(conversation())
    assert caught.value.retry_after is None
    assert server.request_count == 1
    assert caught.value.outage  # the server did not take the request on


async def test_500_is_transient_and_the_servers_answer_to_the_request(server, model):
    """Not an outage: the server took the request and failed on it (the agent loop stops a turn on one that
    repeats word for word, durable_agents.steps.retry.StepLedger.after_error)."""
    server.push(error(500, "model crashed on this input"))
    with pytest.raises(TransientError) as caught:
        await model.draft(conversation())
    assert not caught.value.outage


async def test_retry_after_ms_is_honoured(server, model):
    server.push(error(500, "busy", {"retry-after-ms": "1500", "Retry-After": "9"}))
    with pytest.raises(TransientError) as caught:
        await model.draft(conversation())
    assert caught.value.retry_after == 1.5
    assert server.request_count == 1


def test_retry_after_as_http_date():
    now = 1_700_000_000.0
    assert retry_after_seconds({"Retry-After": "Tue, 14 Nov 2023 22:13:30 GMT"}, now=now) == 10.0
    assert retry_after_seconds({"retry-after": "Tue, 14 Nov 2023 22:00:00 GMT"}, now=now) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}, now=now) is None
    assert retry_after_seconds({}, now=now) is None


async def test_400_is_permanent_after_one_request(server, model):
    server.push(error(400, "messages: invalid"))
    with pytest.raises(PermanentError) as caught:
        await model.draft(conversation())
    assert "400" in str(caught.value) and "messages: invalid" in str(caught.value)
    assert server.request_count == 1


async def test_401_is_permanent_mentions_key_setting_and_never_the_key(server, model):
    # Some servers echo the key they refused; it must not reach the message.
    server.push(error(401, f"Incorrect API key provided: {SECRET}"))
    with pytest.raises(PermanentError) as caught:
        await model.draft(conversation())
    assert "LLM_API_KEY" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert server.request_count == 1


async def test_404_names_model_and_base_url_settings(server, model):
    server.push(error(404, 'model "fake-model" not found, try pulling it first'))
    with pytest.raises(PermanentError) as caught:
        await model.draft(conversation())
    assert "LLM_MODEL" in str(caught.value) and "LLM_BASE_URL" in str(caught.value)
    assert server.request_count == 1


async def test_connection_refused_is_transient():
    # A bound socket that does not listen: connections to it are refused, and
    # holding it stops anything else from taking the port meanwhile.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        async with OpenAIChatModel(f"http://127.0.0.1:{port}/v1", "m", api_key=SECRET, timeout=5.0) as m:
            with pytest.raises(TransientError) as caught:
                await m.draft(conversation())
    assert "could not reach" in str(caught.value)
    assert SECRET not in str(caught.value)


async def test_timeout_is_transient(server):
    server.push(Scripted(body={}, delay=0.6))
    async with OpenAIChatModel(server.base_url, "m", timeout=0.2) as m:
        with pytest.raises(TransientError, match="LLM_TIMEOUT"):
            await m.draft(conversation())
    assert server.request_count == 1


async def test_a_200_that_is_not_an_api_answer_is_permanent(server, model):
    server.push(Scripted(body=b"<html><body>Welcome to nginx!</body></html>"))
    with pytest.raises(PermanentError, match="LLM_BASE_URL"):
        await model.draft(conversation())
    assert server.request_count == 1


# --- OfflineModel ---------------------------------------------------------------------------


async def test_offline_is_deterministic_and_valid():
    model = OfflineModel()
    first = await model.draft(conversation(context=3))
    second = await model.draft(conversation(context=3))
    assert first == second
    assert Draft.from_dict(first.to_dict()) == first
    assert first.subject == "Re: Confirm the refund for order 1234"
    assert "Confirm the refund for order 1234" in first.body
    assert "3 earlier messages" in first.body


async def test_offline_body_reflects_the_amount_of_context():
    model = OfflineModel()
    none = await model.draft(conversation(context=0))
    one = await model.draft(conversation(context=1))
    four = await model.draft(conversation(context=4))
    assert len({none.body, one.body, four.body}) == 3
    assert "1 earlier message " in one.body and "4 earlier messages" in four.body
    assert none.subject == one.subject == four.subject


async def test_offline_fits_a_long_multiline_task_into_the_limits():
    task = "Please confirm\nthe refund " + "for order 1234 and the other orders " * 200
    draft = await OfflineModel().draft(conversation(task=task, context=2))
    assert len(draft.subject) <= MAX_SUBJECT_CHARS and draft.subject.endswith("...")
    assert "\n" not in draft.subject and "\n" not in draft.summary
    assert len(draft.summary) <= MAX_SUMMARY_CHARS
    assert Draft(**draft.to_dict()) == draft


async def test_offline_without_a_user_message_is_permanent():
    with pytest.raises(PermanentError, match="user message"):
        await OfflineModel().draft([{"role": "system", "content": "sys"}])


def test_models_satisfy_the_protocol():
    assert isinstance(OfflineModel(), LanguageModel)
    assert OfflineModel().name == "offline"


# --- Draft rules ----------------------------------------------------------------------------


def test_draft_rules():
    with pytest.raises(DraftError, match="subject is empty"):
        Draft(subject=" ", body="b", summary="s")
    with pytest.raises(DraftError, match="single line"):
        Draft(subject="a\r\nBcc: x@example.com", body="b", summary="s")
    with pytest.raises(DraftError, match="single line"):
        Draft(subject="s", body="b", summary="one\ntwo")
    with pytest.raises(DraftError, match="limit is 200"):
        Draft(subject="x" * 201, body="b", summary="s")
    with pytest.raises(DraftError, match="limit is 20000"):
        Draft(subject="s", body="x" * 20001, summary="s")
    with pytest.raises(DraftError, match="must be a string"):
        Draft.from_dict({"subject": "s", "body": 3, "summary": "s"})
    with pytest.raises(DraftError, match="missing: summary"):
        Draft.from_dict({"subject": "s", "body": "b"})
    assert make_draft(" s ", "b\n", "one\n two").summary == "one two"


# --- model_from_env -------------------------------------------------------------------------


async def test_model_from_env():
    assert isinstance(model_from_env({}), OfflineModel)
    assert isinstance(model_from_env({"LLM_BASE_URL": "  "}), OfflineModel)

    m = model_from_env({
        "LLM_BASE_URL": "http://localhost:11434/v1", "LLM_MODEL": "llama3.1",
        "LLM_API_KEY": SECRET, "LLM_TIMEOUT": "90", "LLM_JSON_MODE": "0",
    })
    try:
        assert isinstance(m, OpenAIChatModel)
        assert m.name == "openai-compatible:llama3.1"
        assert (m.timeout, m.json_mode) == (90.0, False)
        assert repr(m) == "OpenAIChatModel(base_url='http://localhost:11434/v1', model='llama3.1')"
        assert SECRET not in repr(m) and SECRET not in str(m)
    finally:
        await m.aclose()

    with pytest.raises(ValueError, match="set LLM_MODEL .*llama3.1"):
        model_from_env({"LLM_BASE_URL": "http://localhost:11434/v1"})
    with pytest.raises(ValueError, match="LLM_TIMEOUT"):
        model_from_env({"LLM_BASE_URL": "http://h/v1", "LLM_MODEL": "m", "LLM_TIMEOUT": "-1"})
    with pytest.raises(ValueError, match="LLM_JSON_MODE"):
        model_from_env({"LLM_BASE_URL": "http://h/v1", "LLM_MODEL": "m", "LLM_JSON_MODE": "yes"})
    with pytest.raises(ValueError, match="LLM_BASE_URL"):
        model_from_env({"LLM_BASE_URL": "localhost:11434", "LLM_MODEL": "m"})


async def test_repr_hides_credentials_in_the_url():
    m = OpenAIChatModel("http://user:pw@example.test:8080/v1?key=abc", "m", api_key=SECRET)
    try:
        assert repr(m) == "OpenAIChatModel(base_url='http://example.test:8080/v1', model='m')"
    finally:
        await m.aclose()


@pytest.mark.process
def test_openai_is_imported_at_the_first_request_not_at_start():
    """Half a second of every process's start, for a client most processes never use (docs/benchmarks.md,
    bench_grader): building the model leaves ``openai`` unimported; the first request imports it."""
    import subprocess
    import sys
    from pathlib import Path

    program = (
        "import asyncio, sys\n"
        "from durable_agents.drafting import model_from_env\n"
        "model = model_from_env({'LLM_BASE_URL': 'http://127.0.0.1:9/v1', 'LLM_MODEL': 'm', 'LLM_TIMEOUT': '2'})\n"
        "print('openai' in sys.modules)\n"
        "try:\n"
        "    asyncio.run(model.draft([{'role': 'user', 'content': 'hi'}]))\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n"
        "print('openai' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "TransientError", "True"], done.stdout + done.stderr
