"""Check 3. **Resume by run id** (exercise 3): the lesson's scenario (killed between
step 2 and step 3, then resumed), then one run killed at every step's
boundary in turn and resumed each time: each resume starts at the
recorded step, runs no completed step again (draft calls at the model,
requests at the provider), builds its requests from the recorded results,
and every effect is applied once; that run's record is on a power-cut
mount, and between step 2 and step 3 the power is cut before the resume.
"""

from __future__ import annotations

from grader.check import Check
from grader.evidence import WORDS, Record, Witnesses
from grader.expect import (
    EFFECT_STEPS,
    STEPS,
    executions,
    expect_completed,
    expect_done,
    expect_killed,
)
from grader.harness import CouldNotRun, Failed, Harness, Outcome, Run
from grader.power_cuts import PowerCuts
from grader.todos import todo

BOUNDARIES = ("draft:before", "send_confirmation:before", "send_confirmation:after_effect",
              "record_outcome:before", "record_outcome:after_effect")


def reached(point: str | None) -> tuple[str, ...]:
    """The steps that reach the outside world before a process is killed at ``point`` (None: all)."""
    if point is None:
        return STEPS
    step, when = point.split(":")
    i = STEPS.index(step)
    return STEPS[:i + 1] if when == "after_effect" else STEPS[:i]


def check_resume(h: Harness) -> list[str]:
    def scenario() -> str:
        """The lesson's scenario: killed between step 2 and step 3, resumed."""
        run = h.new_run("g3-scenario")
        expect_killed(h, h.start(run, crash_at="record_outcome:before"), "as step record_outcome began")
        resume_and_judge(h, run, "record_outcome:before", None)
        expect_done(h, run)
        before = h.witnesses(run)
        again = h.resume(run)  # a completed run resumed: there is nothing left to do
        after, record = h.witnesses(run), h.record(run)
        if after != before or record.run is None or record.run.get("status") != "completed":
            raise Failed(f"resuming run {run.run_id}, already completed, ran it again",
                         expected="a completed run has no current step: resume runs nothing and says so",
                         seen=f"{executions(before, after)}; {record.describe()}; exit {again.code}",
                         look_at=todo(5, "read the run back: only a run still running has a step to continue at"))
        h.evidence_runs["scenario"] = run  # the report quotes its evidence
        return ("killed between step 2 and step 3, resumed: only record_outcome ran; one email, one ticket; "
                "resumed once more, completed, it ran nothing")

    def every_kill() -> str:
        """One run killed at every boundary in turn, resumed each time."""
        run = h.new_run("g3-every-kill")
        # Its record on a power-cut mount, and between step 2 and step 3 the power goes too, before the resume.
        with PowerCuts(h, "g3-powercut", lanes=1) as cuts:
            run.record_db = cuts.record_db(0)
            expect_killed(h, h.start(run, crash_at=BOUNDARIES[0]), "as step draft began")
            for killed_at, next_kill in zip(BOUNDARIES, (*BOUNDARIES[1:], None), strict=True):
                if killed_at == "record_outcome:before":
                    cuts.cut(run, 0, run.outcomes[-1], cuts.record(run, 0), f"after the kill at {killed_at}")
                resume_and_judge(h, run, killed_at, next_kill)
            expect_done(h, run)
        run.record_db = cuts.kept(0)
        h.evidence_runs["every_kill"] = run
        return (f"one run killed at each of {len(BOUNDARIES)} step boundaries in turn and resumed each time: "
                "each resume began at the recorded step; every effect applied once; "
                + cuts.shown("the power cut between step 2 and step 3, before that resume"))

    return h.side_by_side(scenario, every_kill)


def resume_and_judge(h: Harness, run: Run, killed_at: str, next_kill: str | None) -> None:
    step = killed_at.split(":")[0]
    before = h.witnesses(run)
    outcome = h.resume(run, crash_at=next_kill or "")
    after = h.witnesses(run)
    record = h.record(run)
    context = f"killed at {killed_at}, then resumed"
    expect_no_missing_result(h, run, outcome, step)
    expect_once(run, after, context)
    expect_built_from_record(h, run, record, after, context)
    ran = [s for s in STEPS if after.executions(s) > before.executions(s)]
    done_before = STEPS[:STEPS.index(step)]
    again = [s for s in ran if s in done_before]
    if again:
        raise Failed(
            f"resume ran {', '.join(again)} again for run {run.run_id} ({context}), although the record holds "
            f"{'its' if len(again) == 1 else 'their'} result",
            expected=f"resume to start at the recorded step, {step}, and run nothing before it",
            seen=executions(before, after),
            look_at=todo(6, "go on at the step the record says is next, with the recorded results"))
    expected_ran = [s for s in reached(next_kill) if s not in done_before]
    skipped = [s for s in expected_ran if s not in ran]
    if skipped:
        h.raise_could_not_run(outcome)
        raise Failed(
            f"resume did not run {', '.join(skipped)} for run {run.run_id} ({context}); it exited {outcome.code}",
            expected=f"resume to continue at the recorded step, {step}",
            seen=f"{executions(before, after)}; its last lines: {outcome.last_lines()}",
            look_at=todo(5, "read the run back") + "; " + todo(6, "go on at the step the record says is next"))
    if next_kill is None:
        expect_completed(h, outcome, "`python flow.py resume`")
    else:
        expect_killed(h, outcome, f"at {next_kill}")


def expect_no_missing_result(h: Harness, run: Run, outcome: Outcome, current: str) -> None:
    """A resume that died looking up a step's result it never read (``KeyError: 'draft'``) ran a step past the
    recorded one: said in the lesson's words above the learner's traceback."""
    died = h.could_not_run(outcome)
    last = died.traceback.strip().splitlines()[-1] if died else ""
    missing = next((s for s in STEPS if last in (f"KeyError: '{s}'", f'KeyError: "{s}"')), None)
    if died is None or missing is None:
        return
    raise CouldNotRun(
        f"resume of run {run.run_id} died looking up the result of {missing} ({last}): resume did not start at "
        f"current_step. The record says the run is at {current!r} with the results of "
        f"{', '.join(STEPS[:STEPS.index(current)]) or 'no step'} recorded, so a resume that starts at {current!r} "
        f"has every result it needs; look at "
        + todo(6, "continue at the step the record says is current, with the recorded results"),
        died.traceback)




def expect_once(run: Run, seen: Witnesses, context: str) -> None:
    for step in EFFECT_STEPS:
        applied = seen.applied(step)
        if len(applied) > 1:
            raise Failed(
                f"the provider applied {WORDS[step]} {len(applied)} times for run {run.run_id} ({context}; keys "
                f"{', '.join(e.key for e in applied)}): resume sent a different key",
                expected=f"{WORDS[step]} applied once, every attempt under one key",
                seen="; ".join(f"{e.key}: {e.requests} request(s), applied" for e in applied),
                look_at=todo(3, "build the key from the run id and the step name"))


def expect_built_from_record(h: Harness, run: Run, record: Record, seen: Witnesses, context: str) -> None:
    """What the provider applied is what the recorded results say: the requests were built from the record."""
    drafted, sent = record.result("draft"), record.result("send_confirmation")
    checks = [("send_confirmation", "body", drafted, "body", "the email's body", "the recorded draft's body"),
              ("record_outcome", "summary", drafted, "summary", "the ticket's summary", "the recorded draft's"),
              ("record_outcome", "email_message_id", sent, "message_id", "the ticket's email message id",
               "the recorded email's message id")]
    for step, field, recorded, source, what, theirs in checks:
        for effect in seen.applied(step):
            if recorded is None or effect.request is None or effect.request.get(field) == recorded.get(source):
                continue
            calls = h.model.calls(run.task)
            mine, theirs_text = where_differ(str(recorded.get(source)), str(effect.request.get(field)))
            lead = f"the model wrote {len(calls)} drafts for run {run.run_id}, which needed one: " if len(calls) > 1 \
                else ""
            if len(calls) > 1 and drafted is not None and drafted.get("body") == calls[-1].body:
                # The record holds the newest draft: the draft step itself ran again and was recorded over the
                # first, so resume did not start at the recorded step (TODO 6), whatever it read back.
                raise Failed(
                    f"{lead}the resume ran draft again ({context}) and recorded its new draft over the first, and "
                    f"{what} is not {theirs}",
                    expected=f"resume to continue at the step the record says is current, with the recorded "
                             f"results (one draft in all); {what}, where the texts differ: {mine}",
                    seen=f"{theirs_text} (the model numbers its drafts: a different number is a draft written again)",
                    look_at=todo(6, "continue at the step the record says is current, with the recorded results: "
                                    "no completed step runs again"))
            raise Failed(
                f"{lead}resume sent a request not built from the record for run {run.run_id} ({context}): {what} is "
                f"not {theirs}",
                expected=f"{what}, where the texts differ: {mine}",
                seen=f"{theirs_text} (the model wrote {len(calls)} draft(s) in all)",
                look_at=todo(5, "read each completed step's recorded result into `results`, and build the "
                                "requests from them: a step run again writes different words"))


def where_differ(expected: str, seen: str, before: int = 25, after: int = 45) -> tuple[str, str]:
    """Both texts around their first difference, so that two long texts cut to the same prefix stay apart."""
    i = next((k for k, (a, b) in enumerate(zip(expected, seen, strict=False)) if a != b), min(len(expected), len(seen)))
    start = max(0, i - before)

    def cut(text: str) -> str:
        piece = text[start:i + after]
        return f"{'...' if start else ''}{piece!r}{'...' if i + after < len(text) else ''} (from character {start})"

    return cut(expected), cut(seen)




CHECK = Check(3, "resume by run id: at the recorded step, nothing completed run again, each effect once",
              check_resume)
