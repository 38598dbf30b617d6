"""A meeting scheduler, an agent from outside the lab, declared in 40 lines (docs/your-agent.md)."""
import json
import os

from durable_agents import Agent, Arguments, ScriptedModel, Tool, Toolbox, ToolContext, ToolOutput, ToolRefused
from examples.scheduler.client import SchedulerClient, SchedulerRefused, applied


class Day(Arguments):
    date: str  # YYYY-MM-DD


class Booking(Arguments):
    room: str
    start: str  # YYYY-MM-DDTHH:MM
    minutes: int


class Invite(Arguments):
    subject: str
    body: str


async def find_slots(args: Day, ctx: ToolContext) -> ToolOutput:
    return ToolOutput({"slots": (await ctx.services.find_slots(args.date))[:4]})


async def book_room(args: Booking, ctx: ToolContext) -> ToolOutput:
    try:  # the call's idempotency key goes to the service, which applies one booking per key
        booked = await ctx.services.book_room(ctx.key, args.room, args.start, args.minutes)
    except SchedulerRefused as err:  # the slot is taken, or a value is wrong: the model is told why
        raise ToolRefused(err.message) from None
    return ToolOutput(booked, booked["booking_id"], booked["replayed"])


async def send_invite(args: Invite, ctx: ToolContext) -> ToolOutput:
    to = ctx.params["attendee"]  # the run's parameter: an address never comes from the model
    sent = await ctx.services.send_invite(ctx.key, to, args.subject, args.body)
    return ToolOutput(sent, sent["invite_id"], sent["replayed"])


def script(messages: list[dict]) -> object:  # the model, as data: each turn from the window it is given
    turn = sum(m["role"] == "assistant" for m in messages)
    if turn == 0:
        return [("find_slots", {"date": "2027-01-12"})]
    if turn == 1:
        slot = json.loads(messages[-1]["content"])["slots"][0]
        return [("book_room", slot), ("send_invite", {"subject": "Planning", "body": f"See you at {slot['start']}"})]
    return "Booked a room and invited the attendee."


AGENT = Agent("scheduler", "You book a meeting room for the task's day and invite the attendee.",
              Toolbox([Tool("find_slots", "The free half-hour slots on a day.", Day, find_slots),
                       Tool("book_room", "Book a room at a start for minutes.", Booking, book_room, "booking", applied),
                       Tool("send_invite", "Invite the attendee.", Invite, send_invite, "invite", applied)]),
              model=ScriptedModel(script), params=("attendee",),
              services=lambda: SchedulerClient(os.environ.get("SCHEDULER_URL", "http://127.0.0.1:8090")))
