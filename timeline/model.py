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

from dataclasses import dataclass, field

RECORD = "record"
OBSERVED = "observed"

# What a span shows. EXECUTED: the step ran. AGAIN: it ran, although it had
# completed before the restart. REPLAYED / READ: the restarted process took its
# recorded result and did not run it. WAITING: nothing ran; the engine waited
# (for a dead worker's heartbeat to time out, say). UNRECORDED: attempts that ran
# somewhere in this stretch, which the record counts but does not time.
EXECUTED, AGAIN, REPLAYED, READ, WAITING, UNRECORDED = "executed", "again", "replayed", "read", "waiting", "unrecorded"
KINDS = (EXECUTED, AGAIN, REPLAYED, READ, WAITING, UNRECORDED)
# Marks: a process SIGKILLed, a process (re)started, the moment a restarted process replayed a history.
KILL, RESTART, REPLAY = "kill", "restart", "replay"


@dataclass(frozen=True)
class Span:
    """One attempt of a step (or one process's life, in the lane's process row)."""

    row: str  # the step's name, or "process"
    start: float
    end: float
    kind: str = EXECUTED
    start_from: str = RECORD
    end_from: str = RECORD
    label: str = ""  # drawn beside the bar: "attempt 1", "process 2"
    note: str = ""  # the tooltip: what the bar is and where its two ends come from

    def __post_init__(self) -> None:
        if self.kind not in KINDS or {self.start_from, self.end_from} - {RECORD, OBSERVED}:
            raise ValueError(f"span {self.label or self.row!r}: kind {self.kind!r}, sources "
                             f"{self.start_from!r}/{self.end_from!r}; see timeline.model")


@dataclass(frozen=True)
class Mark:
    at: float
    kind: str  # KILL, RESTART or REPLAY
    source: str
    label: str
    note: str = ""


@dataclass(frozen=True)
class Effect:
    """One idempotency key as the provider counted it (its record, never an engine's)."""

    key: str
    kind: str  # "email" or "ticket"
    requests: int
    applied: int  # 0 or 1
    first_seen: float | None
    last_seen: float | None


@dataclass
class Lane:
    engine: str  # a stable id for the page (data-engine), e.g. "runrecord"
    title: str
    start: float  # t = 0 of this lane's axis
    rows: list[str]  # the steps, in order
    run_id: str = ""  # the run drawn (data-run-id)
    spans: list[Span] = field(default_factory=list)
    processes: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    caption: str = ""  # how the restarted process knew what was done
    verdict: str = ""  # one line: where it resumed, what the customer got
    bad: bool = False  # the verdict is the failure the lesson shows (the "before")
