"""The eviction rule and the interface, case by case, on both stores."""

from __future__ import annotations

import json
import logging

import pytest

from durable_agents.memory import (
    TRUNCATION_MARKER,
    InMemoryStore,
    MemoryInputError,
    MemoryPolicy,
    Message,
    OversizeMessageError,
    PinnedTooLargeError,
    PolicyError,
    SQLiteStore,
    Store,
    ToolCall,
    UnknownToolCallError,
    approx_tokens,
    estimate_text_tokens,
    open_store,
    read_context,
    read_window,
    upper_bound_tokens,
)
from durable_agents.memory.tokens import MESSAGE_OVERHEAD, TOOL_CALL_OVERHEAD, pretokenizer_pieces
from tests.memory_support import check_no_orphans

CID = "c1"


def one_token(m: Message) -> int:
    """Every message costs one token: max_tokens then reads as a second message cap."""
    return 1


def by_length(m: Message) -> int:
    """Tokens = characters of content (+1): easy arithmetic in the tests below."""
    return 1 + len(m.content) + sum(len(c.arguments) for c in m.tool_calls)


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request, tmp_path):
    opened: list[Store] = []

    def make(policy: MemoryPolicy | None = None, **kwargs) -> Store:
        if request.param == "memory":
            store = InMemoryStore(policy, **kwargs)
        else:
            store = SQLiteStore(tmp_path / f"m{len(opened)}.db", policy, **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def user(i, text="hi"):
    return Message(f"u{i}", "user", text)


def said(i, text="ok"):
    return Message(f"a{i}", "assistant", text)


def calls(i, *call_ids, args="{}"):
    return Message(f"a{i}", "assistant", "", tuple(ToolCall(c, "lookup", args) for c in call_ids))


def result(call_id, text="42"):
    return Message(f"t-{call_id}", "tool", text, tool_call_id=call_id)


def ids(messages):
    return [m.id for m in messages]


# ---- messages ----------------------------------------------------------------------


def test_to_chat_is_openai_format():
    m = Message("a1", "assistant", "", (ToolCall("call_1", "lookup_order", '{"id": 7}'),))
    assert m.to_chat() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"id": 7}'}}],
    }
    assert result("call_1").to_chat() == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    assert user(1).to_chat() == {"role": "user", "content": "hi"}
    assert Message.from_chat(m.to_chat(), id="a1") == m


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(id="", role="user", content="x"), "message id is empty"),
        (dict(id="m", role="robot", content="x"), "role must be one of"),
        (dict(id="m", role="tool", content="x"), "needs tool_call_id"),
        (dict(id="m", role="user", content="x", tool_call_id="c"), "only a tool message"),
        (dict(id="m", role="user", content="x", tool_calls=(ToolCall("c", "f"),)), "only an assistant"),
        (dict(id="m", role="assistant", content="", tool_calls=(ToolCall("c", "f"), ToolCall("c", "g"))),
         "appears twice"),
        (dict(id="m", role="tool", content="x", tool_call_id="c", pinned=True), "cannot be pinned"),
        (dict(id="m", role="user", content=None), "must be a string"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(kwargs, words):
    with pytest.raises(MemoryInputError, match=words):
        Message(**kwargs)


def test_tool_call_arguments_must_be_json_text():
    with pytest.raises(MemoryInputError, match="json.dumps"):
        ToolCall("c", "f", {"a": 1})


# ---- policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_tokens=0), "max_tokens must be at least 1"),
        (dict(max_messages=1), "max_messages must be at least 2"),
        (dict(max_tokens=True), "must be an int"),
        (dict(oversize="shrink"), "'truncate' or 'reject'"),
        (dict(token_counter=5), "callable"),
        (dict(remember_evicted=-1), "at least 0"),
    ],
)
def test_policy_is_validated(kwargs, words):
    with pytest.raises(PolicyError, match=words):
        MemoryPolicy(**kwargs)


def test_a_counter_returning_nonsense_is_reported(make_store):
    store = make_store(MemoryPolicy(token_counter=lambda m: -1))
    with pytest.raises(PolicyError, match="must return an int >= 0"):
        store.append(CID, user(1))


# ---- bounds and pinned messages ------------------------------------------------------


def test_message_cap_evicts_oldest_whole_exchanges(make_store):
    store = make_store(MemoryPolicy(max_tokens=10_000, max_messages=5))
    store.pin(CID, Message("sys", "system", "be brief"))
    for i in range(1, 4):
        store.append(CID, user(i))
        store.append(CID, said(i))
    # 1 pinned + 3 exchanges of 2 = 7 > 5: exchanges 1 went whole.
    assert ids(store.window(CID)) == ["sys", "u2", "a2", "u3", "a3"]
    stats = store.stats(CID)
    assert (stats.messages, stats.pinned_messages, stats.evicted_messages) == (5, 1, 2)


def test_token_budget_evicts_whole_tool_exchanges(make_store):
    store = make_store(MemoryPolicy(max_tokens=60, max_messages=100, token_counter=by_length))
    store.pin(CID, Message("sys", "system", "x" * 9))  # 10 tokens
    store.append(CID, user(1, "a" * 9))  # 10
    store.append(CID, calls(1, "c1", args="b" * 8))  # 9
    store.append(CID, result("c1", "c" * 9))  # 10
    store.append(CID, said(2, "d" * 9))  # 10  -> 49
    r = store.append(CID, user(3, "e" * 19))  # 20 -> 69 > 60
    assert r.evicted_ids == ("u1", "a1", "t-c1", "a2") and r.evicted_tokens == 39
    assert ids(store.window(CID)) == ["sys", "u3"]


def test_pinned_messages_survive_and_count_against_the_budget(make_store):
    store = make_store(MemoryPolicy(max_tokens=30, max_messages=100, token_counter=by_length))
    store.pin(CID, Message("sys", "system", "x" * 19))  # 20 tokens
    for i in range(20):
        store.append(CID, user(i, "y" * 4))  # 5 tokens each: 2 fit beside the pinned 20
    window = store.window(CID)
    assert ids(window) == ["sys", "u18", "u19"]
    assert sum(map(by_length, window)) <= 30


def test_a_pinned_set_larger_than_the_budget_is_an_error(make_store):
    store = make_store(MemoryPolicy(max_tokens=30, max_messages=3, token_counter=by_length))
    store.append(CID, user(1))
    with pytest.raises(PinnedTooLargeError, match="must stay below max_tokens=30"):
        store.pin(CID, Message("sys", "system", "x" * 40))
    store.pin(CID, Message("p1", "system", "a"))
    store.pin(CID, Message("p2", "system", "b"))
    with pytest.raises(PinnedTooLargeError, match="max_messages=3"):
        store.pin(CID, Message("p3", "system", "c"))  # 3 pinned would leave no room for a message
    assert ids(store.window(CID)) == ["p1", "p2", "u1"]


def test_unpin(make_store):
    store = make_store()
    store.pin(CID, Message("sys", "system", "old instructions"))
    assert store.unpin(CID, "sys") is True
    assert store.unpin(CID, "sys") is False
    store.pin(CID, Message("sys2", "system", "new instructions"))
    assert ids(store.window(CID)) == ["sys2"]
    assert ids(store.window(CID, include_pinned=False)) == []


# ---- the newest exchange alone over the budget ------------------------------------------


def test_newest_exchange_keeps_its_user_turn_while_older_rounds_go(make_store):
    store = make_store(MemoryPolicy(max_tokens=60, max_messages=100, token_counter=by_length))
    store.append(CID, user(1, "u" * 9))  # 10
    for r in range(1, 6):
        store.append(CID, calls(r, f"c{r}", args="a" * 4))  # 5
        store.append(CID, result(f"c{r}", "r" * 9))  # 10
    # 10 + 5 rounds of 15 = 85 > 60: the oldest rounds go, the task stays.
    window = store.window(CID)
    assert ids(window) == ["u1", "a3", "t-c3", "a4", "t-c4", "a5", "t-c5"]
    check_no_orphans(window)


def test_a_round_larger_than_the_budget_is_evicted_whole_even_unfinished(make_store):
    events = []
    store = make_store(MemoryPolicy(max_tokens=40, max_messages=100, token_counter=by_length), on_evict=events.append)
    store.append(CID, user(1, "u" * 4))  # 5
    store.append(CID, calls(1, "c1", "c2", args="a" * 4))  # 9
    r = store.append(CID, result("c1", "r" * 29))  # 30: round 39, + user 44 > 40 -> user goes
    assert r.evicted_ids == ("u1",)
    assert ids(store.window(CID)) == []  # the round is unfinished: hidden
    r = store.append(CID, result("c2", "s" * 9))  # 10: round 49 > 40 -> the whole round goes
    assert r.added and r.evicted_ids == ("a1", "t-c1", "t-c2")
    assert store.window(CID) == []
    assert [e.reason for e in events] == ["budget", "budget"]


def test_results_for_a_round_evicted_while_unfinished_are_evicted_on_arrival(make_store):
    store = make_store(MemoryPolicy(max_tokens=40, max_messages=100, token_counter=by_length))
    store.append(CID, user(1, "u"))
    store.append(CID, calls(1, "c1", "c2", "c3", args="a" * 4))  # 13
    r = store.append(CID, result("c1", "r" * 29))  # 30: round 43 > 40 -> evicted, unfinished
    assert set(r.evicted_ids) == {"u1", "a1", "t-c1"}
    r = store.append(CID, result("c2"))  # its call is gone: evicted on arrival, not rejected
    assert r.added and r.evicted_ids == ("t-c2",)
    assert store.window(CID) == []
    # The next turn closes the round: a late result for it is now unknown.
    store.append(CID, user(2))
    with pytest.raises(UnknownToolCallError):
        store.append(CID, result("c3"))


def test_count_cap_smaller_than_a_round(make_store):
    store = make_store(MemoryPolicy(max_tokens=1000, max_messages=3))
    store.append(CID, user(1))
    store.append(CID, calls(1, "c1", "c2", "c3"))
    for c in ("c1", "c2", "c3"):
        store.append(CID, result(c))
    assert store.window(CID) == []
    assert store.stats(CID).messages <= 3
    store.append(CID, user(2))
    assert ids(store.window(CID)) == ["u2"]


# ---- unfinished rounds ------------------------------------------------------------------


def test_an_unfinished_round_is_hidden_until_its_last_result(make_store):
    store = make_store()
    store.append(CID, user(1))
    store.append(CID, calls(1, "c1", "c2"))
    assert ids(store.window(CID)) == ["u1"]
    store.append(CID, result("c1"))
    assert ids(store.window(CID)) == ["u1"]
    assert store.stats(CID).messages == 3  # stored and counted, though hidden
    store.append(CID, result("c2"))
    assert ids(store.window(CID)) == ["u1", "a1", "t-c1", "t-c2"]


def test_a_new_turn_abandons_an_unfinished_round(make_store, caplog):
    events = []
    store = make_store(on_evict=events.append)
    store.append(CID, user(1))
    store.append(CID, calls(1, "c1", "c2"))
    store.append(CID, result("c1"))
    with caplog.at_level(logging.WARNING, logger="memory"):
        r = store.append(CID, user(2))
    assert r.evicted_ids == ("a1", "t-c1")
    assert [(e.reason, e.message_ids) for e in events] == [("abandoned", ("a1", "t-c1"))]
    assert "unfinished tool round" in caplog.text
    assert ids(store.window(CID)) == ["u1", "u2"]
    assert store.stats(CID).abandoned_messages == 2
    with pytest.raises(UnknownToolCallError):
        store.append(CID, result("c2"))


def test_a_tool_result_for_an_unknown_call_is_rejected(make_store):
    store = make_store()
    store.append(CID, user(1))
    with pytest.raises(UnknownToolCallError, match="'nope', which no stored assistant message is awaiting"):
        store.append(CID, result("nope"))
    store.append(CID, calls(1, "c1"))
    store.append(CID, result("c1"))
    with pytest.raises(UnknownToolCallError, match="each result once"):
        store.append(CID, Message("t-again", "tool", "42", tool_call_id="c1"))
    assert ids(store.window(CID)) == ["u1", "a1", "t-c1"]
    assert store.stats(CID).appended == 3


# ---- oversize -------------------------------------------------------------------------


def test_oversize_truncate_cuts_with_a_marker(make_store, caplog):
    store = make_store(MemoryPolicy(max_tokens=100, max_messages=10, oversize="truncate"))
    store.pin(CID, Message("sys", "system", "instructions"))
    big = Message("t", "user", "word " * 500)
    with caplog.at_level(logging.WARNING, logger="memory"):
        r = store.append(CID, big)
    assert r.added and r.truncated
    stored = store.window(CID)[-1]
    assert stored.id == "t" and stored.content.startswith("word word")
    assert "[truncated by memory:" in stored.content and stored.content.endswith("of 2500 characters removed]")
    assert sum(map(approx_tokens, store.window(CID))) <= 100
    assert r.tokens == approx_tokens(stored) <= 100 - approx_tokens(store.window(CID)[0])
    assert "truncated" in caplog.text
    # A retry of the same oversize message is a clean duplicate, not a conflict.
    again = store.append(CID, big)
    assert again.duplicate and not again.conflict
    assert store.stats(CID).truncated == 1


def test_oversize_truncate_never_cuts_tool_call_arguments(make_store):
    store = make_store(MemoryPolicy(max_tokens=50, max_messages=10))
    store.append(CID, user(1))
    with pytest.raises(OversizeMessageError, match="even with its content cut to nothing"):
        store.append(CID, calls(1, "c1", args=json.dumps({"text": "x" * 400})))
    assert ids(store.window(CID)) == ["u1"]


def test_oversize_reject_raises_and_stores_nothing(make_store):
    store = make_store(MemoryPolicy(max_tokens=100, max_messages=10, oversize="reject"))
    store.append(CID, user(1))
    with pytest.raises(OversizeMessageError, match="more than the 100 tokens"):
        store.append(CID, Message("big", "user", "x" * 1000))
    assert ids(store.window(CID)) == ["u1"]
    assert store.stats(CID).appended == 1


def test_truncation_marker_is_the_documented_one():
    assert TRUNCATION_MARKER.format(removed=3, total=10) == "\n[truncated by memory: 3 of 10 characters removed]"


# ---- idempotence -------------------------------------------------------------------------


def test_append_is_idempotent_by_message_id(make_store):
    store = make_store()
    first = store.append(CID, user(1))
    assert first.added and not first.duplicate
    for _ in range(3):
        again = store.append(CID, user(1))
        assert again == again._replace(added=False, duplicate=True, conflict=False)
    assert ids(store.window(CID)) == ["u1"]
    stats = store.stats(CID)
    assert (stats.appended, stats.duplicates) == (1, 3)


def test_same_id_different_content_keeps_the_stored_one_and_warns(make_store, caplog):
    store = make_store()
    store.append(CID, user(1, "first answer"))
    with caplog.at_level(logging.WARNING, logger="memory"):
        r = store.append(CID, user(1, "a different answer"))
    assert r.duplicate and r.conflict and not r.added
    assert store.window(CID)[0].content == "first answer"
    assert "appended again with different content" in caplog.text
    assert store.stats(CID).conflicts == 1


def test_an_evicted_id_is_still_a_duplicate(make_store):
    store = make_store(MemoryPolicy(max_tokens=1000, max_messages=2, remember_evicted=5))
    for i in range(10):
        store.append(CID, user(i))
    assert ids(store.window(CID)) == ["u8", "u9"]
    assert store.append(CID, user(7)).duplicate  # evicted, remembered
    r = store.append(CID, user(0))  # evicted longer ago than remember_evicted: new again
    assert r.added


# ---- observability ----------------------------------------------------------------------


def test_eviction_is_reported_logged_and_counted(make_store, caplog):
    events = []
    store = make_store(MemoryPolicy(max_tokens=1000, max_messages=3), on_evict=events.append)
    store.append(CID, user(1))
    store.append(CID, said(1))
    store.append(CID, user(2))
    with caplog.at_level(logging.INFO, logger="memory"):
        r = store.append(CID, said(2))
    assert (r.evicted_messages, r.evicted_ids) == (2, ("u1", "a1"))
    assert r.evicted_tokens == approx_tokens(user(1)) + approx_tokens(said(1))
    assert [(e.conversation_id, e.reason, e.message_ids, e.tokens) for e in events] == [
        (CID, "budget", ("u1", "a1"), r.evicted_tokens)
    ]
    assert any(rec.name == "memory" and "evicted 2 messages" in rec.getMessage() for rec in caplog.records)
    stats = store.stats(CID)
    assert (stats.evicted_messages, stats.evicted_tokens, stats.evictions) == (2, r.evicted_tokens, 1)


def test_a_failing_hook_does_not_break_the_append(make_store, caplog):
    def hook(event):
        raise RuntimeError("hook bug")

    store = make_store(MemoryPolicy(max_tokens=1000, max_messages=2), on_evict=hook)
    store.append(CID, user(1))
    store.append(CID, user(2))
    r = store.append(CID, user(3))
    assert r.evicted_ids == ("u1",)
    assert "on_evict hook raised" in caplog.text


# ---- the store surface ---------------------------------------------------------------------


def test_conversations_are_independent_and_clear_forgets_one(make_store):
    store = make_store()
    store.append("a", user(1))
    store.append("b", user(1, "other"))
    store.clear("a")
    assert store.window("a") == []
    assert store.stats("a").appended == 0
    assert store.window("b")[0].content == "other"
    assert store.append("a", user(1)).added  # cleared ids are forgotten too


def test_conversation_ids_must_be_strings(make_store):
    store = make_store()
    with pytest.raises(MemoryInputError, match="conversation id"):
        store.append("", user(1))
    with pytest.raises(MemoryInputError, match="durable_agents.memory.Message"):
        store.append(CID, {"role": "user", "content": "hi"})


def test_open_store_chooses_by_path(tmp_path):
    with open_store(None) as s:
        assert isinstance(s, InMemoryStore) and isinstance(s, Store)
    with open_store(tmp_path / "m.db", MemoryPolicy(max_messages=3)) as s:
        assert isinstance(s, SQLiteStore) and s.policy.max_messages == 3


def test_read_window_from_a_store_object(make_store):
    store = make_store()
    store.append(CID, user(1))
    assert ids(read_window(store, CID)) == ["u1"]
    assert read_context(store, CID) == [{"role": "user", "content": "hi"}]
    assert read_window(None, CID) == [] == read_context(None, CID)


# ---- token counting -------------------------------------------------------------------------


def test_default_counter_counts_overhead_and_tool_call_arguments():
    plain = Message("a", "assistant", "")
    assert approx_tokens(plain) == MESSAGE_OVERHEAD
    args = json.dumps({"order_id": 1234, "note": "please confirm the refund for this order"})
    with_call = Message("a", "assistant", "", (ToolCall("call_1", "lookup_order", args),))
    assert approx_tokens(with_call) == (
        MESSAGE_OVERHEAD
        + TOOL_CALL_OVERHEAD
        + estimate_text_tokens("call_1")
        + estimate_text_tokens("lookup_order")
        + estimate_text_tokens(args)
    )
    assert estimate_text_tokens(args) >= pretokenizer_pieces(args)  # not below the provable floor here
    assert approx_tokens(result("call_1", "x")) > approx_tokens(Message("u", "user", "x"))


def test_counter_bounds_bracket_the_estimate_for_prose_and_cjk():
    prose = "The customer asked whether the refund for order 1234 has been sent."
    assert pretokenizer_pieces(prose) <= estimate_text_tokens(prose) <= len(prose.encode())
    cjk = "退款已经处理完毕，请查收。"
    assert estimate_text_tokens(cjk) >= len(cjk)  # about one token per CJK character or more
    m = Message("m", "user", cjk)
    assert approx_tokens(m) <= upper_bound_tokens(m)


def test_a_custom_counter_is_used(make_store):
    store = make_store(MemoryPolicy(max_tokens=3, max_messages=100, token_counter=one_token))
    for i in range(5):
        store.append(CID, user(i, "x" * 10_000))
    assert ids(store.window(CID)) == ["u2", "u3", "u4"]
    assert not any(m.content.endswith("removed]") for m in store.window(CID))
