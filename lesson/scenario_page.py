"""The scenario as one page (``python -m lesson.scenario --html PATH``, which
``make scenario`` runs with ``.state/scenario.html``): a lane per engine, in
the order they ran, each on its own time axis.

The durable engines' lanes come from their records (``lesson.lanes``,
the same lanes ``python -m lesson.compare --html`` draws) plus what the
scenario watched: the kill, the restart, the moment the restarted process
said what it had read. The in-memory "before" keeps no record, so its whole
lane is drawn from observation: the moments its two processes printed
``step <name> started`` and ``step <name> completed`` (as the scenario read
them: ``durable_agents.steps.startedline``, ``lesson.in_memory.completed_step``), the kill
and the restart. The provider's effects under every lane, the "before"
lane's two emails included, are the provider's record. The summary table
above the lanes is the one the scenario prints (``lesson.observed.summary``).
"""

from __future__ import annotations

from dataclasses import replace

from durable_agents.steps.plan import STEP_NAMES
from durable_agents.steps.startedline import parse_started
from lesson.in_memory import completed_step
from lesson.lanes import effects_of, engine_lane, watched_parts
from lesson.observed import Observed, summary
from timeline import OBSERVED, Lane, Span, render_page
from timeline.model import AGAIN, EXECUTED, Verdict


def in_memory_lane(obs: Observed) -> Lane:
    """The "before": every time observed, but the provider's."""
    seen = obs.watched
    spans = []
    for process in (1, 2):
        started: dict[str, float] = {}
        for at, line in ((at, line) for n, at, line in seen.lines if n == process):
            begun, step = parse_started(line), completed_step(line)
            if begun is not None:
                started[begun.step] = at
            elif step is not None and step in started:
                again = process == 2 and step in obs.completed_before
                spans.append(Span(step, started.pop(step), at, AGAIN if again else EXECUTED, OBSERVED, OBSERVED,
                                  label="again" if again else f"process {process}",
                                  note=f"{step}, run by process {process}"
                                       + (" although process 1 had completed it: nothing recorded that" if again
                                          else "") + " (its 'started' and 'completed' lines, observed)"))
    lane = Lane(engine="in_memory", title="in memory (the before)", run_id=obs.run_id,
                start=seen.began_at or 0.0, rows=list(STEP_NAMES), spans=spans,
                caption="No record: the restarted process could not know that steps 1 and 2 had run, so it ran them "
                        "again, with fresh idempotency keys the provider could not match.")
    lane.effects = effects_of(obs.provider)
    watched_parts(lane, seen)
    lane.verdict = Verdict.of(resumed(obs), lane.effects)
    lane.bad = obs.effects["send_confirmation"]["applied"] != 1
    return lane


def resumed(obs: Observed) -> str:
    """Where the restarted process resumed, as every lane's verdict says it (the summary table's column)."""
    return f"resumed at {obs.resumed_where or 'nowhere'}"


def lane_of(obs: Observed) -> Lane:
    if obs.engine == "in_memory":
        return in_memory_lane(obs)
    if obs.record is None:
        raise ValueError(f"no record of the {obs.engine} run {obs.run_id} was read: nothing to draw it from")
    lane = engine_lane(obs.record, obs.provider, obs.watched)
    # From its record, the lane knows the run's status; the scenario knows where it resumed.
    lane.verdict = replace(lane.verdict, where=resumed(obs))
    return lane


def scenario_page(results: list[Observed], task: str) -> str:
    return render_page(
        "The restart between step 2 and step 3, on every engine",
        "make scenario: each engine's run was SIGKILLed between step 2 and step 3, then started again. The engines "
        "ran one after another: each lane has its own time axis, from the moment the scenario started that "
        "engine's first process. Hover a bar for where its two ends come from. The task: " + task,
        [lane_of(obs) for obs in results],
        summary=summary(results),
        summary_bad=[obs.effects["send_confirmation"]["applied"] > 1 for obs in results],
    )
