"""What one lane of the picture holds. Times are seconds since the epoch (the
records' and the observers' clocks are the same machine's wall clock); each
lane is drawn on its own axis from its ``start``.

Every time says where it came from, because the lesson turns on the
difference: ``RECORD`` is what an engine wrote down (a step row, an intent,
a history event, a DBOS step row) or what the provider stored (an effect's
first and last request); ``OBSERVED`` is what the process that drew the page
saw happen (a line a process printed, the moment a SIGKILLed process was
reaped, the moment a new process was started). A process that keeps no
record, like the in-memory "before", can only be drawn from observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

Source = Literal["record", "observed"]
RECORD: Final = "record"
OBSERVED: Final = "observed"

# What a span shows. EXECUTED: the step ran. AGAIN: it ran, although it had
# completed before the restart. REPLAYED / READ: the restarted process took its
# recorded result and did not run it. WAITING: nothing ran; the engine waited
# (for a dead worker's heartbeat to time out, say). UNRECORDED: attempts that ran
# somewhere in this stretch, which the record counts but does not time. RERUN: a step
# whose attempt died before its result was recorded, run again after the restart under
# the same idempotency key, which the receiver answered from its store: executed again,
# applied once (the agent loop's interrupted tool call).
SpanKind = Literal["executed", "again", "replayed", "read", "waiting", "unrecorded", "rerun"]
EXECUTED: Final = "executed"
AGAIN: Final = "again"
REPLAYED: Final = "replayed"
READ: Final = "read"
WAITING: Final = "waiting"
UNRECORDED: Final = "unrecorded"
RERUN: Final = "rerun"
KINDS: tuple[SpanKind, ...] = get_args(SpanKind)
# Marks: a process SIGKILLed, a process (re)started, the moment a restarted process replayed a history.
MarkKind = Literal["kill", "restart", "replay"]
KILL: Final = "kill"
RESTART: Final = "restart"
REPLAY: Final = "replay"


@dataclass(frozen=True)
class Span:
    """One attempt of a step (or one process's life, in the lane's process row)."""

    row: str  # the step's name, or "process"
    start: float
    end: float
    kind: SpanKind = EXECUTED
    start_from: Source = RECORD
    end_from: Source = RECORD
    label: str = ""  # drawn beside the bar: "attempt 1", "process 2"
    note: str = ""  # the tooltip: what the bar is and where its two ends come from
    short_label: str = ""  # drawn instead of the label where the label has no room ("" : nothing then)
    # More ``data-<name>="<value>"`` attributes for the bar's element, for whoever reads the page (a test):
    # ``(("asked", "1"),)``; names of lower-case letters and hyphens
    data: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS or {self.start_from, self.end_from} - {RECORD, OBSERVED}:
            raise ValueError(f"span {self.label or self.row!r}: kind {self.kind!r}, sources "
                             f"{self.start_from!r}/{self.end_from!r}; see timeline.model")
        for name, _ in self.data:
            if not name or name.strip("abcdefghijklmnopqrstuvwxyz-") or name[0] == "-":
                raise ValueError(f"span {self.label or self.row!r}: data attribute name {name!r}; give lower-case "
                                 "letters and hyphens")


@dataclass(frozen=True)
class Mark:
    at: float
    kind: MarkKind
    source: Source
    label: str
    note: str = ""


@dataclass(frozen=True)
class Effect:
    """One idempotency key as the provider counted it (its record, never an engine's)."""

    key: str
    kind: str  # the provider's kind of effect: "email", "ticket", "refund", ...
    requests: int
    applied: int  # 0 or 1
    first_seen: float | None
    last_seen: float | None
    # What the effect is one of: a second one applied in the same group is a duplicate (drawn "again!"). Empty:
    # its kind (the lab's flow sends one email a run). The agent loop's refunds are one per tool call, the group
    # the call's step, so two orders' refunds are two effects, not a duplicate.
    group: str = ""


@dataclass(frozen=True)
class Verdict:
    """A lane's one line, kept in its parts: where the run stands (its status) or where it resumed, and how
    many effects of each kind the provider applied. Whoever knows more replaces a part (the scenario knows
    where the restarted process resumed: ``dataclasses.replace(verdict, where=...)``) instead of taking the
    line apart again; ``str()`` renders it, the same wherever it is shown."""

    where: str = ""  # "completed", "resumed at step 3 record_outcome"
    applied: tuple[tuple[str, int], ...] = ()  # (kind of effect, how many applied), in the order first applied

    @classmethod
    def of(cls, where: str, effects: Sequence[Effect]) -> Verdict:
        """``where``, and the provider's count of ``effects`` applied per kind."""
        applied: dict[str, int] = {}
        for effect in sorted(effects, key=lambda e: e.first_seen or 0.0):
            applied[effect.kind] = applied.get(effect.kind, 0) + effect.applied
        return cls(where, tuple(applied.items()))

    def __str__(self) -> str:
        got = ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in self.applied)
        return "; ".join(part for part in (self.where, got and f"the provider applied {got}") if part)


@dataclass
class Lane:
    """One engine's run: its processes, a row per step, a row per kind of effect (``effect_kinds``: the
    ``effect_rows`` its builder gave, then any other kind among its ``effects``), an axis of its own."""

    engine: str  # a stable id for the page (data-engine), e.g. "runrecord"
    title: str
    start: float  # t = 0 of this lane's axis
    rows: list[str]  # the steps, in order
    run_id: str = ""  # the run drawn (data-run-id)
    # A row's label instead of "<n> <step>" (the agent loop's "turn 2", "call 0: issue_refund"); rows not named keep it
    row_labels: dict[str, str] = field(default_factory=dict)
    effect_rows: list[str] = field(default_factory=list)  # kinds of effect drawn, a row each (``effect_kinds``)
    spans: list[Span] = field(default_factory=list)
    processes: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    caption: str = ""  # how the restarted process knew what was done
    verdict: Verdict = Verdict()  # one line: where it resumed, what the customer got
    bad: bool = False  # the verdict is the failure the lesson shows (the "before")

    def effect_kinds(self) -> list[str]:
        """The kinds of effect the lane draws, a row each: its ``effect_rows``, then, in the order the
        provider first saw them, the kinds of its effects that those do not name."""
        seen = [e.kind for e in sorted(self.effects, key=lambda e: e.first_seen or 0.0)]
        return list(dict.fromkeys([*self.effect_rows, *seen]))
