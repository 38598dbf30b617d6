"""Check 7, the agent loop made durable (exercise 7), in the lesson's words.

One run of the learner's ``agent_loop.py`` against the grader's model
stand-in (``grader.model``: the lab's scripted model, its call ids hostile)
and the provider, with an order of its own seeded there. The run takes four
turns: a lookup; a refund and its email, two calls in one turn; a ticket; the
final answer. It is started, then killed (SIGKILL, at points the given code
reaches: ``ask_model``, ``use_tool``, ``durable_agents.steps.loop.run_tool``) and resumed,
once per kill point in turn:

1. after turn 2 was received, before the learner's code saw it;
2. right after the provider applied the refund, its result not recorded;
3. between the two calls of turn 2 (the refund's result recorded, the email
   not sent);
4. between turns 2 and 3;

then resumed to the end. After each process it judges, from what it can
count without trusting the program: the record's rows (each turn kept before
any of its calls ran; each result once it returned; no call skipped, that is
left without a result and never sent while the loop went on past it), the
keys (printable, no space, one per call, the same on every attempt), the
provider's requests (no call with a recorded result sent again; each effect
applied once, under the key its call is recorded with), and the stand-in's
count of turns (no turn the record held asked again).

A skip is judged before any key: the turns after it hold other calls than
the script's at their numbers, and their effects would look like a key that
changed. For the same reason a call's effect kind is the one its own recorded
tool name has (``KINDS``), never the script's tool at that turn and place.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from durable_agents.providerclient import seed_orders
from durable_agents.steps.refund_agent import REFUND_TOOLS
from grader.check import Check
from grader.evidence import Effect
from grader.harness import Failed, Harness, Outcome, Run, last_lines
from grader.todos import todo

ORDER_TOTAL = 4200  # cents
TURNS = {1: ("lookup_order",), 2: ("issue_refund", "send_email"), 3: ("create_ticket",), 4: ()}
KINDS = REFUND_TOOLS.effects  # each tool with an effect and its kind, as the lab's agent declares them
MAX_KEY_CHARS = 255  # the provider's key rule (provider/validation.py): printable ASCII, no space

# (crash point, where the run is, the record's turns and call results right after the kill)
KILLS = (
    ("turn-2:after_answer", "after turn 2 was received, before it was recorded", {1}, {(1, 0)}),
    ("tool:issue_refund:after_effect", "right after the provider applied turn 2's refund, before its result "
     "was recorded", {1, 2}, {(1, 0)}),
    ("turn-2/call-1:before", "between the two calls of turn 2 (the refund's result recorded, the email not "
     "sent)", {1, 2}, {(1, 0), (2, 0)}),
    ("turn-3:before", "between turn 2 and turn 3 (every call of turn 2 recorded, turn 3 not asked)", {1, 2},
     {(1, 0), (2, 0), (2, 1)}),
)


@dataclass
class LoopRecord:
    """The learner's record of one run: its status, its turns (number -> answer) and call rows."""

    status: str | None = None
    turns: dict[int, dict] = field(default_factory=dict)
    calls: dict[tuple[int, int], tuple[str, dict]] = field(default_factory=dict)  # -> (key, result)

    def name(self, n: int, i: int) -> str:
        """The tool of turn ``n``'s call ``i`` as the record names it: in the call's row, else in its turn's
        answer; "" where neither does."""
        named = self.calls[(n, i)][1].get("name") if (n, i) in self.calls else None
        if isinstance(named, str) and named:
            return named
        calls = self.turns.get(n, {}).get("calls")
        if isinstance(calls, list) and i < len(calls) and isinstance(calls[i], dict):
            named = calls[i].get("name")
        return named if isinstance(named, str) else ""

    def names(self, n: int) -> list[str] | None:
        """The tools turn ``n`` asks for, in order, as recorded; None where its calls are not a list."""
        calls = self.turns.get(n, {}).get("calls")
        return [self.name(n, i) for i in range(len(calls))] if isinstance(calls, list) else None

    def describe(self) -> str:
        shown = [f"run {self.status or 'not in `runs`'}"]
        for n, answer in sorted(self.turns.items()):
            names = [c.get("name") for c in answer.get("calls") or []]
            done = [i for (t, i) in self.calls if t == n]
            shown.append(f"turn {n} {names or '(final answer)'}, results of calls {sorted(done)}")
        return "; ".join(shown) if self.turns else shown[0] + "; no turn in `turns`"


def read_loop_rows(db: Path, run_id: str) -> LoopRecord:
    """One run of exercise 7's record at ``db``, read-only (``sqlite3.Error`` if its tables are not there)."""
    found = LoopRecord()
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        found.status = row[0] if row else None
        for n, answer in conn.execute("SELECT turn, answer FROM turns WHERE run_id = ?", (run_id,)):
            found.turns[int(n)] = _json(answer)
        for n, i, key, result in conn.execute(
                "SELECT turn, idx, idempotency_key, result FROM calls WHERE run_id = ?", (run_id,)):
            found.calls[(int(n), int(i))] = (str(key), _json(result))
    return found


def read_loop_record(h: Harness, run: Run) -> LoopRecord:
    found = LoopRecord()
    try:
        found = read_loop_rows(h.record_db, run.run_id)
    except sqlite3.Error as err:
        if "no such table" in str(err) and not found.turns:  # nothing written yet: an empty record
            return LoopRecord()
        raise Failed(f"the record at RECORD_DB cannot be read as the exercise's schema: {err}",
                     expected="the tables runs, turns and calls with the columns SCHEMA gives",
                     seen=str(err), look_at="SCHEMA in agent_loop.py: keep its tables and columns") from None
    return found


def _json(text: object) -> dict:
    try:
        value = json.loads(str(text))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def call_name(n: int, i: int, record: LoopRecord | None = None) -> str:
    """Turn ``n``'s call ``i``, named as the record names it (a turn of another number than the script's,
    or skipped calls, put other tools there), else as the script does."""
    script = TURNS.get(n, ())
    named = (record.name(n, i) if record else "") or (script[i] if i < len(script) else "?")
    return f"turn {n}'s call {i} ({named})"


# ---------------------------------------------------------------- what must hold after each process


def expect_keys(run: Run, record: LoopRecord) -> None:
    """Every recorded key is one the provider can take, and no two calls share one."""
    for (n, i), (key, result) in sorted(record.calls.items()):
        if 1 <= len(key) <= MAX_KEY_CHARS and all("\x21" <= ch <= "\x7e" for ch in key):
            continue
        calls = record.turns.get(n, {}).get("calls") or []
        asked = calls[i].get("id") if i < len(calls) and isinstance(calls[i], dict) else "?"
        raise Failed(
            f"the key of {call_name(n, i, record)} in run {run.run_id} is {key!r}: the model's call id went into it "
            "as the model wrote it, and the provider refuses such a key (nothing is applied under it)",
            expected="a key of 1-255 printable ASCII characters without space, from the run, the turn and the "
                     "call's id checked or digested (the id is the model's text: untrusted)",
            seen=f"the model's id {asked!r}; the key {key!r}; the call's recorded result: "
                 f"{str(result.get('content'))[:120]}",
            look_at=todo(17, "the call's id is untrusted: never put it in the key as it came"))
    owners: dict[str, list[tuple[int, int]]] = {}
    for place, (key, _) in record.calls.items():
        owners.setdefault(key, []).append(place)
    shared = {key: places for key, places in owners.items() if len(places) > 1}
    if shared:
        key, places = next(iter(shared.items()))
        raise Failed(f"{' and '.join(call_name(*p, record=record) for p in sorted(places))} of run {run.run_id} "
                     "were sent under one key: the provider applies the second as the first (or refuses it)",
                     expected="a key of its own for every call of every turn", seen=f"{key!r}",
                     look_at=todo(17, "the model reuses ids, across turns and within one: the turn and the call's "
                                      "place belong in the key"))


def expect_record(run: Run, record: LoopRecord, turns: set[int], done: set[tuple[int, int]], where: str,
                  sent: Counter[str], what: str) -> None:
    """Right after a kill ``where``: exactly the ``turns`` and call results ``done`` are recorded. ``sent``:
    the provider's requests per effect kind from the last process, ``what``."""
    missing = sorted(turns - set(record.turns))
    if missing:
        n = missing[0]
        ran = sorted(place for place in done if place[0] == n) or ([(n, 0)] if n == 2 and "refund" in where else [])
        if ran and record.turns:  # it records turns, but this one only after its calls ran
            raise Failed(
                f"a tool call ran before its turn was recorded: run {run.run_id} was killed {where}, and the record "
                f"holds no turn {n}",
                expected=f"turn {n} in `turns`, committed before any of its calls ran: a crash after the refund "
                         "must find the turn that asked for it",
                seen=record.describe(),
                look_at=todo(19, "the turn goes into the record before its first call runs"))
        raise Failed(f"the record of run {run.run_id} holds no turn {n}, although the run was killed {where}",
                     expected=f"turns {sorted(turns)} in `turns`, each as the model answered it (its calls with their "
                              "ids, names and arguments)",
                     seen=record.describe(),
                     look_at=todo(15, "keep the turn, committed, with every call it asks for") + "; and "
                             + todo(19, "each turn goes into the record as soon as the model answered it"))
    for n in sorted(turns):
        calls = record.turns[n].get("calls")
        if not isinstance(calls, list) or [c.get("name") for c in calls if isinstance(c, dict)] != list(TURNS[n]):
            raise Failed(f"turn {n} of run {run.run_id} is not recorded as the model decided it",
                         expected=f"its calls, in order: {list(TURNS[n])}, each with its id, name and arguments",
                         seen=f"{json.dumps(record.turns[n])[:200]}",
                         look_at=todo(15, "the whole answer: a resume has nothing else to rebuild it from"))
    extra = sorted(set(record.turns) - turns)
    if extra:
        raise Failed(f"the record of run {run.run_id} holds turn {extra[0]}, which was never asked for before the "
                     f"kill {where}", expected=f"turns {sorted(turns)}", seen=record.describe(),
                     look_at=todo(19, "a turn is recorded when the model has answered it"))
    lacking = sorted(done - set(record.calls))
    kind = KINDS.get(record.name(*lacking[0])) if lacking else None
    if kind is not None and not sent[kind]:  # never sent: the loop went past it, its result was not lost
        raise Failed(f"{call_name(*lacking[0], record=record)} of run {run.run_id} was skipped: it has no recorded "
                     f"result, and {what} reached its kill point without sending it (the provider got no {kind} "
                     "request from it)",
                     expected=f"a row in `calls` for each of {sorted(done)}: resume runs a call without a result "
                              "before anything after it",
                     seen=record.describe(),
                     look_at=todo(19, "go on at the first call with no result; the next turn is asked only once "
                                      "every call of the last one has its result"))
    if lacking:
        raise Failed(f"the record of run {run.run_id} holds no result for {call_name(*lacking[0], record=record)}, "
                     f"although it returned before the kill {where}",
                     expected=f"a row in `calls` for each of {sorted(done)}, committed once the call returned",
                     seen=record.describe(),
                     look_at=todo(16, "keep the call's result, committed, with its key") + "; and "
                             + todo(19, "record each result once it returned"))
    ahead = sorted(set(record.calls) - done)
    if ahead:
        raise Failed(f"the record of run {run.run_id} holds a result for {call_name(*ahead[0], record=record)}, "
                     f"which had not returned when it was killed {where}", expected=f"results of {sorted(done)} only",
                     seen=record.describe(), look_at=todo(19, "record a call's result only after it returned"))


def expect_no_skip(run: Run, record: LoopRecord, sent: Counter[str], what: str) -> None:
    """The record holds what a loop going on at the first call without a result records: no turn after one
    with a call left without its result, and each turn the script's at its number. Said before any key is
    judged: the turns after a skip hold other calls than the script's at their numbers, and their effects
    look like a key that changed. ``sent``: the provider's requests per effect kind in the last process."""
    for n in sorted(record.turns):
        later = min((t for t in record.turns if t > n), default=None)
        names = record.names(n)
        if later is None or names is None:
            continue
        for i in (i for i in range(len(names)) if (n, i) not in record.calls):
            kind = KINDS.get(names[i])
            if kind is not None and sent[kind]:  # it went out: its result was lost, not the call skipped
                continue
            went = f"and the provider got no {kind} request from {what}" if kind else "(not run, or not recorded)"
            raise Failed(
                f"{call_name(n, i, record)} of run {run.run_id} was skipped: it has no recorded result {went}, yet "
                f"the record holds turn {later}, asked after it",
                expected=f"turn {n}'s calls without a result run, under their keys, before turn {n + 1} is asked: "
                         "resume goes on at the first call with no result",
                seen=record.describe(),
                look_at=todo(19, "go on at the first call with no result; the next turn is asked only once every "
                                 "call of the last one has its result")
                        + ("" if kind else "; and " + todo(16, "keep the call's result, committed, with its key")))
    scripted = {tuple(names): m for m, names in TURNS.items() if names}
    for n in sorted(record.turns):
        names = record.names(n)
        m = scripted.get(tuple(names or ()))
        if m is not None and m != n:
            raise Failed(f"turn {n} of run {run.run_id} is recorded as {names}, the script's turn {m}: {what} asked "
                         f"turn {n} on a prompt that does not hold what turns 1-{n - 1} did",
                         expected=f"turn {n} as the script answers it after every earlier call's result: "
                                  f"{list(TURNS.get(n, ()))}",
                         seen=record.describe(),
                         look_at=todo(19, "go on at the first call with no result; the next turn is asked only once "
                                          "every call of the last one has its result"))


def expect_no_conflict(run: Run, outcome: Outcome, what: str) -> None:
    """The provider refused a request as another's under the same key (409 ``idempotency_conflict``): two
    calls were given one key. Said before anything else, since the refused call looks like a repeat."""
    lines = [line for line in outcome.output.splitlines()
             if any(mark in line for mark in ("idempotency_conflict", "idempotency conflict", "IdempotencyConflict"))]
    if not lines:
        return
    raise Failed(f"{what} sent two calls of run {run.run_id} under one key: the provider refused the second "
                 "(409 idempotency_conflict: that key was used for another request)",
                 expected="a key of its own for every call of every turn, even when the model gives every call "
                          "the same id (this model does: the refund and its email share theirs)",
                 seen=last_lines(lines[-1], 1),
                 look_at=todo(17, "the model's id is not unique, within a turn or across turns: the turn and the "
                                  "call's place belong in the key"))


def expect_effects(h: Harness, run: Run, record: LoopRecord, before: dict[str, int], held: set[tuple[int, int]],
                   asked_before: Counter[int], turns_held: set[int], what: str) -> None:
    """Across the last process: no call whose result was recorded before it was sent again, each effect under
    the key the record gives its call, and no turn the record held asked for again."""
    effects = h.effects(run)
    requests = {e.key: e.requests for e in effects}
    for place in sorted(held):
        key = record.calls[place][0] if place in record.calls else ""
        if key in before and requests.get(key, 0) > before[key]:
            raise Failed(
                f"{what} ran {call_name(*place, record=record)} again, although the record held its result",
                expected="a call with a recorded result is done: resume goes on at the first call without one",
                seen=f"the provider got {requests[key] - before[key]} more request(s) under {key}",
                look_at=todo(19, "a call whose result is recorded never runs again"))
    asked = h.model.turns(run.task)
    again = sorted(n for n in turns_held if asked[n] > asked_before[n])
    if again:
        n = again[0]
        raise Failed(f"{what} asked the model for turn {n} again, although the record held it",
                     expected=f"turn {n} read from the record: a turn asked again is another answer (other calls, "
                              "other ids)",
                     seen=f"the model stand-in was asked for turn {n} {asked[n]} times in all",
                     look_at=todo(19, "a recorded turn is never asked for again") + "; and "
                             + todo(18, "every recorded turn comes back from the record"))
    for place, (key, _) in sorted(record.calls.items()):
        kind = KINDS.get(record.name(*place))  # by the call's own name: a skip moves calls to other turns
        if kind is None:
            continue
        mine = [e for e in effects if e.kind == kind]
        if len(mine) > 1 or (mine and mine[0].key != key):
            raise Failed(f"{call_name(*place, record=record)} of run {run.run_id} reached the provider under another "
                         "key than the one its result is recorded with: the key changed between attempts",
                         expected=f"every attempt under one key, the recorded {key!r}",
                         seen=f"keys of its {kind}s at the provider: {[(e.key, e.requests) for e in mine]}",
                         look_at=todo(17, "the same key on every attempt: from the run, the turn and the call, "
                                          "never from the attempt"))


def expect_done(h: Harness, run: Run, record: LoopRecord, outcome: Outcome) -> list[Effect]:
    if record.status != "completed" or set(record.turns) != set(TURNS):
        raise Failed(f"run {run.run_id} did not complete after its last resume",
                     expected=f"status 'completed', turns {sorted(TURNS)}, every call's result recorded",
                     seen=f"{record.describe()}; exit {outcome.code}; {outcome.last_lines()}",
                     look_at=todo(19, "go on at the first call with no result until a turn asks for no tool"))
    applied = [e for e in h.effects(run) if e.applied]
    kinds = Counter(e.kind for e in applied)
    if kinds != Counter({"refund": 1, "email": 1, "ticket": 1}):
        raise Failed(f"run {run.run_id} completed, but the provider applied {dict(kinds)}",
                     expected="one refund, one email, one ticket", seen=str([(e.kind, e.key) for e in applied]),
                     look_at=todo(17, "one key per call, the same on every attempt"))
    return applied


# ---------------------------------------------------------------- the check


def sent_since(h: Harness, run: Run, before: dict[str, int]) -> Counter[str]:
    """The provider's requests per effect kind for ``run`` since it held ``before`` (requests per key)."""
    sent: Counter[str] = Counter()
    for e in h.effects(run):
        sent[e.kind] += e.requests - before.get(e.key, 0)
    return sent


def check_loop(h: Harness) -> list[str]:
    run = h.new_run("g7")
    order = f"A-{secrets.randbelow(10**6):06d}"
    run.task = f"Refund order {order} in full and tell the customer (run {run.run_id})"
    seed_orders(h.provider_url, {order: ORDER_TOTAL})
    shown = []
    for k, (point, where, turns, done) in enumerate(KILLS):
        record = read_loop_record(h, run)
        held, turns_held = set(record.calls), set(record.turns)
        before = {key: n for key, n in ((e.key, e.requests) for e in h.effects(run))}
        asked_before = h.model.turns(run.task)
        what = "`python agent_loop.py start`" if k == 0 else f"the resume after the kill {KILLS[k - 1][1]}"
        outcome = (h.start if k == 0 else h.resume)(run, crash_at=point)
        record = read_loop_record(h, run)
        sent = sent_since(h, run, before)
        expect_no_skip(run, record, sent, what)
        expect_no_conflict(run, outcome, what)
        expect_keys(run, record)
        expect_effects(h, run, record, before, held, asked_before, turns_held, what)
        if not outcome.killed:
            h.raise_could_not_run(outcome)
            expect_record(run, record, turns, done, where, sent, what)  # a run that went past the point
            raise Failed(f"{what} ended (exit {outcome.code}) before it was killed {where}",
                         expected=f"the process killed {where}", seen=f"{record.describe()}; {outcome.last_lines()}",
                         look_at=todo(19, "the loop goes on at the first call with no recorded result"))
        expect_record(run, record, turns, done, where, sent, what)
        shown.append(f"killed {where}: the record held turns {sorted(turns)} and the results of "
                     f"{len(done)} call(s); resumed")
    record = read_loop_record(h, run)
    held, turns_held = set(record.calls), set(record.turns)
    before = {e.key: e.requests for e in h.effects(run)}
    asked_before = h.model.turns(run.task)
    outcome = h.resume(run)
    record = read_loop_record(h, run)
    expect_no_skip(run, record, sent_since(h, run, before), f"the resume after the kill {KILLS[-1][1]}")
    expect_no_conflict(run, outcome, f"the resume after the kill {KILLS[-1][1]}")
    expect_keys(run, record)
    expect_effects(h, run, record, before, held, asked_before, turns_held, f"the resume after the kill {KILLS[-1][1]}")
    if outcome.code != 0:
        h.raise_could_not_run(outcome)
    applied = expect_done(h, run, record, outcome)
    asked = h.model.turns(run.task)
    shown.append(f"resumed to the end: turns asked {dict(sorted(asked.items()))} (turn 2 twice: killed before it "
                 f"was recorded, so asked again; no recorded turn asked again); {len(applied)} effects applied, "
                 "one refund, one email, one ticket, each under one key that no model id entered raw")
    return shown


CHECK = Check(7, "the agent loop: each turn recorded before its calls, each call keyed and run once, resume at "
                 "the first call without a result", check_loop, seconds=90.0, main_file="agent_loop.py",
              stands_alone="exercise 7 builds the agent loop from its own skeleton: its check stands alone")
