"""The run record in SQLite: schema, migrations, and every write the runner makes.

Durability settings, and why
============================

- ``journal_mode=WAL``: readers (``status``, ``compare``, a second resumer
  asking for the lease) never block the writer, and a commit is one append
  plus one fsync of the write-ahead log.
- ``synchronous=FULL``: the WAL is fsynced at every commit. WAL's usual
  companion, ``NORMAL``, fsyncs only at checkpoints, so the last commits can
  be lost on power loss (not on a process crash). Here a lost commit is not
  a lost cache entry: a lost "step completed" row means the step runs again
  after the reboot, and a lost "intent" row hides that a request may have
  been sent. FULL is what makes "recorded" mean "on disk". Tests and
  benchmarks may lower it (``RUNRECORD_SYNCHRONOUS=NORMAL``, or
  ``synchronous=`` on ``connect`` and ``RunRecord``) to show what that loses
  (``tests/test_power_cut.py``) and what it saves (``bench/bench_sync_levels.py``); at
  NORMAL a commit is on disk only after the next checkpoint, which SQLite runs
  every 1,000 WAL pages and when the last connection to the file closes.
- ``busy_timeout``: the heartbeat thread, a second resumer and the runner may
  want the write lock at once; they wait for it (5 s) instead of failing.

Every write is one ``BEGIN IMMEDIATE`` transaction: the write lock is taken
at the start, so a read-check-write (the lease) cannot interleave with
another process's.

Schema (``PRAGMA user_version`` = ``SCHEMA_VERSION``; ``connect`` creates or
upgrades it with ``durable_agents.storage.sqlite.migrate``, and refuses a database written by
a newer version). Rows are read by column name into their types (``RunRow``,
``StepRow``, ``IntentRow``, whose fields are the columns), so a column an
upgrade adds is read once it is a field, and a file of an older version reads
the same way after its upgrade:

``runs``
    one row per run: the inputs (task, email, conversation id), ``status``
    (running | completed | failed), ``position`` (index of the current step;
    the number of steps once completed), ``error`` (the failed step and the
    reason), the lease (``lease_holder``, ``lease_expires_at``) and times;
    since version 2 ``start_id`` (drawn at start, sent with every effect for
    ``durable_agents.steps.adoption``) and ``retry_rule`` (the JSON ``durable_agents.steps.retry.RetryRule``
    the run runs under); since version 3 ``params`` (the JSON mapping of the
    run's parameters, ``durable_agents.steps.params``: what a step needs beyond the task);
    since version 4 ``loop`` (NULL for a run of the fixed flow; for a run of
    the agent loop, ``durable_agents.steps.loop``, the JSON of its numbers: ``max_turns``,
    ``window_tokens``, ``window_messages``: what marks the run a loop run).
``steps``
    one row per (run, position): for a run of the fixed flow, every step's
    row created with the run; for a loop run, ``turn-1``'s, and the rows a
    recorded turn decides (its calls and the next turn) inserted in the
    commit that records the turn (``complete_step``'s ``added``). Each holds
    the step ``name`` at that position (checked on resume), ``status`` (pending | running |
    completed | failed), ``attempts``, the JSON ``result``, ``last_error`` and
    times of the first attempt, the latest attempt and completion; since
    version 2 what the retry rule keeps (``durable_agents.steps.retry.StepLedger``):
    ``crashes``, ``error_attempts``, ``error_seconds``, ``in_doubt``,
    ``next_try_at``, and ``attempt_open`` (1 from an attempt's start until its
    outcome is recorded: still 1 on resume means the process died in it);
    since version 5 ``same_errors`` and ``same_error``: the newest error
    answered to the step's request and how many attempts in a row ended in it
    (the ledger's row of the same error, kept for a loop's turns only:
    ``durable_agents.steps.loop.same_error_limit``; 0 and NULL otherwise).
``intents``
    one row per attempt of an effectful step: the idempotency key and the JSON
    request, written *before* the request can be sent, and its ``state``:
    ``in_doubt`` (no answer recorded, or an error that does not say whether
    it was applied, a 5xx or a timeout, recorded as its ``outcome``: it may
    or may not have been applied), ``answered`` (a success, recorded with the
    step's result), ``error`` (an error answer, or no answer, recorded),
    ``settled`` (was in doubt; a later attempt with the same key got the
    answer, or ``settle`` recorded the provider's, looked up by key).

All times are Unix seconds (REAL), UTC by construction. The tables are
``WITHOUT ROWID`` (clustered on their primary keys) and carry no secondary
index: a step commit then touches one page per table, which keeps the WAL
frames fsynced per commit, and so the cost per step, close to a bare insert's.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from durable_agents.runrecord.lease import Verdict, check_holder
from durable_agents.steps.approval import TAKEN, Decision, Wait, ended_by_deadline, judge
from durable_agents.storage import sqlite

SCHEMA_VERSION = 6
DEFAULT_DB = ".state/runrecord.db"
BUSY_TIMEOUT_MS = 5000
SYNCHRONOUS_ENV = "RUNRECORD_SYNCHRONOUS"
DEFAULT_SYNCHRONOUS = "FULL"

_SCHEMA_V1 = """
CREATE TABLE runs (
    run_id            TEXT PRIMARY KEY,
    task              TEXT NOT NULL,
    email             TEXT NOT NULL,
    conversation_id   TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    position          INTEGER NOT NULL,
    error             TEXT,
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL,
    lease_holder      TEXT,
    lease_expires_at  REAL
) WITHOUT ROWID;
CREATE TABLE steps (
    run_id              TEXT NOT NULL REFERENCES runs (run_id),
    position            INTEGER NOT NULL,
    name                TEXT NOT NULL,
    status              TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    attempts            INTEGER NOT NULL DEFAULT 0,
    result              TEXT,
    last_error          TEXT,
    started_at          REAL,
    attempt_started_at  REAL,
    completed_at        REAL,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;
CREATE TABLE intents (
    run_id           TEXT NOT NULL,
    position         INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    step             TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    request          TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('in_doubt', 'answered', 'error', 'settled')),
    outcome          TEXT,
    recorded_at      REAL NOT NULL,
    settled_at       REAL,
    PRIMARY KEY (run_id, position, attempt),
    FOREIGN KEY (run_id, position) REFERENCES steps (run_id, position)
) WITHOUT ROWID;
"""

_MIGRATE_V1_TO_V2 = """
ALTER TABLE runs ADD COLUMN start_id TEXT;
ALTER TABLE runs ADD COLUMN retry_rule TEXT;
ALTER TABLE steps ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN error_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN error_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN in_doubt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN next_try_at REAL;
ALTER TABLE steps ADD COLUMN attempt_open INTEGER NOT NULL DEFAULT 0;
UPDATE steps SET attempt_open = 1 WHERE status = 'running'
"""


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    sqlite.run_script(conn, _MIGRATE_V1_TO_V2)


def _v2_to_v3(conn: sqlite3.Connection) -> None:
    """A run's parameters: one JSON column, NULL for the runs before it (no parameters)."""
    conn.execute("ALTER TABLE runs ADD COLUMN params TEXT")


def _v3_to_v4(conn: sqlite3.Connection) -> None:
    """The agent loop's runs: one JSON column, NULL for every run before it (runs of the fixed flow).
    A loop run's steps are rows of ``steps`` like any other's, so no other table changes and every row stays."""
    conn.execute("ALTER TABLE runs ADD COLUMN loop TEXT")


def _v4_to_v5(conn: sqlite3.Connection) -> None:
    """A loop turn's row of the same error (``StepLedger.same_errors``, ``same_error``): a resumed process
    goes on counting it. Every row before it starts with none."""
    conn.execute("ALTER TABLE steps ADD COLUMN same_errors INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE steps ADD COLUMN same_error TEXT")


def _v5_to_v6(conn: sqlite3.Connection) -> None:
    """A loop call that waits for a person: its wait and the decision taken (``durable_agents.steps.approval``),
    a row per waiting call. No run before it had one."""
    conn.execute("""
        CREATE TABLE approvals (
            run_id    TEXT NOT NULL REFERENCES runs (run_id),
            step      TEXT NOT NULL,
            wait      TEXT NOT NULL,
            decision  TEXT,
            outcome   TEXT CHECK (outcome IN ('approved', 'denied', 'expired')),
            PRIMARY KEY (run_id, step)
        ) WITHOUT ROWID""")


# Key = the version a step upgrades *from*. Add a step for each new version;
# never edit a released one.
_UPGRADES: dict[int, sqlite.Step] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6}


def _create(conn: sqlite3.Connection) -> None:
    """An empty file: version 1's schema, then every upgrade, the very statements an old file gets."""
    sqlite.run_script(conn, _SCHEMA_V1)
    for version in sorted(_UPGRADES):
        _UPGRADES[version](conn)


# ---------------------------------------------------------------- errors


class RecordError(Exception):
    """Base class for run-record refusals; the message says what to do."""


class RecordRunNotFound(RecordError, LookupError):
    """No run with that id in this record file (``TemporalRunNotFound`` and ``DbosRunNotFound`` are the other
    engines' answers)."""


class RunExists(RecordError):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(
            f"run {run_id} already exists ({status}); it was not started again. The task and email "
            f"given now were not used: resume it with `python -m durable_agents.runrecord resume {run_id}`, "
            "or pick a new RUN_ID for a new run."
        )
        self.run_id = run_id
        self.status = status


class LeaseHeld(RecordError):
    """Another process holds the run's lease, and is not provably dead (``durable_agents.runrecord.lease``)."""

    def __init__(self, run_id: str, holder: str, expires_at: float, now: float, why: str = "") -> None:
        when = time.strftime("%H:%M:%S", time.localtime(expires_at))
        super().__init__(
            f"run {run_id} is being run by {holder}" + (f" ({why})" if why else "") + f"; its lease expires at "
            f"{when} (in {max(0.0, expires_at - now):.1f} s). If it is alive, let it finish, or add --wait to "
            f"wait until it ends or its lease expires: python -m durable_agents.runrecord resume {run_id} --wait"
        )
        self.run_id = run_id
        self.holder = holder
        self.expires_at = expires_at
        self.why = why


class RunEnded(RecordError):
    """The run is no longer running (it completed or failed), so its lease was not taken."""

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id} is {status}; no lease taken")
        self.run_id = run_id
        self.status = status


class LeaseLost(RecordError):
    """This process's lease expired and was taken (or released) by someone else."""

    def __init__(self, run_id: str, holder: str) -> None:
        super().__init__(
            f"lost the lease on run {run_id} (held as {holder}): another process took it over after it "
            "expired. Stopping without writing; the other process continues the run."
        )


class SchemaError(RecordError):
    pass


class SettingError(RecordError):
    """A durability setting the record cannot run with."""


class RunNotFailed(RecordError):
    """``retry`` of a run that did not fail."""

    def __init__(self, run_id: str, status: str) -> None:
        what = ("a completed run cannot be retried; start a new RUN_ID to do the task again"
                if status == "completed" else "it is still running; `resume` continues it")
        super().__init__(f"run {run_id} is {status}: {what}")
        self.run_id = run_id
        self.status = status


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ---------------------------------------------------------------- rows
#
# Each row type names its table's columns: its fields are read by column name
# (``SELECT`` built from the fields, ``sqlite3.Row`` by name), so a column added
# by an upgrade is read once it is a field. A field whose metadata says
# ``decode`` is stored as text and decoded (JSON, 0/1 flags); ``column=False``
# is filled by the reader, not selected.

_JSON = {"decode": _load}
_FLAG = {"decode": bool}
_NOT_A_COLUMN = {"column": False}


@dataclass
class StepRow:
    position: int
    name: str
    status: str
    attempts: int
    result: Any = field(metadata=_JSON)
    last_error: str | None
    started_at: float | None
    attempt_started_at: float | None
    completed_at: float | None
    crashes: int = 0
    error_attempts: int = 0
    error_seconds: float = 0.0
    in_doubt: bool = field(default=False, metadata=_FLAG)
    next_try_at: float | None = None
    attempt_open: bool = field(default=False, metadata=_FLAG)
    same_errors: int = 0
    same_error: str | None = None


@dataclass
class IntentRow:
    position: int
    attempt: int
    step: str
    idempotency_key: str
    request: Any = field(metadata=_JSON)
    state: str
    outcome: Any = field(metadata=_JSON)
    recorded_at: float
    settled_at: float | None


@dataclass
class RunRow:
    run_id: str
    task: str
    email: str
    conversation_id: str
    status: str
    position: int
    error: str | None
    created_at: float
    updated_at: float
    lease_holder: str | None
    lease_expires_at: float | None
    start_id: str | None = None
    retry_rule: Any = field(default=None, metadata=_JSON)
    params: Any = field(default=None, metadata=_JSON)
    # a loop run's numbers (durable_agents.steps.loop); None: the fixed flow
    loop: Any = field(default=None, metadata=_JSON)
    steps: list[StepRow] = field(default_factory=list, metadata=_NOT_A_COLUMN)

    def results(self) -> dict[str, Any]:
        """Recorded results of the completed steps, by name: the truth on resume."""
        return {s.name: s.result for s in self.steps if s.status == "completed"}


_Row = TypeVar("_Row", StepRow, IntentRow, RunRow)

# Per row type: its columns, each with how its stored value is decoded (None: as stored).
_READERS: dict[type, tuple[tuple[str, Callable[[Any], Any] | None], ...]] = {
    kind: tuple((f.name, f.metadata.get("decode")) for f in fields(kind) if f.metadata.get("column", True))
    for kind in (StepRow, IntentRow, RunRow)
}


def _columns(kind: type) -> str:
    """The ``SELECT`` list of a row type."""
    return ", ".join(name for name, _ in _READERS[kind])


def _from_row(kind: type[_Row], row: sqlite3.Row) -> _Row:
    """A row type from a ``sqlite3.Row`` selected with ``_columns(kind)``: each field by its column's name."""
    return kind(**{name: row[name] if decode is None else decode(row[name]) for name, decode in _READERS[kind]})


class Intent(NamedTuple):
    """What an effectful attempt records before its request can be sent: the key and the JSON request."""

    key: str
    request: Any


@dataclass(frozen=True)
class NextAttempt:
    """The attempt the same transaction records as started (see ``complete_step``)."""

    position: int
    attempt: int
    intent: Intent | None  # for an effectful step
    crashes: int | None = None  # set when the attempt before it died: the step's new crash count


# ---------------------------------------------------------------- connection


def db_path_from(flag: str | None, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(flag or env.get("RUNRECORD_DB") or DEFAULT_DB)


def synchronous_from_env(env: Mapping[str, str] | None = None) -> str:
    """The record's ``synchronous`` level: ``RUNRECORD_SYNCHRONOUS``, FULL when unset."""
    try:
        return sqlite.synchronous_setting(os.environ if env is None else env, SYNCHRONOUS_ENV, DEFAULT_SYNCHRONOUS)
    except ValueError as err:
        raise SettingError(str(err)) from None


def connect(path: str | os.PathLike, synchronous: str | None = None) -> sqlite3.Connection:
    """A connection with the record's durability settings, schema migrated (``durable_agents.storage.sqlite.migrate``).

    ``synchronous``: None reads ``RUNRECORD_SYNCHRONOUS`` (default FULL); see the module docstring."""
    path = Path(path)
    level = sqlite.check_synchronous(synchronous) if synchronous is not None else synchronous_from_env()
    conn = sqlite.connect(path, busy_timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True)
    mode = sqlite.use_wal(conn)
    if mode.lower() != "wal":
        raise SchemaError(f"cannot put {path} in WAL mode (got {mode!r}); is it on a network file system?")
    sqlite.configure(conn, synchronous=level, foreign_keys=True)
    sqlite.migrate(conn, version=SCHEMA_VERSION, create=_create, upgrades=_UPGRADES,
                   refuse=lambda found: _newer(path, found))
    conn.row_factory = sqlite3.Row  # read by column name: see "rows" above
    return conn


def _newer(path: Path, found: int) -> SchemaError:
    return SchemaError(
        f"{path} has run-record schema version {found}; this code knows versions up to "
        f"{SCHEMA_VERSION}. Use the newer code that wrote it."
    )


_SQL_RUN = f"SELECT {_columns(RunRow)} FROM runs WHERE run_id = ?"
_SQL_RUNS = f"SELECT {_columns(RunRow)} FROM runs ORDER BY created_at, run_id"
_SQL_STEPS = f"SELECT {_columns(StepRow)} FROM steps WHERE run_id = ? ORDER BY position"
_SQL_INTENTS = f"SELECT {_columns(IntentRow)} FROM intents WHERE run_id = ? ORDER BY position, attempt"
_SQL_ADVANCE = (
    "UPDATE runs SET position = ?, updated_at = ?, lease_expires_at = ? WHERE run_id = ? AND lease_holder = ?"
)
_SQL_ADVANCE_LAST = (
    "UPDATE runs SET position = ?, status = 'completed', updated_at = ?, lease_holder = NULL, "
    "lease_expires_at = NULL WHERE run_id = ? AND lease_holder = ?"
)
_SQL_STEP_DONE = (
    "UPDATE steps SET status = 'completed', result = ?, completed_at = ?, attempts = ?, attempt_open = 0, "
    "in_doubt = 0, next_try_at = NULL WHERE run_id = ? AND position = ?"
)
_SQL_INTENT_ANSWERED = (
    "UPDATE intents SET state = 'answered', outcome = ?, settled_at = ? "
    "WHERE run_id = ? AND position = ? AND attempt = ?"
)
_SQL_STEP_START = (
    "UPDATE steps SET status = 'running', attempts = ?, attempt_started_at = ?, started_at = coalesce(started_at, ?), "
    "attempt_open = 1, next_try_at = NULL, crashes = coalesce(?, crashes) WHERE run_id = ? AND position = ?"
)
_SQL_STEP_ADD = "INSERT INTO steps (run_id, position, name, status) VALUES (?, ?, ?, 'pending')"
_SQL_INTENT = (
    "INSERT INTO intents (run_id, position, attempt, step, idempotency_key, request, state, recorded_at) "
    "VALUES (?, ?, ?, ?, ?, ?, 'in_doubt', ?)"
)


# ---------------------------------------------------------------- the record


class RunRecord:
    """All reads and writes of the run record, on one connection (one thread).

    Writers pass their lease ``holder``: every write transaction first renews
    the lease with ``WHERE lease_holder = holder`` and raises ``LeaseLost``
    (writing nothing) when that matches no row, so a process that lost its
    lease cannot overwrite the new holder's progress.
    """

    def __init__(self, path: str | os.PathLike, clock=time.time, synchronous: str | None = None) -> None:
        self.path = Path(path)
        self.conn = connect(self.path, synchronous)
        self.clock = clock

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> sqlite.write_transaction:
        return sqlite.write_transaction(self.conn)

    def _renew(self, run_id: str, holder: str, lease_seconds: float, now: float, **changes: Any) -> None:
        sets = ", ".join(f"{k} = :{k}" for k in changes)
        sql = (
            "UPDATE runs SET updated_at = :now, lease_expires_at = :exp"
            + (", " + sets if sets else "")
            + " WHERE run_id = :run_id AND lease_holder = :holder"
        )
        cur = self.conn.execute(
            sql, {"now": now, "exp": now + lease_seconds, "run_id": run_id, "holder": holder, **changes}
        )
        if cur.rowcount != 1:
            raise LeaseLost(run_id, holder)

    # ------------------------------------------------------------ reads

    def load(self, run_id: str) -> RunRow:
        row = self.conn.execute(_SQL_RUN, (run_id,)).fetchone()
        if row is None:
            raise RecordRunNotFound(
                f"no run with id {run_id!r} in {self.path}. Start one with: "
                f'python -m durable_agents.runrecord start {run_id} "TASK" --email ADDR (the flow), or '
                f'python -m durable_agents.runrecord loop {run_id} "TASK" --email ADDR (the agent loop)'
            )
        run = _from_row(RunRow, row)
        run.steps = [_from_row(StepRow, step) for step in self.conn.execute(_SQL_STEPS, (run_id,))]
        return run

    def intents(self, run_id: str) -> list[IntentRow]:
        return [_from_row(IntentRow, row) for row in self.conn.execute(_SQL_INTENTS, (run_id,))]

    # ---------------------------------------------------------------- a call that waits for a person

    def open_wait(self, run_id: str, wait: Wait) -> Wait:
        """Record that a call waits (once: a resumed process finds the wait of the process before it, its
        ``since`` and deadline kept); the wait as recorded."""
        with self._write():
            self.conn.execute("INSERT OR IGNORE INTO approvals (run_id, step, wait) VALUES (?, ?, ?)",
                              (run_id, wait.call, _dump(wait.to_json())))
        found, _, _ = self.approval(run_id, wait.call)
        assert found is not None
        return found

    def approval(self, run_id: str, step: str) -> tuple[Wait | None, Decision | None, str | None]:
        """A call's wait, the decision taken for it and its outcome (``approved``, ``denied``, ``expired``; None
        while it waits); (None, None, None) for a call that never waited."""
        row = self.conn.execute("SELECT wait, decision, outcome FROM approvals WHERE run_id = ? AND step = ?",
                                (run_id, step)).fetchone()
        if row is None:
            return None, None, None
        decision = Decision.from_json(json.loads(row["decision"])) if row["decision"] else None
        return Wait.from_json(json.loads(row["wait"])), decision, row["outcome"]

    def approvals(self, run_id: str) -> list[tuple[Wait, Decision | None, str | None]]:
        """Every wait of the run, in the order the calls began waiting."""
        rows = self.conn.execute("SELECT wait, decision, outcome FROM approvals WHERE run_id = ?", (run_id,))
        out = [(Wait.from_json(json.loads(r["wait"])),
                Decision.from_json(json.loads(r["decision"])) if r["decision"] else None, r["outcome"]) for r in rows]
        return sorted(out, key=lambda found: found[0].since)

    def decide(self, run_id: str, decision: Decision) -> tuple[str, str, Decision | None]:
        """Take ``decision`` for its call if ``judge`` says so, in one write transaction: ``(TAKEN | SAME |
        REJECTED, what to tell the sender, the decision that stands)``. No process need be running: the
        running (or next resumed) process reads it from here. ``RecordRunNotFound`` for an unknown run."""
        now = self.clock()
        with self._write():
            run = self.conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if run is None:
                self.load(run_id)  # raises RecordRunNotFound, saying what to do
            wait, decided, outcome = self.approval(run_id, decision.call)
            ran = self.conn.execute("SELECT 1 FROM steps WHERE run_id = ? AND name = ? AND status = 'completed'",
                                    (run_id, decision.call)).fetchone() is not None
            verdict, said = judge(wait, decided, decision, expired=ended_by_deadline(wait, outcome, now), ran=ran)
            if verdict == TAKEN:
                decided = replace(decision, at=now)
                self.conn.execute(
                    "UPDATE approvals SET decision = ?, outcome = ? WHERE run_id = ? AND step = ? AND decision IS NULL",
                    (_dump(decided.to_json()), "approved" if decided.verdict == "approve" else "denied", run_id,
                     decision.call))
        return verdict, said, decided

    def expire(self, run_id: str, step: str) -> Decision | None:
        """End a call's wait at its deadline, unless a decision came first (that decision: a sender and the
        deadline racing, the transaction decides which was first)."""
        with self._write():
            self.conn.execute("UPDATE approvals SET outcome = 'expired' WHERE run_id = ? AND step = ? AND "
                              "decision IS NULL AND outcome IS NULL", (run_id, step))
        return self.approval(run_id, step)[1]

    def list_runs(self) -> list[RunRow]:
        """Every run, oldest first, without its steps (``load`` reads those)."""
        return [_from_row(RunRow, row) for row in self.conn.execute(_SQL_RUNS)]

    def footprint(self, run_id: str) -> dict[str, int]:
        """Rows and bytes the record holds for one run (bytes: sum of the stored values' lengths)."""
        out: dict[str, int] = {}
        for table in ("runs", "steps", "intents"):
            cols = [column["name"] for column in self.conn.execute(f"PRAGMA table_info({table})")]
            size = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in cols)
            held = self.conn.execute(
                f"SELECT count(*) AS n, coalesce(sum({size}), 0) AS bytes FROM {table} WHERE run_id = ?", (run_id,)
            ).fetchone()
            out[f"{table}_rows"] = held["n"]
            out[f"{table}_bytes"] = held["bytes"]
        out["rows"] = sum(v for k, v in out.items() if k.endswith("_rows"))
        out["bytes"] = sum(v for k, v in out.items() if k.endswith("_bytes"))
        return out

    # ------------------------------------------------------------ writes

    def create_run(
        self,
        run_id: str,
        task: str,
        email: str,
        conversation_id: str,
        step_names: list[str],
        holder: str,
        lease_seconds: float,
        first: NextAttempt,
        *,
        start_id: str | None = None,
        retry_rule: Any = None,
        params: Mapping[str, Any] | None = None,
        loop: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the run, holding its lease, with step 0's first attempt started: one commit.

        ``step_names``: the steps known at start (the fixed flow: all of them; a loop run: its first turn).
        ``loop``: a loop run's numbers (``runs.loop``), None for a run of the fixed flow.
        Raises ``RunExists`` if the id is taken, whatever that run's state: a run
        id names one run for ever (the idempotency keys derive from it).
        """
        now = self.clock()
        with self._write() as c:
            existing = c.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if existing is not None:
                raise RunExists(run_id, existing["status"])
            c.execute(
                "INSERT INTO runs (run_id, task, email, conversation_id, status, position, created_at, "
                "updated_at, lease_holder, lease_expires_at, start_id, retry_rule, params, loop) "
                "VALUES (?, ?, ?, ?, 'running', 0, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, task, email, conversation_id, now, now, holder, now + lease_seconds, start_id,
                 None if retry_rule is None else _dump(retry_rule), _dump(dict(params)) if params else None,
                 None if loop is None else _dump(dict(loop))),
            )
            c.executemany(
                "INSERT INTO steps (run_id, position, name, status) VALUES (?, ?, ?, 'pending')",
                [(run_id, i, name) for i, name in enumerate(step_names)],
            )
            self._start_attempt(run_id, step_names[first.position], first, now)

    def _start_attempt(self, run_id: str, name: str, nxt: NextAttempt, now: float) -> None:
        self.conn.execute(_SQL_STEP_START, (nxt.attempt, now, now, nxt.crashes, run_id, nxt.position))
        if nxt.intent is not None:
            self.conn.execute(_SQL_INTENT, (run_id, nxt.position, nxt.attempt, name, nxt.intent.key,
                                            _dump(nxt.intent.request), now))

    def acquire_lease(self, run_id: str, holder: str, lease_seconds: float) -> Verdict | None:
        """Take a running run's lease if it is free, expired, already ours, or held by a dead process.

        Returns the dead holder's ``Verdict`` when its unexpired lease was taken
        over (``durable_agents.runrecord.lease``: a process of this host that is gone), else
        None. Raises ``LeaseHeld`` if another holder may be alive, and
        ``RunEnded`` if the run completed or failed meanwhile (read in the same
        transaction, so no lease is ever left on an ended run).
        """
        now = self.clock()
        with self._write() as c:
            row = c.execute(
                "SELECT status, lease_holder, lease_expires_at FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise RecordRunNotFound(f"no run with id {run_id!r} in {self.path}")
            current, expires = row["lease_holder"], row["lease_expires_at"]
            if row["status"] != "running":
                raise RunEnded(run_id, row["status"])
            taken = None
            if current is not None and current != holder and expires is not None and expires > now:
                verdict = check_holder(current)
                if not verdict.dead:
                    raise LeaseHeld(run_id, current, expires, now, verdict.reason)
                taken = verdict
            c.execute(
                "UPDATE runs SET lease_holder = ?, lease_expires_at = ? WHERE run_id = ?",
                (holder, now + lease_seconds, run_id),
            )
        return taken

    def renew_lease(self, run_id: str, holder: str, lease_seconds: float) -> bool:
        """Extend our lease; False if it is no longer ours. One statement, so no BEGIN needed."""
        now = self.clock()
        cur = self.conn.execute(
            "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_holder = ?",
            (now + lease_seconds, run_id, holder),
        )
        return cur.rowcount == 1

    def release_lease(self, run_id: str, holder: str) -> None:
        self.conn.execute(
            "UPDATE runs SET lease_holder = NULL, lease_expires_at = NULL WHERE run_id = ? AND lease_holder = ?",
            (run_id, holder),
        )

    def begin_attempt(self, run_id: str, name: str, nxt: NextAttempt, holder: str, lease_seconds: float) -> None:
        """Record that attempt ``nxt.attempt`` of a step starts (and its intent): one commit."""
        now = self.clock()
        with self._write():
            self._renew(run_id, holder, lease_seconds, now)
            self._start_attempt(run_id, name, nxt, now)

    def complete_step(
        self,
        run_id: str,
        position: int,
        attempt: int,
        result: Any,
        holder: str,
        lease_seconds: float,
        *,
        effect: bool,
        next_name: str | None = None,
        nxt: NextAttempt | None = None,
        added: Sequence[tuple[int, str]] = (),
        start_next: bool = True,
    ) -> None:
        """The step's result, its intent's outcome, and the advance: ONE transaction.

        The advance also starts the next step's first attempt and records its
        intent, so the happy path costs one commit per step. When the last
        step completes, the run completes and the lease is released in the same
        transaction. ``added``: (position, name) of the steps this result adds
        to the plan (a loop run's turn: its calls and the next turn), inserted
        as pending rows in the same transaction, before the next attempt starts
        (the first of them may be that next step). ``start_next`` False: the run advances to the next step
        without starting its attempt (a call that waits for a person first: its attempt starts once decided).
        """
        now = self.clock()
        payload = _dump(result)
        c = self.conn
        # The hot path: fixed statements and positional parameters (the
        # sqlite3 statement cache then skips re-parsing); see bench/.
        with sqlite.write_transaction(c):
            if nxt is None:  # the run completes, and the lease is handed back
                cur = c.execute(_SQL_ADVANCE_LAST, (position + 1, now, run_id, holder))
            else:
                cur = c.execute(_SQL_ADVANCE, (nxt.position, now, now + lease_seconds, run_id, holder))
            if cur.rowcount != 1:
                raise LeaseLost(run_id, holder)
            c.execute(_SQL_STEP_DONE, (payload, now, attempt, run_id, position))
            if effect:
                c.execute(_SQL_INTENT_ANSWERED, (payload, now, run_id, position, attempt))
                if attempt > 1:
                    # Earlier attempts left in doubt by a crash: this answer, to the same key, settles them.
                    c.execute(
                        "UPDATE intents SET state = 'settled', outcome = ?, settled_at = ? "
                        "WHERE run_id = ? AND position = ? AND attempt < ? AND state = 'in_doubt'",
                        (_dump({"settled_by_attempt": attempt, "result": result}), now, run_id, position, attempt),
                    )
            if added:
                c.executemany(_SQL_STEP_ADD, [(run_id, position, name) for position, name in added])
            if nxt is not None and start_next:
                assert next_name is not None
                self._start_attempt(run_id, next_name, nxt, now)

    def record_attempt_error(
        self, run_id: str, position: int, attempt: int, error: str, holder: str, lease_seconds: float,
        *, error_attempts: int, error_seconds: float, in_doubt: bool, next_try_at: float, doubtful: bool = False,
        same_errors: int = 0, same_error: str | None = None,
    ) -> None:
        """A retryable failure of one attempt: the step stays running, the run goes on.

        The ledger (``durable_agents.steps.retry.StepLedger``) comes with it; ``doubtful``: this
        attempt's outcome is unknown, so its intent stays ``in_doubt``."""
        now = self.clock()
        with self._write() as c:
            self._renew(run_id, holder, lease_seconds, now)
            c.execute(
                "UPDATE steps SET last_error = ?, attempt_open = 0, error_attempts = ?, error_seconds = ?, "
                "in_doubt = ?, next_try_at = ?, same_errors = ?, same_error = ? WHERE run_id = ? AND position = ?",
                (error, error_attempts, error_seconds, int(in_doubt), next_try_at, same_errors, same_error,
                 run_id, position),
            )
            self._intent_error(run_id, position, attempt, error, doubtful, now)

    def _intent_error(self, run_id: str, position: int, attempt: int, error: str, doubtful: bool, now: float) -> None:
        """The error an attempt ended in, on its intent: ``error`` (an answer: nothing was applied), or
        kept ``in_doubt`` with the error recorded when it does not say whether it was applied."""
        self.conn.execute(
            "UPDATE intents SET state = ?, outcome = ?, settled_at = ? "
            "WHERE run_id = ? AND position = ? AND attempt = ? AND state = 'in_doubt'",
            ("in_doubt" if doubtful else "error", _dump({"error": error}), None if doubtful else now,
             run_id, position, attempt),
        )

    def fail_run(
        self, run_id: str, position: int, attempts: int, error: str, reason: str, holder: str, lease_seconds: float,
        *, answered: bool = True, doubtful: bool = False, in_doubt: bool = False, crashes: int | None = None,
    ) -> None:
        """Terminal: the step and the run become failed, naming the step and the reason; lease released.

        ``answered``: the failing attempt got an answer (an error that says
        nothing was applied), so its intent is no longer in doubt. False when
        its outcome is unknown: that intent stays in doubt, visibly, with
        ``reason`` recorded as its outcome when ``doubtful`` (it ended in an
        error that does not say whether it was applied: a 5xx, a timeout), and
        no outcome when its process died. ``in_doubt``: the step as a whole is
        in doubt.
        """
        now = self.clock()
        with self._write() as c:
            self._renew(run_id, holder, lease_seconds, now, status="failed", error=error)
            c.execute(
                "UPDATE runs SET lease_holder = NULL, lease_expires_at = NULL WHERE run_id = ?", (run_id,)
            )
            c.execute(
                "UPDATE steps SET status = 'failed', attempts = ?, last_error = ?, attempt_open = 0, in_doubt = ?, "
                "next_try_at = NULL, crashes = coalesce(?, crashes) WHERE run_id = ? AND position = ?",
                (attempts, reason, int(in_doubt), crashes, run_id, position),
            )
            if answered or doubtful:
                self._intent_error(run_id, position, attempts, reason, not answered, now)

    def settle_intents(self, run_id: str, answers: Mapping[int, tuple[int, Any]]) -> dict[int, list[int]]:
        """``settle``: record the provider's answer on a failed run's intents in doubt, by step.

        ``answers``: position -> (the step's ``attempts`` when the provider was
        asked, its answer under the step's key, ``durable_agents.steps.settle``). Each of the
        step's ``in_doubt`` intents becomes ``settled`` with the answer as its
        outcome (``{"settled_by_provider": answer}``), and the step is no longer
        in doubt. Written only while the run is still failed (no process runs
        it) and the step has had no attempt since the question (a retry in
        between would have intents the answer does not cover). Returns, by
        position, the attempts it settled. One transaction."""
        now = self.clock()
        settled: dict[int, list[int]] = {}
        with self._write() as c:
            row = c.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RecordRunNotFound(f"no run with id {run_id!r} in {self.path}")
            if row["status"] != "failed":
                return settled
            for position, (attempts, answer) in answers.items():
                step = c.execute("SELECT attempts FROM steps WHERE run_id = ? AND position = ?",
                                 (run_id, position)).fetchone()
                if step is None or step["attempts"] != attempts:
                    continue
                doubtful = [i["attempt"] for i in c.execute(
                    "SELECT attempt FROM intents WHERE run_id = ? AND position = ? AND state = 'in_doubt' "
                    "ORDER BY attempt", (run_id, position))]
                if not doubtful:
                    continue
                c.execute(
                    "UPDATE intents SET state = 'settled', outcome = ?, settled_at = ? "
                    "WHERE run_id = ? AND position = ? AND state = 'in_doubt'",
                    (_dump({"settled_by_provider": answer}), now, run_id, position),
                )
                c.execute("UPDATE steps SET in_doubt = 0 WHERE run_id = ? AND position = ?", (run_id, position))
                settled[position] = doubtful
        return settled

    def reopen_failed(self, run_id: str, holder: str, lease_seconds: float) -> int:
        """``retry``: a failed run runs again from its failed step, with a fresh budget.

        The step keeps its attempts (they are history) and its doubt (settled by
        its next attempt); its error budget and crash count start again. The run
        holds our lease. Returns the failed step's position; ``RunNotFailed`` if
        the run is not failed."""
        now = self.clock()
        with self._write() as c:
            row = c.execute("SELECT status, position FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RecordRunNotFound(f"no run with id {run_id!r} in {self.path}")
            if row["status"] != "failed":
                raise RunNotFailed(run_id, row["status"])
            position: int = row["position"]
            c.execute(
                "UPDATE runs SET status = 'running', error = NULL, updated_at = ?, lease_holder = ?, "
                "lease_expires_at = ? WHERE run_id = ?",
                (now, holder, now + lease_seconds, run_id),
            )
            c.execute(
                "UPDATE steps SET status = 'running', attempt_open = 0, error_attempts = 0, error_seconds = 0, "
                "crashes = 0, next_try_at = NULL, same_errors = 0, same_error = NULL "
                "WHERE run_id = ? AND position = ?",
                (run_id, position),
            )
            return position
