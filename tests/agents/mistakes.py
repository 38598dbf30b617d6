"""A shop agent, written right (``HONEST``) and with the mistakes a user of the adapter can make with a tool that
has an effect, for the kill matrix to catch (tests/test_kill_matrix.py):

- ``FRESH_ID``: the handler sends an id of its own making instead of the key it is given;
- ``ATTEMPT_IN_KEY``: the handler adds the attempt number to the key;
- ``READ_ONLY_WRITER``: the tool writes but is declared read-only (no effect kind), so it is given no key and
  sends a fresh id each time.

Its service is a SQLite file (``SHOP_DB``): one order per request key, each order with the run it was made
for, so ``orders(run_id)`` (the tests' probe) counts what a run applied whatever key it was sent under. The
model is scripted: turn 1 orders tea, turn 2 answers.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable

from durable_agents import Agent, Applied, Arguments, ScriptedModel, Tool, Toolbox, ToolContext, ToolOutput


class Shop:
    def __init__(self, path: str) -> None:
        self.path = path
        with sqlite3.connect(path, timeout=10) as db:
            db.execute("CREATE TABLE IF NOT EXISTS orders "
                       "(id INTEGER PRIMARY KEY, key TEXT UNIQUE, run TEXT, item TEXT)")

    def order(self, key: str, run: str, item: str) -> tuple[int, bool]:
        with sqlite3.connect(self.path, timeout=10) as db:
            row = db.execute("SELECT id FROM orders WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return int(row[0]), True
            return int(db.execute("INSERT INTO orders (key, run, item) VALUES (?, ?, ?)",
                                  (key, run, item)).lastrowid or 0), False

    def find(self, key: str) -> int | None:
        with sqlite3.connect(self.path, timeout=10) as db:
            row = db.execute("SELECT id FROM orders WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])


def shop() -> Shop:
    return Shop(os.environ["SHOP_DB"])


def orders(run_id: str) -> dict[str, int]:
    """The probe: what the shop applied for ``run_id``, per item, whatever key each order came under."""
    with sqlite3.connect(os.environ["SHOP_DB"], timeout=10) as db:
        rows = db.execute("SELECT item, count(*) FROM orders WHERE run = ? GROUP BY item", (run_id,)).fetchall()
    return {f"order of {item}": int(n) for item, n in rows}


class Item(Arguments):
    item: str


def _placing(key_of: Callable[[ToolContext], str]) -> Callable[..., object]:
    async def place_order(args: Item, ctx: ToolContext) -> ToolOutput:
        order_id, replayed = ctx.services.order(key_of(ctx), ctx.run_id, args.item)
        return ToolOutput({"order_id": order_id}, str(order_id), replayed)

    return place_order


async def found(key: str, services: Shop) -> Applied | None:
    order_id = services.find(key)
    return None if order_id is None else Applied(True, ToolOutput({"order_id": order_id}, str(order_id)))


def script(messages: list[dict]) -> object:
    turn = 1 + sum(m["role"] == "assistant" for m in messages)
    return [("place_order", {"item": "tea"})] if turn == 1 else "Ordered tea."


def _agent(name: str, key_of: Callable[[ToolContext], str], effect: str | None = "order") -> Agent:
    tool = Tool("place_order", "Order an item.", Item, _placing(key_of), effect=effect,
                lookup=found if effect else None)
    return Agent(name, "You order what you are asked to.", Toolbox([tool]),
                 model=ScriptedModel(script, name="shop-script"), services=shop)


HONEST = _agent("shop", lambda ctx: ctx.key)
FRESH_ID = _agent("shop-fresh-id", lambda ctx: uuid.uuid4().hex)
ATTEMPT_IN_KEY = _agent("shop-attempt-in-key", lambda ctx: f"{ctx.key}/attempt-{ctx.attempt}")
READ_ONLY_WRITER = _agent("shop-read-only", lambda ctx: uuid.uuid4().hex, effect=None)
