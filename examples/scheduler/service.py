"""The meeting scheduler's booking service: JSON over HTTP, everything in one SQLite file of its own.

    python -m examples.scheduler.service --db PATH [--port 0] [--port-file FILE]

Binds 127.0.0.1, writes the port into ``--port-file`` (atomically) if given, then prints exactly one line,
``scheduler listening on http://127.0.0.1:PORT``, flushed. Endpoints, JSON in and out (errors are
``{"error": "..."}``): ``GET /slots?date=YYYY-MM-DD``, ``POST /bookings`` ``{"room", "start", "minutes"}``,
``POST /invites`` ``{"to", "subject", "body"}``, ``GET /effects/<url-quoted key>``, ``GET /counts``; anything
else 404, a body over 64 KB 413, malformed JSON 400.

Contract of the two POSTs: an ``Idempotency-Key`` header is required (1-200 printable ASCII characters, else
400). The first request under a key is validated (422 and nothing stored when refused) and applied: the effect,
the key, the request's canonical JSON and the response are committed in one transaction (WAL, synchronous=FULL:
once the 201 is sent it survives a kill). The same key with the same body and endpoint answers 200 with the
stored response and ``"replayed": true``; with anything else, 409. Every request seen under a key is counted in
a separate table, committed before the request is answered, replays and refusals included; every
``GET /effects/<key>`` (a lookup by key) likewise in another. ``/counts`` answers ``{"applied", "requests",
"lookups"}``, each by key.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, unquote, urlsplit

ROOMS = ("atlas", "borealis")
OPEN, CLOSE, SLOT = 9 * 60, 17 * 60, 30  # minutes after midnight; slot length in minutes
MAX_BODY = 64 * 1024
KEY = re.compile(r"[\x20-\x7e]{1,200}")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
START = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")
SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (id INTEGER PRIMARY KEY AUTOINCREMENT, room TEXT NOT NULL,
                                     start TEXT NOT NULL, minutes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS invites (id INTEGER PRIMARY KEY AUTOINCREMENT, to_addr TEXT NOT NULL,
                                    subject TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, kind TEXT NOT NULL, request TEXT NOT NULL,
                                    response TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (key TEXT PRIMARY KEY, seen INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lookups (key TEXT PRIMARY KEY, seen INTEGER NOT NULL);
"""

Json = dict[str, Any]


class Refused(Exception):
    """An answer other than success: ``status`` with ``{"error": message}``; the transaction rolls back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Store:
    """The SQLite file. One connection per use; writers serialised by a lock and ``BEGIN IMMEDIATE``."""

    def __init__(self, path: Path) -> None:
        self.path, self.lock = path, threading.Lock()
        with self.connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode whose commits are synced (synchronous=FULL); closed after."""
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        try:
            db.execute("PRAGMA synchronous=FULL")
            yield db
        finally:
            db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back when it raises."""
        with self.lock, self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def refuse(message: str, status: int = 422) -> NoReturn:
    """Answer ``status`` with ``{"error": message}`` (422 by default: a refusal of the values given)."""
    raise Refused(status, message)


def booked(db: sqlite3.Connection, room: str, day: date) -> list[tuple[int, int]]:
    """The (start, end) minutes after midnight of the room's bookings on that day."""
    rows = db.execute("SELECT start, minutes FROM bookings WHERE room = ? AND start LIKE ?", (room, f"{day}T%"))
    starts = [(int(start[11:13]) * 60 + int(start[14:16]), minutes) for start, minutes in rows]
    return [(begin, begin + minutes) for begin, minutes in starts]


def slots(store: Store, query: str) -> Json:
    """Free half-hour slots of every room on ``?date=YYYY-MM-DD``, 09:00 to 17:00."""
    given = parse_qs(query).get("date", [])
    try:
        day = date.fromisoformat(given[0]) if len(given) == 1 and DATE.fullmatch(given[0]) else None
    except ValueError:
        day = None
    if day is None:
        refuse("give one date as ?date=YYYY-MM-DD, e.g. ?date=2030-01-07", 400)
    free = []
    with store.connect() as db:
        for room in ROOMS:
            taken = booked(db, room, day)
            free += [{"room": room, "start": f"{day}T{m // 60:02d}:{m % 60:02d}", "minutes": SLOT}
                     for m in range(OPEN, CLOSE, SLOT) if not any(b < m + SLOT and m < e for b, e in taken)]
    return {"date": day.isoformat(), "slots": free}


def fields(body: Json, names: set[str]) -> None:
    """Refuse a body whose fields are not exactly ``names``."""
    if set(body) != names:
        refuse(f"give exactly the fields {sorted(names)}, not {sorted(body)}")


def book(db: sqlite3.Connection, body: Json) -> Json:
    """Validate and store one booking; Refused(422) for a bad value or an overlap."""
    fields(body, {"room", "start", "minutes"})
    room, start, minutes = body["room"], body["start"], body["minutes"]
    if room not in ROOMS:
        refuse(f"room must be one of {', '.join(ROOMS)}")
    try:
        when = datetime.strptime(start, "%Y-%m-%dT%H:%M") if isinstance(start, str) and START.fullmatch(start) else None
    except ValueError:
        when = None
    if when is None or when.minute % SLOT or not OPEN <= when.hour * 60 + when.minute < CLOSE:
        refuse("start must be YYYY-MM-DDTHH:MM on the half hour, from 09:00 to 16:30")
    if type(minutes) is not int or minutes % SLOT or not SLOT <= minutes <= 240:
        refuse("minutes must be a multiple of 30 from 30 to 240")
    begin = when.hour * 60 + when.minute
    if begin + minutes > CLOSE:
        refuse("the booking would end past 17:00")
    if any(b < begin + minutes and begin < e for b, e in booked(db, room, when.date())):
        refuse(f"{room} is already booked during {start} for {minutes} minutes")
    row = db.execute("INSERT INTO bookings (room, start, minutes) VALUES (?, ?, ?)", (room, start, minutes))
    return {"booking_id": f"bk_{row.lastrowid}", "room": room, "start": start, "minutes": minutes}


def invite(db: sqlite3.Connection, body: Json) -> Json:
    """Validate and store one invite; Refused(422) for a bad value."""
    fields(body, {"to", "subject", "body"})
    to, subject, text = body["to"], body["subject"], body["body"]
    if not isinstance(to, str) or to.count("@") != 1 or any(c.isspace() for c in to) or to[0] == "@" or to[-1] == "@":
        refuse("to must be an email address: one @, no whitespace")
    if not isinstance(subject, str) or not 1 <= len(subject) <= 200 or any(ord(c) < 32 or 127 <= ord(c) < 160
                                                                            for c in subject):
        refuse("subject must be 1-200 characters without control characters")
    if not isinstance(text, str) or not 1 <= len(text) <= 4000:
        refuse("body must be 1-4000 characters")
    row = db.execute("INSERT INTO invites (to_addr, subject, body) VALUES (?, ?, ?)", (to, subject, text))
    return {"invite_id": f"inv_{row.lastrowid}", "to": to}


def count(store: Store, key: str) -> None:
    """Count one request seen under ``key``, in its own committed transaction, whatever its answer will be."""
    with store.transaction() as db:
        db.execute("INSERT INTO requests (key, seen) VALUES (?, 1) ON CONFLICT (key) DO UPDATE SET seen = seen + 1",
                   (key,))


def apply(store: Store, kind: str, key: str, body: Json, effect: Callable[[sqlite3.Connection, Json], Json]
          ) -> tuple[int, Json]:
    """Apply ``effect`` once under ``key``: replay, 409 or apply, as the module's docstring says."""
    request = json.dumps(body, sort_keys=True, separators=(",", ":"))
    with store.transaction() as db:
        row = db.execute("SELECT kind, request, response FROM effects WHERE key = ?", (key,)).fetchone()
        if row is not None:
            if (row[0], row[1]) != (kind, request):
                refuse(f"idempotency key {key!r} was used for another request", 409)
            return 200, {**json.loads(row[2]), "replayed": True}
        response = effect(db, body)
        db.execute("INSERT INTO effects (key, kind, request, response) VALUES (?, ?, ?, ?)",
                   (key, kind, request, json.dumps(response)))
    return 201, {**response, "replayed": False}


class Server(ThreadingHTTPServer):
    """A threading HTTP server holding the store its handlers use."""

    def __init__(self, port: int, store: Store) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.store = store


class Handler(BaseHTTPRequestHandler):
    """Routes each request and answers JSON, always with a Content-Length (HTTP/1.1 keep-alive)."""

    protocol_version = "HTTP/1.1"
    server: Server

    def do_GET(self) -> None:
        if self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # a GET's body is never read, so the connection cannot be reused
        self.answer(self.get)

    def do_POST(self) -> None:
        self.answer(self.post)

    def do_PUT(self) -> None:
        self.close_connection = True  # a body may be left unread
        self.answer(lambda: refuse("no such endpoint", 404))

    do_DELETE = do_PATCH = do_PUT

    def get(self) -> tuple[int, Json]:
        url = urlsplit(self.path)
        if url.path == "/slots":
            return 200, slots(self.server.store, url.query)
        if url.path == "/counts":
            with self.server.store.connect() as db:
                applied = dict(db.execute("SELECT key, COUNT(*) FROM effects GROUP BY key").fetchall())
                seen = dict(db.execute("SELECT key, seen FROM requests").fetchall())
                looked = dict(db.execute("SELECT key, seen FROM lookups").fetchall())
            return 200, {"applied": applied, "requests": seen, "lookups": looked}
        if url.path.startswith("/effects/"):
            with self.server.store.connect() as db:
                key = unquote(url.path.removeprefix("/effects/"))
                db.execute("INSERT INTO lookups (key, seen) VALUES (?, 1) ON CONFLICT (key) DO UPDATE SET "
                           "seen = seen + 1", (key,))
                row = db.execute("SELECT kind, response FROM effects WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return 200, {"key": key, "kind": row[0], "response": json.loads(row[1])}
            refuse("no effect under that key", 404)
        refuse("no such endpoint", 404)

    def post(self) -> tuple[int, Json]:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            refuse("give the body with a Content-Length", 411)
        length = self.headers.get("Content-Length", "0").strip()
        if not (length.isascii() and length.isdigit()):
            self.close_connection = True
            refuse("give a Content-Length in bytes", 400)
        if int(length) > MAX_BODY:
            self.close_connection = True
            refuse(f"the body is over {MAX_BODY // 1024} KB", 413)
        raw = self.rfile.read(int(length))
        effect = {"/bookings": ("booking", book), "/invites": ("invite", invite)}.get(urlsplit(self.path).path)
        if effect is None:
            refuse("no such endpoint", 404)
        key = self.headers.get("Idempotency-Key")
        if key is None or not KEY.fullmatch(key):
            refuse("give an Idempotency-Key header of 1-200 printable ASCII characters", 400)
        count(self.server.store, key)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            refuse("the body must be a JSON object", 400)
        return apply(self.server.store, effect[0], key, body, effect[1])

    def answer(self, route: Callable[[], tuple[int, Json]]) -> None:
        try:
            status, payload = route()
        except Refused as refused:
            status, payload = refused.status, {"error": refused.message}
        except Exception as error:  # a bug or a broken database: a 500 the client may retry, never a hang
            status, payload, self.close_connection = 500, {"error": f"internal error: {error!r}"}, True
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: stdout carries the one ready line only, and a test need not drain stderr."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.scheduler.service", description=__doc__.split("\n")[0])
    parser.add_argument("--db", type=Path, required=True, help="the SQLite file (created if missing)")
    parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--port-file", type=Path, help="write the port bound into this file")
    args = parser.parse_args(argv)
    server = Server(args.port, Store(args.db))
    if args.port_file is not None:
        partial = args.port_file.with_name(args.port_file.name + ".partial")
        partial.write_text(f"{server.server_port}\n")
        partial.replace(args.port_file)
    print(f"scheduler listening on http://127.0.0.1:{server.server_port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
