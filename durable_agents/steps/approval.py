"""A call that waits for a person: what every engine records of the wait and of the decision, and the one rule
that takes or rejects a decision (``judge``), so the run record, DBOS and Temporal decide alike.

A call whose recorded turn marks it ``approval`` (``durable_agents.steps.loop.AskedCall``) waits before it
runs. Its wait (``Wait``) names what is to be approved: the call (``turn-N/call-I``), its tool, its arguments
as checked, the key it will carry, and ``digest``, a SHA-256 over those with the run id: a decision carries
the digest it was shown, so it cannot approve another call, nor the call a reset asked again (another call id
in the turn: another key, another digest). ``since``/``until``: when it began waiting and its deadline
(seconds since the epoch, the engine's clock).

A decision (``Decision``) comes from outside: approve or deny, ``by`` (what the sender says: not an identity
checked), a reason, and an id of the sender's (a uuid4: the same decision sent twice is taken once). Pure: no
clock, no I/O (Temporal's workflow runs ``judge`` in workflow code).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from durable_agents.steps.limits import InputError
from durable_agents.steps.runstate import iso

VERDICTS = ("approve", "deny")
MAX_BY_CHARS = 64
MAX_REASON_CHARS = 500
TAKEN, SAME, REJECTED = "taken", "same", "rejected"


@dataclass(frozen=True)
class Wait:
    """A call waiting for a decision (see the module docstring)."""

    call: str
    tool: str
    arguments: Mapping[str, Any]
    key: str
    digest: str
    since: float
    until: float
    on_expiry: Literal["refuse", "fail"] = "refuse"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "arguments": dict(self.arguments)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Wait:
        return cls(str(data["call"]), str(data["tool"]), dict(data["arguments"]), str(data["key"]),
                   str(data["digest"]), float(data["since"]), float(data["until"]),
                   data.get("on_expiry", "refuse"))


@dataclass(frozen=True)
class Decision:
    """A person's decision on one waiting call; ``at``: when the engine took it (0 until then)."""

    id: str
    call: str
    digest: str
    verdict: Literal["approve", "deny"]
    by: str = ""
    reason: str = ""
    at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        return cls(str(data["id"]), str(data["call"]), str(data["digest"]), data["verdict"], str(data.get("by") or ""),
                   str(data.get("reason") or ""), float(data.get("at") or 0.0))

    def said(self) -> str:
        who = f" by {self.by}" if self.by else ""
        return f"{'approved' if self.verdict == 'approve' else 'denied'}{who}" + (
            f" ({self.reason})" if self.reason else "")

    def same_as(self, other: Decision) -> bool:
        """The same decision sent again: its id, or the same verdict, sender and reason."""
        return self.id == other.id or (self.verdict, self.by, self.reason) == (other.verdict, other.by, other.reason)


def digest(run_id: str, call: str, tool: str, arguments: Mapping[str, Any], key: str) -> str:
    """What binds a decision to one call: the run, the call, its tool, its checked arguments and its key."""
    text = json.dumps({"run": run_id, "call": call, "tool": tool, "arguments": arguments, "key": key},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def new_wait(run_id: str, call: str, tool: str, arguments: Mapping[str, Any], key: str, approval: Mapping[str, Any],
             now: float) -> Wait:
    """The wait of a call whose turn recorded ``approval`` (``Approval.recorded``), beginning ``now``."""
    return Wait(call, tool, dict(arguments), key, digest(run_id, call, tool, arguments, key), now,
                now + float(approval["within"]), approval.get("on_expiry", "refuse"))


def checked_text(value: Any, what: str, limit: int) -> str:
    """``value`` as text a decision may carry: at most ``limit`` characters, printable (no control
    character: a reason is printed by ``status`` and shown in the UI); ``InputError`` saying what to give."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{what} must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise InputError(f"{what} is {len(value)} characters; at most {limit}: say it shorter")
    if any(not c.isprintable() for c in value):
        raise InputError(f"{what} holds a control character (a line break, a tab, an escape): give one line "
                         "of printable text")
    return value


def check_call(value: str) -> str:
    """A call's name as the commands take it (``turn-N/call-I``); ``InputError`` saying what to give."""
    head, _, tail = str(value).partition("/")
    if not (head.startswith("turn-") and head[5:].isdigit() and tail.startswith("call-") and tail[5:].isdigit()
            and len(value) <= 40):
        raise InputError(f"CALL is a call of the run as status names it, turn-N/call-I (e.g. turn-2/call-0); got "
                         f"{value[:40]!r}")
    return value


def check_digest(value: str | None) -> str | None:
    """``--digest``: 12 to 64 lowercase hex characters (a prefix of the waiting call's digest), or None."""
    if value is None:
        return None
    if not (12 <= len(value) <= 64 and all(c in "0123456789abcdef" for c in value)):
        raise InputError(f"--digest is 12 to 64 lowercase hex characters, as status shows it; got {value[:64]!r}")
    return value


@dataclass(frozen=True)
class Asked:
    """A decision as a command was given it (``approve``/``deny RUN_ID CALL [--by] [--reason] [--digest]``), its
    input checked before anything is read (``Asked.checked``: ``InputError`` saying what to give); ``decision``
    binds it to the call's wait."""

    call: str
    verdict: str
    by: str
    reason: str
    digest: str | None  # what the person was shown (a prefix is enough), or None: the waiting call's own

    @classmethod
    def checked(cls, call: str, verdict: str, by: Any = "", reason: Any = "", digest: str | None = None) -> Asked:
        if verdict not in VERDICTS:
            raise InputError(f"a decision is 'approve' or 'deny', got {verdict!r}")
        return cls(check_call(call), verdict, checked_text(by, "--by", MAX_BY_CHARS),
                   checked_text(reason, "--reason", MAX_REASON_CHARS), check_digest(digest))

    def decision(self, wait: Wait | None) -> Decision:
        """The decision, bound to ``wait``'s digest when it is the one the person was shown; else to the digest
        given (which ``judge`` then refuses as another call's)."""
        shown = self.digest
        bound = wait.digest if wait is not None and (shown is None or wait.digest.startswith(shown)) else (shown or "")
        return new_decision(self.call, bound, self.verdict, self.by, self.reason)


def ended_by_deadline(wait: Wait | None, outcome: str | None, now: float) -> bool:
    """Whether a call's wait is over with no decision: recorded expired, or waiting past its deadline (no process
    has recorded the expiry yet; a decision is too late either way)."""
    return outcome == "expired" or (wait is not None and outcome is None and now > wait.until)


EXPIRY_FAILS = "the tool's approval says a call with no decision by its deadline fails the run"


def new_decision(call: str, digest_: str, verdict: str, by: Any = "", reason: Any = "",
                 decision_id: str | None = None) -> Decision:
    """A decision from the command line (or a caller's code), its input checked: ``InputError`` saying what
    to give for a bad verdict, sender or reason."""
    if verdict not in VERDICTS:
        raise InputError(f"a decision is 'approve' or 'deny', got {verdict!r}")
    return Decision(decision_id or uuid.uuid4().hex, call, digest_, verdict,  # type: ignore[arg-type]
                    checked_text(by, "--by", MAX_BY_CHARS), checked_text(reason, "--reason", MAX_REASON_CHARS))


def judge(wait: Wait | None, decided: Decision | None, decision: Decision, *, expired: bool = False,
          ran: bool = False) -> tuple[str, str]:
    """Whether ``decision`` is taken: ``(TAKEN | SAME | REJECTED, what to tell the sender)``.

    ``wait``: the call's wait as recorded, or None (the call is not waiting: not reached, or not one that
    waits); ``decided``: the decision already taken for it, or None; ``expired``: its deadline passed with no
    decision; ``ran``: the call has a recorded result (it ran, or was refused)."""
    if decided is not None:
        if decision.same_as(decided):
            return SAME, f"{decision.call}: already {decided.said()}; the same decision again, taken once"
        return REJECTED, (f"{decision.call}: already {decided.said()}: a decision, once taken, stands; a "
                          "different one is refused")
    if wait is None:
        what = "has run" if ran else "is not waiting for a decision (not reached yet, or it needs none)"
        return REJECTED, f"{decision.call} {what}: nothing to decide"
    if expired:
        return REJECTED, f"{decision.call}: its wait ended with no decision (the deadline passed): too late"
    if decision.digest != wait.digest:
        return REJECTED, (f"{decision.call}: this decision was made for other arguments or another call (its "
                          "digest is not the waiting call's: a reset may have asked the call again): read "
                          "`status` and decide again")
    return TAKEN, f"{decision.call}: {decision.said()}"


def status_entries(found: Sequence[tuple[Wait, Decision | None, str | None]], now: float | None = None,
                   ) -> list[dict[str, Any]]:
    """``status --json``'s ``approvals`` (the same shape on every engine, present when the run has any): each
    call that waited, what is to be approved, since and until when (ISO), and its state (``waiting``,
    ``approved``, ``denied``, ``expired``) with the decision taken. A wait past its deadline with no decision
    reads ``expired`` (a decision is refused as too late), with a ``note`` while no process has recorded it."""
    now = time.time() if now is None else now
    out = []
    for w, d, outcome in found:
        entry = {"call": w.call, "tool": w.tool, "arguments": dict(w.arguments), "key": w.key, "digest": w.digest,
                 "since": iso(w.since), "until": iso(w.until), "on_expiry": w.on_expiry, "state": outcome or "waiting",
                 "decision": None if d is None else {**d.to_json(), "at": iso(d.at)}}
        overdue(entry, w.until, now)
        out.append(entry)
    return out


def mark_waiting_steps(steps: Sequence[dict[str, Any]], waits: Sequence[Mapping[str, Any]]) -> None:
    """A call that waits for a person shows so in a status table: ``waiting``, its note saying until when."""
    for w in waits:
        if w.get("state") == "waiting":
            for step in steps:
                if step["name"] == w.get("call") and step["status"] in ("pending", "running"):
                    step["status"] = "waiting"
                    step["note"] = f"waits for a person's decision until {w.get('until')}"


def overdue(entry: dict[str, Any], until: float, now: float) -> None:
    """A ``waiting`` entry past its deadline: ``expired``, noted as not yet recorded (the run's next process, or
    Temporal's next worker, ends the wait)."""
    if entry.get("state") == "waiting" and now > until:
        entry["state"] = "expired"
        entry["note"] = "its deadline passed with no decision; the run's next process records the wait as ended"


def status_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """``status``'s lines for the ``approvals`` entries (``status_entries``, or Temporal's from the memo): each
    call, what is to be approved, its key and digest, and where it stands."""
    lines = []
    for w in entries:
        decision = w.get("decision") if isinstance(w.get("decision"), Mapping) else None
        state = str(w.get("state"))
        said = {"waiting": f"WAITING for a decision until {w.get('until')}",
                "expired": f"no decision by {w.get('until')}: expired ({w.get('on_expiry')})",
                "kept": "a decision kept in history, not yet taken (no worker has run since it was sent)",
                "refused": f"a decision refused: {w.get('reason')}"}.get(state, state)
        if decision and state in ("approved", "denied"):
            said += (f" by {decision.get('by') or '(no name given)'} at {decision.get('at')}"
                     + (f": {decision['reason']}" if decision.get("reason") else ""))
        arguments = json.dumps(w.get("arguments"), ensure_ascii=False, sort_keys=True)
        if len(arguments) > 120:
            arguments = arguments[:117] + "..."
        what = (f"{w.get('tool')} {arguments} (key {w.get('key')}, digest {str(w.get('digest'))[:12]}): "
                if w.get("tool") else "")
        if w.get("note"):
            said += f" ({w['note']})"
        lines.append(f"  approval {w.get('call')}: {what}{said}")
    return lines


def denied_result(decision: Decision) -> str:
    """The reason a denied call goes back to the model with (nothing applied)."""
    return f"a person denied this call: {decision.said()}; nothing was applied"


def not_run_after(call: str) -> str:
    """The refusal of a call after one a person did not approve in the same turn: the model asked for the turn's
    calls together (an email saying the refund was made, say), so none after it runs; the model decides again
    knowing why."""
    return (f"not run: {call} of this turn was not approved (denied, or no decision by its deadline), so the calls "
            "after it in the turn did not run either; nothing was applied; ask again for what is still wanted")


def expired_result(wait: Wait) -> str:
    return (f"this call waited for a person's approval until its deadline and none came; nothing was applied "
            f"({wait.until - wait.since:g} s)")
