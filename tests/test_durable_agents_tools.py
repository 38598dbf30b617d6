"""The adapter's tools (``durable_agents``): a tool table none of the lab's code names is specced, checked and
dispatched through the declaration alone; an unknown tool is refused back, never sent to another; each JSON
type validates; hostile arguments are refused with the handler never called."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from durable_agents import Applied, Arguments, Tool, Toolbox, ToolContext, ToolOutput, ToolRefused


class Floor(enum.Enum):
    GROUND = "ground"
    FIRST = "first"


class Attendee(Arguments):
    name: Annotated[str, Field(min_length=1, max_length=40)]
    optional: bool = False


class FindSlots(Arguments):
    date: Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$")]


class BookRoom(Arguments):
    room: Literal["alpha", "beta"]
    start: str
    minutes: Annotated[int, Field(gt=0, le=480)]
    floor: Floor = Floor.GROUND
    budget: float = 0.0
    projector: bool = False
    attendees: list[Attendee] = []
    tags: Annotated[list[str], Field(max_length=3)] = []


class Handled:
    """A fake service: every call a handler ran, with its arguments and context."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseModel, ToolContext]] = []

    async def find_slots(self, args: FindSlots, ctx: ToolContext) -> ToolOutput:
        self.calls.append(("find_slots", args, ctx))
        return ToolOutput({"slots": [f"{args.date}T09:00"]})

    async def book_room(self, args: BookRoom, ctx: ToolContext) -> ToolOutput:
        self.calls.append(("book_room", args, ctx))
        if args.room == "beta" and args.minutes > 60:
            raise ToolRefused("room beta is booked for at most 60 minutes; give fewer minutes or room alpha")
        return ToolOutput({"booking": f"B-{len(self.calls)}", "to": ctx.params["organiser"]}, effect_id="B-1")


def toolbox(handled: Handled) -> Toolbox:
    return Toolbox([Tool("find_slots", "Free slots on a date.", FindSlots, handled.find_slots),
                    Tool("book_room", "Book a room.", BookRoom, handled.book_room, effect="booking")])


def context(key: str | None = "sched/run-1/turn-1/call-0") -> ToolContext:
    return ToolContext("run-1", 1, 0, call_id="c0", idempotency_key=key, params={"organiser": "o@example.com"},
                       services=object())


def test_the_specs_come_from_the_models_json_schemas():
    box = toolbox(Handled())
    specs = box.specs()
    assert [s["function"]["name"] for s in specs] == ["find_slots", "book_room"] == list(box.names)
    book = specs[1]["function"]
    assert book["description"] == "Book a room."
    params = book["parameters"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["room", "start", "minutes"]
    assert params["properties"]["room"] == {"enum": ["alpha", "beta"], "type": "string"}
    assert params["properties"]["minutes"] == {"exclusiveMinimum": 0, "maximum": 480, "type": "integer"}
    assert params["properties"]["attendees"]["items"] == {"$ref": "#/$defs/Attendee"}
    assert "title" not in json.dumps(params), "pydantic's generated titles are left out"
    assert box.effects == {"book_room": "booking"}
    assert box.signature() == (
        "tool find_slots::date=string",
        "tool book_room:booking:room=string,start=string,minutes=integer,floor=string?,budget=number?,"
        "projector=boolean?,attendees=array?,tags=array?")


def test_a_call_is_checked_and_dispatched_to_its_declared_handler_with_its_context():
    handled = Handled()
    box = toolbox(handled)
    args = {"room": "alpha", "start": "2026-12-03T10:00", "minutes": 30, "floor": "first", "budget": 12.5,
            "projector": True, "attendees": [{"name": "Ana"}, {"name": "Bo", "optional": True}], "tags": ["x"]}
    out = asyncio.run(box.call("book_room", json.dumps(args), context()))
    assert out == ToolOutput({"booking": "B-1", "to": "o@example.com"}, effect_id="B-1")
    name, checked, ctx = handled.calls[0]
    assert name == "book_room" and isinstance(checked, BookRoom)
    assert checked.floor is Floor.FIRST and checked.attendees[1] == Attendee(name="Bo", optional=True)
    assert ctx.idempotency_key == "sched/run-1/turn-1/call-0" and (ctx.run_id, ctx.turn, ctx.index) == ("run-1", 1, 0)
    # A read-only tool is given no key, whatever the engine passed.
    slots = asyncio.run(box.call("find_slots", '{"date": "2026-12-03"}', context()))
    assert slots.content == {"slots": ["2026-12-03T09:00"]} and handled.calls[1][2].idempotency_key is None
    # A tool with an effect is never run without its key.
    with pytest.raises(ValueError, match="needs the call's idempotency key"):
        asyncio.run(box.call("book_room", json.dumps(args), context(key=None)))
    # A handler's refusal goes back as it said it.
    with pytest.raises(ToolRefused, match="room beta is booked for at most 60"):
        asyncio.run(box.call("book_room", json.dumps({**args, "room": "beta", "minutes": 90}), context()))


def test_an_unknown_tool_is_refused_back_and_no_handler_runs():
    handled = Handled()
    box = toolbox(handled)
    for name in ("create_ticket", "book_rooms", "", "x" * 200):
        with pytest.raises(ToolRefused) as refused:
            asyncio.run(box.call(name, '{"date": "2026-12-03"}', context()))
        assert refused.value.reason.startswith("unknown tool ") and "the tools are find_slots, book_room" in str(
            refused.value)
        assert len(refused.value.reason) < 150
    assert handled.calls == []


GOOD = {"room": "alpha", "start": "10:00", "minutes": 30}


@pytest.mark.parametrize(("arguments", "says"), [
    ("not json", "are not JSON; give a JSON object"),
    ('{"room": "alpha", "start": "10:00", "minutes": NaN}', "are not JSON"),
    ('{"room": "alpha", "start": "10:00", "minutes": Infinity}', "are not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"room": "alpha", "room": "beta", "start": "10:00", "minutes": 30}', "give 'room' more than once"),
    (json.dumps({**GOOD, "minutes": 1e3}), "minutes of book_room: input should be a valid integer, got 1000.0"),
    ('{"room": "alpha", "start": "10:00", "minutes": 1e3}', "valid integer"),
    (json.dumps({**GOOD, "minutes": True}), "valid integer, got True"),
    (json.dumps({**GOOD, "minutes": "30"}), "valid integer, got '30'"),
    (json.dumps({**GOOD, "minutes": 0}), "minutes of book_room: input should be greater than 0, got 0"),
    (json.dumps({**GOOD, "minutes": 481}), "less than or equal to 480"),
    (json.dumps({**GOOD, "room": "gamma"}), "room of book_room: input should be 'alpha' or 'beta', got 'gamma'"),
    (json.dumps({**GOOD, "floor": "roof"}), "floor of book_room: input should be 'ground' or 'first'"),
    (json.dumps({**GOOD, "projector": "yes"}), "projector of book_room: input should be a valid boolean"),
    (json.dumps({**GOOD, "budget": "12"}), "budget of book_room: input should be a valid number"),
    (json.dumps({**GOOD, "attendees": {"name": "Ana"}}), "attendees of book_room: input should be a valid array"),
    (json.dumps({**GOOD, "attendees": [{"name": ""}]}), "attendees[0].name of book_room: string should have at least"),
    (json.dumps({**GOOD, "attendees": [{"name": "A", "role": "x"}]}), "it has no 'attendees[0].role'"),
    (json.dumps({**GOOD, "tags": ["a", "b", "c", "d"]}), "tags of book_room: list should have at most 3 items"),
    (json.dumps({"room": "alpha"}), "book_room needs 'start'; book_room needs 'minutes'"),
    (json.dumps({**GOOD, "to": "x@evil", "cc": 1}), "book_room takes room, start, minutes, floor, budget, "
                                                    "projector, attendees, tags; it has no 'to', 'cc'"),
    (json.dumps({**GOOD, "budget": "x", "minutes": -1, "room": "x", "floor": 3}), "; and 1 more"),
])
def test_hostile_arguments_are_refused_with_a_reason_and_nothing_runs(arguments, says):
    handled = Handled()
    with pytest.raises(ToolRefused) as refused:
        asyncio.run(toolbox(handled).call("book_room", arguments, context()))
    assert says in refused.value.reason, refused.value.reason
    assert len(refused.value.reason) < 400 and refused.value.reason.isprintable()
    assert handled.calls == []


def test_the_models_text_is_quoted_safely_and_cut():
    box = toolbox(Handled())
    with pytest.raises(ToolRefused) as refused:
        box.check("book_room", json.dumps({**GOOD, "room": "\x1b[2J\u202e" + "y" * 500}))
    reason = refused.value.reason
    assert "\x1b" not in reason and "\u202e" not in reason and "\\x1b[2J\\u202e" in reason and "y" * 50 not in reason


def test_a_declaration_that_breaks_the_rules_is_refused_when_it_is_made():
    handled = Handled()

    class Open(BaseModel):  # extra fields ignored: a field the model added would pass unseen
        date: str

    class Closed(BaseModel):
        model_config = ConfigDict(extra="forbid")
        date: str

    with pytest.raises(ValueError, match="must refuse extra fields"):
        Tool("find_slots", "d", Open, handled.find_slots)
    assert Tool("find_slots", "d", Closed, handled.find_slots).signature() == "tool find_slots::date=string"
    for name in ("", "has space", "x" * 65, "naïve"):
        with pytest.raises(ValueError, match="a tool's name"):
            Tool(name, "d", FindSlots, handled.find_slots)
    with pytest.raises(ValueError, match="an effect kind"):
        Tool("book_room", "d", BookRoom, handled.book_room, effect="")
    with pytest.raises(ValueError, match="two tools are named 'find_slots'"):
        Toolbox([Tool("find_slots", "d", FindSlots, handled.find_slots)] * 2)


def test_a_retry_asks_the_tools_lookup_first_and_takes_what_its_service_applied():
    handled = Handled()
    held: dict[str, Applied | None] = {}
    asked: list[tuple[str, object]] = []

    async def lookup(key: str, services: object) -> Applied | None:
        asked.append((key, services))
        return held.get(key)

    box = Toolbox([Tool("book_room", "Book a room.", BookRoom, handled.book_room, effect="booking", lookup=lookup)])
    args = json.dumps({"room": "alpha", "start": "2026-12-03T10:00", "minutes": 30})
    key = "sched/run-1/turn-1/call-0"
    # A first attempt (or one whose number the engine does not know) sends at once: nothing to ask yet.
    for attempt in (None, 1):
        asyncio.run(box.call("book_room", args, dataclasses.replace(context(), attempt=attempt)))
    assert asked == [] and len(handled.calls) == 2
    # A retry asks first. The key never reached the service, or reached it and nothing was stored: sent again,
    # under the same key, by the handler.
    for answer in (None, Applied(False, requests=1)):
        held[key] = answer
        asyncio.run(box.call("book_room", args, dataclasses.replace(context(), attempt=2)))
    assert len(handled.calls) == 4 and [k for k, _ in asked] == [key, key]
    # Applied, its answer kept: that answer, replayed, and the handler is not run.
    held[key] = Applied(True, ToolOutput({"booking": "B-1"}, "B-1"), "2026-12-03T09:00:00Z", {"booking_id": "B-1"}, 1)
    out = asyncio.run(box.call("book_room", args, dataclasses.replace(context(), attempt=3)))
    assert out == ToolOutput({"booking": "B-1"}, "B-1", replayed=True) and len(handled.calls) == 4
    # Applied, its answer not kept by the service: the handler sends again and the service must replay it.
    held[key] = Applied(True)
    asyncio.run(box.call("book_room", args, dataclasses.replace(context(), attempt=4)))
    assert len(handled.calls) == 5
    # Arguments are checked before anything is asked.
    with pytest.raises(ToolRefused):
        asyncio.run(box.call("book_room", '{"room": "gamma"}', dataclasses.replace(context(), attempt=2)))
    assert len(asked) == 4  # the refused call asked nothing
    # A lookup belongs to a tool with an effect.
    with pytest.raises(ValueError, match="a read-only tool applies nothing to look up"):
        Tool("find_slots", "d", FindSlots, handled.find_slots, lookup=lookup)


def test_settle_asks_each_calls_tool_and_says_where_it_cannot():
    from durable_agents.steps.settle import CANNOT_ASK, answer_text, settle_calls, what_retry_does

    handled = Handled()

    async def lookup(key: str, services: object) -> Applied | None:
        assert services == "the agent's services"
        return {"k-applied": Applied(True, ToolOutput({"booking": "B-1"}, "B-1"), "2026-12-03T09:00:00Z",
                                     {"booking_id": "B-1"}, 2),
                "k-seen": Applied(False, requests=1)}.get(key)

    box = Toolbox([Tool("book_room", "Book a room.", BookRoom, handled.book_room, effect="booking", lookup=lookup),
                   Tool("cancel", "Cancel.", FindSlots, handled.find_slots, effect="cancel")])
    calls = {"turn-1/call-0": ("book_room", "k-applied"), "turn-1/call-1": ("book_room", "k-seen"),
             "turn-2/call-0": ("book_room", "k-never"), "turn-2/call-1": ("cancel", "k-cancel"),
             "turn-3/call-0": ("gone", "k-gone")}
    report = asyncio.run(settle_calls(calls, box, "the agent's services"))
    assert [(e["step"], e["tool"], e["state"], e["requests"]) for e in report] == [
        ("turn-1/call-0", "book_room", "applied", 2), ("turn-1/call-1", "book_room", "not applied", 1),
        ("turn-2/call-0", "book_room", "never seen", 0), ("turn-2/call-1", "cancel", CANNOT_ASK, None),
        ("turn-3/call-0", "gone", CANNOT_ASK, None)]
    assert report[0]["ids"] == {"booking_id": "B-1"} and report[0]["applied_at"] == "2026-12-03T09:00:00Z"
    assert answer_text(report[0]) == ("applied at 2026-12-03T09:00:00Z (booking_id B-1; 2 request(s) carried the "
                                      "key): it happened, once")
    assert answer_text(report[3]).startswith("cannot ask: tool cancel declares no lookup by key")
    assert "has no tool 'gone'" in answer_text(report[4])
    assert "its service must apply at most one request per key" in what_retry_does(report[3])


def test_a_crash_point_no_code_reaches_is_said_not_silently_armed():
    """``CRASH_AT=tool:<effect kind>:after_effect`` (the kind, not the tool) or a name of no shape would kill
    nothing: a kill test would pass untested. Each process serving agents says so at its start."""
    from durable_agents.steps.served import Served, unreached_points
    from tests.agents.notebook import NOTEBOOK

    served = [Served(NOTEBOOK)]
    said = unreached_points({"tool:note:after_effect", "bogus", "tool:write_note:after_effect",
                             "tool:issue_refund:after_effect", "turn:after_answer", "temporal:loop:after_turn"},
                            served)
    assert len(said) == 2, said
    assert "'bogus', which is no crash point" in said[0]
    assert "no agent served here has a tool 'note'" in said[1] and "write_note" in said[1]
