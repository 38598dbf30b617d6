"""One ``timeline`` lane per durable engine, from the side each engine reads
of its own record (the run record: ``durable_agents.runrecord.compare.record_side``;
Temporal: ``durable_agents.flowclient.compare.temporal_side``; DBOS:
``durable_agents.dbosflow.compare.dbos_side``) and the provider's count, plus, when someone
watched the processes (``lesson.scenario``), what they saw. Drawn by the
comparison's page (``lesson.compare --html PATH``) and the scenario's
(``lesson.scenario_page``). A lane's rows are its flow's (``flow``: the lab's
``durable_agents.steps.plan.FLOW`` by default): a row per step, and a row per kind of effect
the flow has (``durable_agents.steps.plan.effect_kinds``), to which the provider's count adds
any other kind it saw.

Where each time comes from (``timeline.model``: RECORD or OBSERVED):

- run record: a step without an effect, its step row's ``started_at`` and
  ``completed_at``; an effect step, one bar per intent (per attempt), from
  ``recorded_at`` to ``settled_at``. An attempt whose process died (its intent
  left in doubt, settled by a later attempt) ends where the watcher saw the
  process die, or else, from the record alone, where the next attempt began;
- Temporal: each activity execution (an attempt: the workflow retries) from
  its ``ActivityTaskStarted`` to its close. A killed attempt's close is the
  server's heartbeat timeout, a second or so after the kill: with a watcher,
  the bar ends at the kill (observed) and the wait after it is drawn as
  waiting. (Runs recorded before the workflow-side retries have server-side
  attempts, of which history times only the last: the earlier ones are a
  dotted stretch.) The replay is the first workflow task a new worker started
  (its start and close, record times): the steps completed before it came
  from history;
- DBOS: each ``operation_outputs`` row's start and end. DBOS records no time
  for the recovery that re-ran the workflow function and took the recorded
  steps' outputs: the watcher's time if there is one, else drawn just before
  the first row of the later dispatch;
- the provider: each key's ``first_seen`` and ``last_seen`` (its record);
- ``Watched`` (all OBSERVED): when the processes started, when the SIGKILLed
  one was reaped, when the restarted process said what it had read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from durable_agents.dbosflow.sides import DbosSide
from durable_agents.flowclient.sides import TemporalSide
from durable_agents.runrecord.sides import RecordSide
from durable_agents.steps.plan import FLOW, FlowStep, effect_kinds
from durable_agents.steps.runstate import unix
from durable_agents.steps.runview import short_result
from durable_agents.steps.sides import EffectEntry, Side
from lesson.sides import EngineSide
from timeline import OBSERVED, RECORD, Effect, Lane, Mark, Span
from timeline.model import (
    EXECUTED,
    KILL,
    READ,
    REPLAY,
    REPLAYED,
    RESTART,
    UNRECORDED,
    WAITING,
    SpanKind,
    Verdict,
)

TITLES = {"runrecord": "run record (SQLite)", "temporal": "Temporal", "dbos": "DBOS (SQLite)"}


@dataclass
class Watched:
    """What a watcher saw happen to one engine's run (wall-clock seconds, all OBSERVED)."""

    began_at: float | None = None  # the first process was started
    killed_at: float | None = None  # the SIGKILLed process was reaped
    restarted_at: float | None = None  # the process that finished the run was started
    ended_at: float | None = None  # that process exited, or was stopped
    knew_at: float | None = None  # the restarted process printed what it had read or recovered
    refused_restarts: int = 0  # restarts refused first (the dead process's lease had not expired)
    names: tuple[str, str] = ("process 1", "process 2")
    killed_in: str = ""  # the crash point that killed it
    lines: list[tuple[int, float, str]] = field(default_factory=list)  # (process 1 or 2, arrival, line)


def effects_of(entries: Mapping[str, EffectEntry]) -> list[Effect]:
    """The provider's count for one run (``lesson.effects.provider_side``) as the lane's effects."""
    return [Effect(key=key, kind=e["kind"], requests=e["requests"], applied=e["effects_applied"],
                   first_seen=unix(e["first_seen"]), last_seen=unix(e["last_seen"]))
            for key, e in entries.items()]


def watched_parts(lane: Lane, seen: Watched | None) -> None:
    """The watcher's processes and marks, added to ``lane``."""
    if seen is None or seen.began_at is None:
        return
    first, second = seen.names
    if seen.killed_at is not None:
        lane.processes.append(Span("process", seen.began_at, seen.killed_at, start_from=OBSERVED,
                                   end_from=OBSERVED, label=first,
                                   note=f"{first}: started, then SIGKILLed at {seen.killed_in or 'its crash point'}"))
        lane.marks.append(Mark(seen.killed_at, KILL, OBSERVED, f"{first} killed",
                               f"{first} SIGKILLed by the crash point {seen.killed_in}: the time the watcher reaped "
                               "it (observed)"))
    if seen.restarted_at is not None:
        end = seen.ended_at if seen.ended_at is not None else seen.restarted_at
        lane.processes.append(Span("process", seen.restarted_at, end, start_from=OBSERVED, end_from=OBSERVED,
                                   label=second, note=f"{second}: started after the kill, ran the run to its end"))
        refused = (f" ({seen.refused_restarts} earlier start(s) refused: the dead process's lease had not "
                   "expired)") if seen.refused_restarts else ""
        lane.marks.append(Mark(seen.restarted_at, RESTART, OBSERVED, f"{second} started",
                               f"{second} started: the time the watcher started it (observed){refused}"))


def _lane(engine: str, side: Side, provider: Mapping[str, EffectEntry] | None,
          seen: Watched | None, spans: list[Span], caption: str, flow: Sequence[FlowStep]) -> Lane:
    effects = effects_of(provider or {})
    times = [t for s in spans for t in (s.start, s.end)] + [e.first_seen for e in effects if e.first_seen]
    starts = [t for t in (seen.began_at if seen else None, *times) if t is not None]
    lane = Lane(engine=engine, title=TITLES.get(engine, engine), run_id=side["run_id"],
                start=min(starts) if starts else 0.0, rows=[step.name for step in flow], spans=spans,
                caption=caption, effect_rows=list(effect_kinds(flow)))
    lane.effects = effects
    watched_parts(lane, seen)
    lane.verdict = Verdict.of(side["status"], effects)
    lane.bad = any(n > 1 for _, n in lane.verdict.applied)
    return lane


def _read_spans(seen: Watched | None, done_before: Sequence[str], kind: SpanKind, what: str) -> list[Span]:
    if seen is None or seen.knew_at is None:
        return []
    return [Span(name, seen.knew_at, seen.knew_at, kind, OBSERVED, OBSERVED, label=kind,
                 note=f"{name}: {what} (when the restarted process said so: observed)") for name in done_before]


def record_lane(side: RecordSide, provider: Mapping[str, EffectEntry] | None = None,
                seen: Watched | None = None, flow: Sequence[FlowStep] = FLOW) -> Lane:
    """The run record's lane, from ``durable_agents.runrecord.compare.record_side``."""
    spans: list[Span] = []
    restart = seen.restarted_at if seen else None
    done_before = []
    for step in side["steps"]:
        completed = unix(step["completed_at"])
        if completed is not None and restart is not None and completed < restart:
            done_before.append(step["name"])
        intents = step["intents"]
        if not intents:
            start = unix(step["started_at"])
            if start is not None:
                attempts = step["attempts"]
                spans.append(Span(step["name"], start, completed or start, EXECUTED, label=(
                    f"attempt {attempts}" if attempts == 1 else f"{attempts} attempts"),
                    note=f"{step['name']}: the step row's started_at to completed_at (record); "
                         f"{short_result(step['result'])}"))
            continue
        for i, intent in enumerate(intents):
            start = unix(intent["recorded_at"])
            if start is None:
                continue
            settled = unix(intent["settled_at"])
            if intent["state"] in ("answered", "error") and settled is not None:
                spans.append(Span(step["name"], start, settled, EXECUTED, label=f"attempt {intent['attempt']}",
                                  note=f"{step['name']} attempt {intent['attempt']}: its intent recorded, then "
                                       f"answered ({intent['state']}) (record)"))
                continue
            # Its process died with the request in doubt.
            later = unix(intents[i + 1]["recorded_at"]) if i + 1 < len(intents) else None
            if seen and seen.killed_at is not None and seen.killed_at >= start:
                spans.append(Span(step["name"], start, seen.killed_at, EXECUTED, RECORD, OBSERVED,
                                  label=f"attempt {intent['attempt']}, killed",
                                  note=f"{step['name']} attempt {intent['attempt']}: intent recorded (record); its "
                                       "process died (the kill, observed); the next attempt settled it"))
            elif later is not None:
                spans.append(Span(step["name"], start, later, UNRECORDED, label=f"attempt {intent['attempt']} died",
                                  note=f"{step['name']} attempt {intent['attempt']}: intent recorded, no outcome; "
                                       "its process died before the next attempt began (record)"))
    spans += _read_spans(seen, done_before, READ, "read from the record's step row, not run again")
    caption = ("The restarted process read the run row and the step rows, and ran only the steps not "
               "recorded as completed." if seen else
               "From the record alone: no kill or restart marks (make scenario draws them from what it watched).")
    return _lane("runrecord", side, provider, seen, spans, caption, flow)


def temporal_lane(side: TemporalSide, provider: Mapping[str, EffectEntry] | None = None,
                  seen: Watched | None = None, flow: Sequence[FlowStep] = FLOW) -> Lane:
    """Temporal's lane, from ``durable_agents.flowclient.compare.temporal_side`` (its executions and workflow tasks)."""
    spans: list[Span] = []
    counted: dict[str, int] = {}
    for ex in side.get("executions", []):
        step = ex["step"]
        scheduled, started, closed = (unix(ex[k]) for k in ("scheduled_at", "started_at", "closed_at"))
        if started is None:
            continue
        # Attempts are executions (the workflow retries); in runs recorded before that, the server's
        # attempt number counts instead (durable_agents.flowclient.status), and only the last attempt has a start.
        before = counted.get(step, 0)
        n = counted[step] = before + (ex["attempt"] or 1)
        if n > before + 1 and scheduled is not None:
            spans.append(Span(step, scheduled, started, UNRECORDED, label=f"attempts {before + 1}-{n - 1}",
                              note=f"{step}: attempts {before + 1}-{n - 1} ran in here; history writes a start event "
                                   "only for an execution's last attempt (record)"))
        end = closed if closed is not None else started
        killed = seen.killed_at if seen else None
        if ex["crashed"] and killed is not None and started <= killed <= end:
            spans.append(Span(step, started, killed, EXECUTED, RECORD, OBSERVED,
                              note=f"{step} attempt {n}: ActivityTaskStarted (record, written when the attempt "
                                   f"closed) to the kill of {ex['identity']} (observed)"))
            spans.append(Span(step, killed, end, WAITING, OBSERVED, RECORD,
                              label="killed; heartbeat timeout",
                              note=f"{step} attempt {n}: the server waited for a heartbeat from the dead worker, then "
                                   f"closed the attempt ({ex['outcome']}, record)"))
            continue
        outcome = ("worker lost; closed by its heartbeat timeout" if ex["crashed"] else
                   ex["outcome"].replace("_", " ") if ex["outcome"] not in ("completed", "running") else "")
        spans.append(Span(step, started, end, EXECUTED, label=f"attempt {n}" + (f", {outcome}" if outcome else ""),
                          note=f"{step} attempt {n}: ActivityTaskStarted to its {ex['outcome']} event, worker "
                               f"{ex['identity']} (record)"))
    marks: list[Mark] = []
    tasks = side.get("workflow_tasks", [])
    known = {t["identity"] for t in tasks[:1]}
    replay_at = None
    for task in tasks:
        at, closed_at = unix(task["started_at"]), unix(task["closed_at"])
        if task["identity"] in known or at is None:
            continue
        known.add(task["identity"])
        replay_at = at if replay_at is None else replay_at
        replayed = [ex["step"] for ex in side.get("executions", [])
                    if ex["outcome"] == "completed" and (unix(ex["closed_at"]) or at) < at]
        marks.append(Mark(at, REPLAY, RECORD, "history replayed",
                          f"a worker new to this run ({task['identity']}) started a workflow task: it replayed the "
                          "history (WorkflowTaskStarted, record)"))
        spans += [Span(name, at, closed_at or at, REPLAYED, label="replayed",
                       note=f"{name}: its result came from history when {task['identity']} replayed it, not "
                            "executed again (the workflow task's start and close, record)") for name in replayed]
    if replay_at is None:
        caption = "One worker ran every workflow task: nothing was replayed."
    else:
        after = sorted(unix(ex["started_at"]) or 0 for ex in side.get("executions", []) if ex["started_at"])
        ran_after = any(t >= replay_at for t in after)
        caption = ("The new worker's first workflow task replayed the history: the completed steps' results came "
                   "from it, not from running them again" + (", then it ran the step that had not completed."
                                                             if ran_after else "."))
        if seen is not None and seen.killed_at is not None:
            caption += (" Between the kill and the replay nothing ran: Temporal waited for the dead worker's "
                        "heartbeat, then for its workflow task to time out on the dead worker's queue.")
    lane = _lane("temporal", side, provider, seen, spans, caption, flow)
    lane.marks += marks
    return lane


def dbos_lane(side: DbosSide, provider: Mapping[str, EffectEntry] | None = None,
              seen: Watched | None = None, flow: Sequence[FlowStep] = FLOW) -> Lane:
    """DBOS's lane, from ``durable_agents.dbosflow.compare.dbos_side`` (its step rows)."""
    spans: list[Span] = []
    rows = side.get("rows", [])
    last_dispatch = max((r.get("dispatch") or 1 for r in rows), default=1)
    for row in rows:
        start, end = unix(row["started_at"]), unix(row["completed_at"])
        if start is None:
            continue
        spans.append(Span(row["name"], start, end or start, EXECUTED,
                          label=f"dispatch {row.get('dispatch') or '?'}, attempt {row.get('attempt') or '?'}",
                          note=f"{row['name']}: its operation_outputs row, started to completed (record); "
                               f"{row['summary']}"))
    earlier = [r["name"] for r in rows if (r.get("dispatch") or 1) < last_dispatch]
    if seen is not None and seen.knew_at is not None:
        spans += _read_spans(seen, earlier, REPLAYED, "DBOS's recovery re-ran the workflow function and this step "
                                                      "returned its recorded output, not run again")
    elif earlier:
        later = [unix(r["started_at"]) for r in rows if (r.get("dispatch") or 1) == last_dispatch]
        at = min((t for t in later if t is not None), default=None)
        if at is not None:
            spans += [Span(name, at, at, REPLAYED, label="replayed",
                           note=f"{name}: dispatch {last_dispatch} took its recorded output; DBOS records no time for "
                                "that, drawn where that dispatch's first row starts") for name in earlier]
    caption = (f"DBOS recovered the run on launch (dispatch {last_dispatch}): the workflow function ran again "
               "and every step with a row returned its recorded output." if last_dispatch > 1 else
               "One dispatch ran the whole run.")
    return _lane("dbos", side, provider, seen, spans, caption, flow)


def engine_lane(side: EngineSide, provider: Mapping[str, EffectEntry] | None = None,
                seen: Watched | None = None) -> Lane:
    """The lane of whichever engine ``side`` is from, told by the keys only its side has."""
    if "executions" in side:
        return temporal_lane(side, provider, seen)
    if "workflow" in side:
        return dbos_lane(side, provider, seen)
    return record_lane(side, provider, seen)
