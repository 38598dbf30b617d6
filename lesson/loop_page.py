"""The agent loop's kill and resume as one page (``python -m lesson.loop_scenario --html PATH``; ``make
pictures`` photographs it as docs/loop.png): a lane per engine, in the order they ran, each on its own
time axis.

A lane's rows are the run's steps as its record holds them: a row per turn
(``turn-<n>``) and, under it, a row per tool call of that turn
(``turn-<n>/call-<i>``), then a row per kind of effect the provider applied.
Its bars (``lesson.loop_scenario``: ``Attempt``):

- a turn: the model asked, its answer recorded; labelled with its number and
  the tools it asked for. ``data-asked`` is the stand-in's count of requests
  for that turn; a turn asked more than once is drawn as *again*;
- a tool call: labelled with the tool and, for an effect, the tail of its
  idempotency key. The call whose process was killed after its effect and
  before its record is drawn twice: the killed attempt (its end the kill,
  observed), and the execution after the restart, drawn as *rerun* when the
  provider applied its key once (the second request answered from its
  store), as *again* if the provider applied it a second time;
- what the restarted process took from the record instead of running it:
  the steps recorded before the kill, hatched, at the moment it took them
  (Temporal: the replaying workflow task, from history; the run record and
  DBOS: the line the restarted process printed, observed);
- the processes, the kill and the restart (observed: ``lesson.lanes.watched_parts``),
  and on Temporal the wait for the dead worker's heartbeat timeout;
- the provider's effects under the lane, each key with its requests. One
  effect per tool call (``timeline.model.Effect.group``: the call's step),
  so the two orders' refunds are two refunds, not a duplicate.

The summary table above the lanes is the one the scenario prints (``lesson.loop_scenario.summary``).
"""

from __future__ import annotations

from dataclasses import replace

from durable_agents.steps.loop import EFFECT_OF_TOOL, call_step, parse_step, turn_step
from lab.engines import LoopCall, LoopTurn
from lesson.lanes import effects_of, watched_parts
from lesson.loop_observed import LABELS, POINT, TURNS, Attempt, LoopObserved, summary
from timeline import RECORD, Lane, Mark, Span, render_page
from timeline.model import AGAIN, EXECUTED, READ, REPLAY, REPLAYED, RERUN, WAITING, SpanKind, Verdict

EFFECT_ROWS = ["refund", "email", "ticket"]
HOW_IT_KNEW = {
    "temporal": "Worker 2's first workflow task replayed the history: {recorded} came from it, the model not asked "
                "them again. Between the kill and the replay nothing ran: Temporal waited for the dead worker's "
                "heartbeat timeout, then for its workflow task to leave the dead worker's queue.",
    "runrecord": "Process 2 read the run row and the step rows: {recorded} were read from the record, the model "
                 "not asked them again; the refund's intent was in doubt, so its call ran again.",
    "dbos": "DBOS recovered the run on launch: the workflow function ran again and {recorded} returned the output "
            "DBOS had recorded, the model not asked them again; the refund had no row, so its call ran again.",
}


def tail(key: str | None) -> str:
    """The end of an idempotency key, enough to tell one call's from another's on a bar (the note has it whole)."""
    return f"\u2026{key[-8:]}" if key else ""


def _turns(obs: LoopObserved) -> list[LoopTurn]:
    return obs.final["turns"] if obs.final else []


def _calls(obs: LoopObserved) -> dict[str, LoopCall]:
    return {call_step(t["turn"], c["index"]): c for t in _turns(obs) for c in t["calls"]}


def _turn_words(obs: LoopObserved, turn: int) -> tuple[str, str]:
    """What a turn's bar says it asked for: the tools, and in short, how many."""
    found = next((t for t in _turns(obs) if t["turn"] == turn), None)
    if found is None or found["final"]:
        return "the final answer", "the answer"
    calls = [c["name"] for c in found["calls"]]
    return ", ".join(calls) or "no answer recorded", f"{len(calls)} call{'' if len(calls) == 1 else 's'}"


def _turn_span(obs: LoopObserved, a: Attempt, place: int, executions: int) -> Span:
    turn = parse_step(a.step)[0]
    times = obs.asked.get(str(turn), 0)
    # Asked more than once (the stand-in's count): the later executions, or the one timed, were asked again.
    again = times > 1 and (place > 0 or executions == 1)
    words, short = _turn_words(obs, turn)
    asked_again = f" (asked {times} times)" if again else ""
    note = (f"turn {turn}, by {obs.watched.names[a.process - 1]}: the model asked, its answer recorded ("
            f"{a.start_from} start, {a.end_from} end); the stand-in counted {times} request(s) for this turn")
    return Span(a.step, a.start, a.end, AGAIN if again else EXECUTED, a.start_from, a.end_from,
                label=f"turn {turn}: {words}{asked_again}", short_label=f"turn {turn}: {short}{asked_again}",
                note=note, data=(("asked", str(times)), ("process", str(a.process))))


def _call_spans(obs: LoopObserved, a: Attempt, after_kill: bool, executions: int) -> list[Span]:
    call = _calls(obs).get(a.step)
    name = call["name"] if call else a.step
    key = call["key"] if call else None
    base = f"{name} {tail(key)}".rstrip()
    data = (("executions", str(executions)), ("process", str(a.process))) + ((("key-tail", key[-8:]),) if key else ())
    where = f"{a.start_from} start, {a.end_from} end"
    if a.killed:
        spans = [Span(a.step, a.start, a.end, EXECUTED, a.start_from, a.end_from, label=f"{base}, killed",
                      short_label=f"{tail(key)} killed".lstrip(),
                      note=f"{a.step} {name}, key {key}: executed by {obs.watched.names[0]}, which the kill ended "
                           f"right after the provider applied it, before its result was recorded ({where})",
                      data=data)]
        if a.waited_until is not None and a.waited_until > a.end:
            spans.append(Span(a.step, a.end, a.waited_until, WAITING, "observed", RECORD,
                              label="heartbeat timeout",
                              note=f"{a.step}: the server waited for a heartbeat from the dead worker, then closed "
                                   "the attempt (ActivityTaskTimedOut, record)"))
        return spans
    if not after_kill:
        return [Span(a.step, a.start, a.end, EXECUTED, a.start_from, a.end_from, label=base,
                     short_label=tail(key),
                     note=f"{a.step} {name}" + (f", key {key}" if key else ", no key: read-only")
                          + f" ({where})", data=data)]
    entry = obs.provider.get(key or "")
    once = entry is not None and entry["effects_applied"] == 1
    replayed = obs.replayed.get(a.step, False)
    kind: SpanKind = RERUN if once else AGAIN
    requests = entry["requests"] if entry else 0
    # Its retry asked the provider by the key first (the tool's lookup): an applied refund's answer taken, nothing
    # sent again (one request); a key it could not tell of sent again, which the provider replays (two).
    looked_up = replayed and requests == 1
    words, short = ((("again: looked up by its key, applied once" if looked_up else
                      "again: the provider replayed it, applied once") if replayed else "again, applied once",
                     "again, applied once") if once else ("again, applied twice", "again, applied twice"))
    # The key's tail, as on the killed attempt's bar: the same key (the tool is the row's label).
    return [Span(a.step, a.start, a.end, kind, a.start_from, a.end_from, label=f"{tail(key)} {words}".lstrip(),
                 short_label=f"{tail(key)} {short}".lstrip(),
                 note=f"{a.step} {name}, key {key}: executed again by {obs.watched.names[1]} (its result was never "
                      f"recorded), under the same key; the provider saw {requests} request(s) with it and applied "
                      f"{entry['effects_applied'] if entry else 0}"
                      + ("; the retry asked the provider by the key first (the tool's lookup) and took the applied "
                         "refund's answer, sending nothing again (replayed, as the recorded result says)" if looked_up
                         else "; it answered this one from its store (replayed, as the recorded result says)"
                         if replayed else "") + f" ({where})", data=(*data, ("replayed", str(replayed).lower())))]


def _taken_spans(obs: LoopObserved) -> list[Span]:
    """The steps recorded before the kill, taken from the record by the restarted process."""
    if obs.knew is None:
        return []
    start, end, source = obs.knew
    kind: SpanKind = READ if obs.engine == "runrecord" else REPLAYED
    word = "read" if kind == READ else "replayed"
    how = {"temporal": "from history, when worker 2 replayed it (its workflow task, record)",
           "runrecord": "from its step row, when process 2 said it read the record (observed)",
           "dbos": "from its operation_outputs row, when process 2 said it launched DBOS (observed)"}[obs.engine]
    spans = []
    for step in obs.recorded_at_kill:
        turn, index = parse_step(step)
        if index is None:
            times = obs.asked.get(str(turn), 0)
            spans.append(Span(step, start, end, kind, source, source, label=f"{word}, not asked",
                              note=f"turn {turn}: its recorded answer taken {how}; the model was not asked it "
                                   f"again (the stand-in counted {times} request(s) for it in all)",
                              data=(("asked", str(times)),)))
        else:
            spans.append(Span(step, start, end, kind, source, source, label=word,
                              note=f"{step}: its recorded result taken {how}, not run again"))
    return spans


def loop_lane(obs: LoopObserved) -> Lane:
    rows: list[str] = []
    labels: dict[str, str] = {}
    for t in _turns(obs):
        rows.append(turn_step(t["turn"]))
        labels[rows[-1]] = f"turn {t['turn']}"
        for c in t["calls"]:
            rows.append(call_step(t["turn"], c["index"]))
            labels[rows[-1]] = f"call {c['index']}: {c['name']}"
    spans: list[Span] = []
    by_step: dict[str, list[Attempt]] = {}
    for a in sorted(obs.attempts, key=lambda a: a.start):
        by_step.setdefault(a.step, []).append(a)
    for step, attempts in by_step.items():
        killed = any(a.killed for a in attempts)
        for place, a in enumerate(attempts):
            if parse_step(step)[1] is None:
                spans.append(_turn_span(obs, a, place, len(attempts)))
            else:
                spans.extend(_call_spans(obs, a, killed and not a.killed and a.process == 2, len(attempts)))
    spans += _taken_spans(obs)
    # One effect per tool call: two orders' refunds are two effects; a second one applied for the same call (a
    # fresh key for it) would be the duplicate the page marks.
    step_of_key = {c["key"]: step for step, c in _calls(obs).items() if c["key"]}
    effects = [replace(e, group=step_of_key.get(e.key, e.key)) for e in effects_of(obs.provider)]
    seen = obs.watched
    recorded = ", ".join(obs.recorded_at_kill) or "nothing"
    start = seen.began_at or min((s.start for s in spans), default=0.0)
    lane = Lane(engine=obs.engine, title=LABELS[obs.engine], start=start,
                rows=rows, run_id=obs.run_id, row_labels=labels, effect_rows=list(EFFECT_ROWS), spans=spans,
                caption=HOW_IT_KNEW[obs.engine].format(recorded=recorded))
    lane.effects = effects
    watched_parts(lane, seen)
    if obs.engine == "temporal" and obs.knew is not None:
        lane.marks.append(Mark(obs.knew[0], REPLAY, RECORD, "history replayed",
                               "worker 2's first workflow task of this run: it replayed the history "
                               "(WorkflowTaskStarted, record)"))
    resumed = obs.second_started[0] if obs.second_started else None
    name = _calls(obs).get(resumed or "")
    again = obs.asked_again
    where = "; ".join(part for part in (
        obs.final["status"] if obs.final else "not found",
        f"resumed at {resumed}" + (f" ({name['name']})" if name else "") if resumed else "",
        ("turns asked again: " + ", ".join(again)) if again else "no turn asked again") if part)
    lane.verdict = Verdict.of(where, effects)
    lane.bad = not obs.ok
    return lane


def loop_page(results: list[LoopObserved]) -> str:
    """The page: the summary, the legend, a lane per engine, what to read in it."""
    effect_tools = ", ".join(f"{tool} ({kind})" for tool, kind in EFFECT_OF_TOOL.items())
    return render_page(
        "An agent loop killed right after a refund, on every engine",
        f"make loop-scenario: the same task on each engine, two orders: {TURNS} turns, turns 2 and 4 carry "
        f"issue_refund then send_email. The process running the loop was SIGKILLed right after the provider "
        f"applied the first refund (CRASH_AT={POINT}), before the call's result was recorded; a fresh process "
        "resumed it. The engines ran one after another, with one provider and one model stand-in: each lane has "
        "its own time axis, from the start of that engine's first process. Hover a bar for where its two ends "
        "come from.",
        [loop_lane(obs) for obs in results],
        summary=summary(results),
        summary_bad=[not obs.ok for obs in results],
        notes=[
            "What ran again: the refund whose result died with its process, under the key it had; it asked the "
            "provider by that key first (its tool's lookup), found the refund applied and took its answer "
            "(teal), so it was applied once and sent once. What did not: every turn recorded before "
            "the kill was taken from the record (hatched), and the model stand-in counted one request for each "
            "turn (the table above; hover a turn's bar for its count).",
            f"The tools with an effect, and what the provider applies: {effect_tools}; lookup_order applies "
            "nothing and has no key.",
        ],
    )
