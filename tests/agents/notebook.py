"""A test-only agent from outside the lab: a notebook keeper whose tools none of the lab's code names.

``read_page(page)`` reads; ``write_note(title, text, tags, priority)`` (effect ``note``) and ``archive(page,
reason)`` (effect ``archive``) write to its own store, a SQLite file (``NOTEBOOK_DB``) that applies one
request per idempotency key and counts every request it is sent per key. ``write_note`` declares a lookup
by key (counted too), so its retry after a kill asks instead of sending again; ``archive`` declares none,
so its retry sends again under the same key and ``settle`` cannot ask of it. Its model is scripted (three
turns: read, then write and archive, then answer) and logs each turn it is asked into the same file, so a
test counts from outside a killed worker what was applied and what was asked. The run's parameter
``owner`` goes on every note: never from the model.
"""

from __future__ import annotations

import json
import os
import sqlite3
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from durable_agents import Agent, Applied, Arguments, ScriptedModel, Tool, Toolbox, ToolContext, ToolOutput, ToolRefused


class Store:
    """The agent's own service: one effect per key (``apply``), every request counted."""

    def __init__(self, path: str) -> None:
        self.path = path
        with self._db() as db:
            db.executescript("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, key TEXT UNIQUE, "
                             "kind TEXT, body TEXT);"
                             "CREATE TABLE IF NOT EXISTS requests (key TEXT, kind TEXT);"
                             "CREATE TABLE IF NOT EXISTS lookups (key TEXT);"
                             "CREATE TABLE IF NOT EXISTS asks (turn INTEGER);")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def apply(self, key: str, kind: str, body: dict) -> tuple[int, bool]:
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO requests VALUES (?, ?)", (key, kind))
            row = db.execute("SELECT id FROM effects WHERE key = ?", (key,)).fetchone()
            if row is None:
                row = (db.execute("INSERT INTO effects (key, kind, body) VALUES (?, ?, ?)",
                                  (key, kind, json.dumps(body, sort_keys=True))).lastrowid,)
                replayed = False
            else:
                replayed = True
            db.execute("COMMIT")
            return int(row[0]), replayed
        finally:
            db.close()

    def lookup(self, key: str) -> int | None:
        """The id of the effect applied under ``key``, or None; every lookup counted."""
        db = self._db()
        try:
            db.execute("INSERT INTO lookups VALUES (?)", (key,))
            row = db.execute("SELECT id FROM effects WHERE key = ?", (key,)).fetchone()
            return None if row is None else int(row[0])
        finally:
            db.close()

    def asked(self, turn: int) -> None:
        db = self._db()
        try:
            db.execute("INSERT INTO asks VALUES (?)", (turn,))
        finally:
            db.close()


def store() -> Store:
    return Store(os.environ["NOTEBOOK_DB"])


class Page(Arguments):
    page: Annotated[int, Field(ge=1, le=99)]


class Note(Arguments):
    title: Annotated[str, Field(min_length=1, max_length=80)]
    text: str
    tags: list[str]
    priority: Literal["low", "high"] = "low"


class Reason(StrEnum):
    done = "done"
    stale = "stale"


class Archive(Arguments):
    page: Annotated[int, Field(ge=1, le=99)]
    reason: Reason


async def read_page(args: Page, ctx: ToolContext) -> ToolOutput:
    if args.page > 3:
        raise ToolRefused(f"the notebook has 3 pages; there is no page {args.page}")
    return ToolOutput({"page": args.page, "text": f"page {args.page}: call the plumber on Tuesday"})


async def write_note(args: Note, ctx: ToolContext) -> ToolOutput:
    body = {**args.model_dump(), "owner": ctx.params["owner"]}
    note_id, replayed = ctx.services.apply(ctx.key, "note", body)
    return ToolOutput({"note_id": note_id}, str(note_id), replayed)


async def note_applied(key: str, services: Store) -> Applied | None:
    note_id = services.lookup(key)
    return None if note_id is None else Applied(True, ToolOutput({"note_id": note_id}, str(note_id)))


async def archive(args: Archive, ctx: ToolContext) -> ToolOutput:
    done_id, replayed = ctx.services.apply(ctx.key, "archive", {"page": args.page, "reason": args.reason.value})
    return ToolOutput({"archived": args.page}, str(done_id), replayed)


def script(messages: list[dict]) -> object:
    turn = 1 + sum(m["role"] == "assistant" for m in messages)
    store().asked(turn)
    if turn == 1:
        return [("read_page", {"page": 1})]
    if turn == 2:
        return [("write_note", {"title": "Plumber", "text": "call on Tuesday", "tags": ["home"], "priority": "high"}),
                ("archive", {"page": 1, "reason": "done"})]
    return "Noted the plumber and archived page 1."


NOTEBOOK = Agent(
    "notebook",
    "You keep a notebook: read pages, write notes of what must be done, archive pages that are done.",
    Toolbox([
        Tool("read_page", "Read one page of the notebook.", Page, read_page),
        Tool("write_note", "Write a note.", Note, write_note, effect="note", lookup=note_applied),
        Tool("archive", "Archive a page.", Archive, archive, effect="archive"),
    ]),
    model=ScriptedModel(script, name="notebook-script"),
    services=store,
    params=("owner",),
)
