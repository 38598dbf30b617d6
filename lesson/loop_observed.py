"""What the loop scenario (``lesson.loop_scenario``) observed of each engine's run, and its summary table: the
data the scenario collects and the page (``lesson.loop_page``) draws, in a module of its own so that both
import it and neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from durable_agents.steps.controls import printable
from durable_agents.steps.loop import call_step, parse_step, turn_step
from durable_agents.steps.sides import EffectEntry
from lab import registry
from lab.engines import LoopStatus
from lesson.lanes import Watched
from lesson.scenario import HAVE_DBOS
from timeline.model import Source

POINT = "tool:issue_refund:after_effect"
EMAIL = "ada@example.com"
TURNS = 6  # two orders with something left to refund: lookup, refund+email, lookup, refund+email, ticket, answer
CALLS = 7
RECORDED_AT_KILL = ["turn-1", "turn-1/call-0", "turn-2"]  # what the record holds when the refund's process dies
KILLED_IN = "turn-2/call-0"
APPLIED = {"refund": 2, "email": 2, "ticket": 1}
MAX_TURNS = 10
MODEL_DELAY = 0.1
"""Seconds the stand-in takes to answer a turn: a model is slow, and the turns show as bars on the page."""
PROCESS_TIMEOUT = 120.0  # generous: a busy 2-core machine; a healthy run takes seconds
LABELS = {e.name: e.label for e in registry.engines()}
NAMES = {e.name: (f"{e.runner} 1", f"{e.runner} 2") for e in registry.engines()}
"""What runs each engine's run before the kill and after it: a worker, or a process."""
SUMMARY_HEADER = ("engine", "turns", "tool calls", "model asked (stand-in)", "effects applied (provider)",
                  "kill to completed", "check")


@dataclass(frozen=True)
class Attempt:
    """One execution of a loop step, as a bar: its two ends and where each came from (``timeline.model``)."""

    step: str
    start: float
    end: float
    start_from: Source
    end_from: Source
    process: int  # 1: the process that was killed; 2: the one that resumed the run
    killed: bool = False  # its process died in it: its result was never recorded
    waited_until: float | None = None  # Temporal: the server closed the dead attempt at its heartbeat timeout


@dataclass
class LoopObserved:
    """What the scenario saw of one engine's run, and what the records, the stand-in and the provider say."""

    engine: str
    run_id: str
    task: str
    orders: dict[str, int]
    watched: Watched = field(default_factory=Watched)
    at_kill: LoopStatus | None = None  # the engine's loop status with nothing running, right after the kill
    applied_at_kill: dict[str, int] = field(default_factory=dict)  # the provider's effects then, by kind
    final: LoopStatus | None = None
    first_started: list[str] = field(default_factory=list)  # the steps each process began ("started" lines)
    second_started: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)  # from the engine's record (+ the kill, observed)
    knew: tuple[float, float, Source] | None = None  # when the restarted process took the recorded steps
    replayed: dict[str, bool] = field(default_factory=dict)  # call step -> the provider answered from its store
    asked: dict[str, int] = field(default_factory=dict)  # the stand-in's count, by turn
    provider: dict[str, EffectEntry] = field(default_factory=dict)  # the provider's count, by key

    # -- what the table says -----------------------------------------------------------------------

    @property
    def turns(self) -> int:
        return len(self.final["turns"]) if self.final else 0

    @property
    def calls(self) -> int:
        return sum(len(t["calls"]) for t in self.final["turns"]) if self.final else 0

    @property
    def executions(self) -> int:
        """Executions of tool calls, as the engine counted them (a call's ``attempts``)."""
        return sum(c["attempts"] for t in self.final["turns"] for c in t["calls"]) if self.final else 0

    @property
    def asked_again(self) -> dict[str, int]:
        """The turns the stand-in was asked more than once, and how many times."""
        return {turn: n for turn, n in self.asked.items() if n > 1}

    @property
    def requests(self) -> int:
        return sum(e["requests"] for e in self.provider.values())

    @property
    def applied(self) -> dict[str, int]:
        """Effects the provider applied for the run, by kind, in the order it first saw them."""
        out: dict[str, int] = {}
        for e in sorted(self.provider.values(), key=lambda e: e["first_seen"] or ""):
            out[e["kind"]] = out.get(e["kind"], 0) + e["effects_applied"]
        return out

    def key_of(self, step: str) -> str | None:
        """The idempotency key of a call step, as the engine's loop status gives it."""
        turn, index = parse_step(step)
        for t in (self.final or {"turns": []})["turns"]:
            if t["turn"] == turn and index is not None and index < len(t["calls"]):
                return t["calls"][index]["key"]
        return None

    @property
    def completed_at(self) -> float | None:
        """When the final turn's answer was recorded (the engine's record)."""
        last = [a.end for a in self.attempts if a.step == turn_step(self.turns) and not a.killed]
        return max(last) if last else None

    @property
    def kill_to_completed(self) -> float | None:
        done, killed = self.completed_at, self.watched.killed_at
        return None if done is None or killed is None else done - killed

    @property
    def recorded_at_kill(self) -> list[str]:
        """The steps the record held as completed when the process died (read back, not run again)."""
        if self.at_kill is None:
            return []
        out = []
        for t in self.at_kill["turns"]:
            if t["status"] == "completed":
                out.append(turn_step(t["turn"]))
            out += [call_step(t["turn"], c["index"]) for c in t["calls"] if c["status"] == "completed"]
        return out

    def problems(self) -> list[str]:
        """What differs from the expected run (the module docstring); empty when it is the expected one."""
        found = []
        if self.final is None or self.final["status"] != "completed":
            found.append(f"the run is {self.final['status'] if self.final else 'not found'}, not completed")
        if (self.turns, self.calls) != (TURNS, CALLS):
            found.append(f"{self.turns} turns and {self.calls} tool calls, not {TURNS} and {CALLS}")
        if self.asked != {str(n): 1 for n in range(1, TURNS + 1)}:
            found.append(f"the stand-in was asked {self.asked}, not each of the {TURNS} turns once")
        if self.applied_at_kill != {"refund": 1} or self.recorded_at_kill != RECORDED_AT_KILL:
            found.append(f"the kill did not land between the refund and its record (applied then: "
                         f"{self.applied_at_kill}; recorded: {self.recorded_at_kill})")
        if self.applied != APPLIED or any(e["effects_applied"] != 1 for e in self.provider.values()):
            found.append(f"the provider applied {self.applied}, not {APPLIED}, each once")
        key = self.key_of(KILLED_IN)
        if key is None or self.provider.get(key, {"requests": 0})["requests"] != 1:
            found.append(f"the interrupted refund's key was not sent exactly once ({key}): its retry should have "
                         "asked the provider by the key and taken the applied refund's answer")
        if not self.second_started or self.second_started[0] != KILLED_IN or \
                set(RECORDED_AT_KILL) & set(self.second_started):
            found.append(f"the restarted process began {self.second_started[:3]}, not {KILLED_IN} alone onward")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems()

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "label": LABELS[self.engine], "run_id": self.run_id, "task": self.task,
            "crash_at": POINT, "recorded_at_kill": self.recorded_at_kill, "applied_at_kill": self.applied_at_kill,
            "first_process_started": self.first_started, "restarted_process_started": self.second_started,
            "status": self.final["status"] if self.final else None, "turns": self.turns, "tool_calls": self.calls,
            "tool_call_executions": self.executions, "asked": self.asked, "asked_again": self.asked_again,
            "applied": self.applied, "requests": self.requests,
            "keys": {k: {"kind": e["kind"], "requests": e["requests"], "applied": e["effects_applied"]}
                     for k, e in self.provider.items()},
            "kill_to_completed_seconds": round(self.kill_to_completed, 3) if self.kill_to_completed else None,
            "problems": self.problems(), "ok": self.ok,
        }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(results: list[LoopObserved]) -> list[list[str]]:
    """The header (``SUMMARY_HEADER``), then one row per engine, in the order they ran: the text table's and
    the page's. Every number in a row is the record's, the stand-in's or the provider's (the module docstring)."""
    rows = [list(SUMMARY_HEADER)]
    for obs in results:
        again = obs.asked_again
        asked = (f"{_plural(sum(obs.asked.values()), 'request')} for {_plural(len(obs.asked), 'turn')}; "
                 + (", ".join(f"turn {t} {n} times" for t, n in again.items()) + " asked again" if again
                    else "none asked again"))
        applied = obs.applied
        effects = (f"{sum(applied.values())} applied for {_plural(obs.requests, 'request')}: "
                   + ", ".join(_plural(n, kind) for kind, n in applied.items()))
        took = obs.kill_to_completed
        rows.append([LABELS[obs.engine], str(obs.turns),
                     f"{obs.calls} ({_plural(obs.executions, 'execution')})", asked, effects,
                     f"{took:.1f} s" if took is not None else "-",
                     "as expected" if obs.ok else "NOT AS EXPECTED"])
    return rows


def render(results: list[LoopObserved]) -> str:
    """The table as text, then what was expected and what differed."""
    table = summary(results)
    widths = [max(len(row[i]) for row in table) for i in range(len(SUMMARY_HEADER))]

    def line(cells: list[str]) -> str:
        return "  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(cells)).rstrip()

    lines = [line(table[0]), "-" * len(line(table[0])), *(line(row) for row in table[1:]), ""]
    lines.append(f"expected on every engine: {TURNS} turns and {CALLS} tool calls, the interrupted refund executed "
                 "twice under one key, sent once and applied once (its retry looked the key up); each turn asked "
                 "once (a recorded turn is read back, never asked again); 2 refunds, 2 emails and 1 ticket applied"
                 + ("." if HAVE_DBOS else ". (DBOS: not installed, pip install -e '.[dbos]'.)"))
    for obs in results:
        for problem in obs.problems():
            lines.append(f"{LABELS[obs.engine]}: {problem}")
    return "\n".join(printable(text) for text in lines)
