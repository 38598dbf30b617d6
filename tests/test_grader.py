"""The grader is honest: for each exercise it fails the untouched practice
with that exercise's first message and passes the solution, and each wrong
answer a learner would write fails with its own message. The grader runs as
the learner runs it (``python -m grader.grade``), against real processes.

Each wrong answer is the solution with one change a learner would make,
and runs only the check it targets (``--only``), so the suite pays for one
check per wrong answer, not for the whole exercise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from grader.check_terminal import BUDGET_SECONDS, SETTLE_SECONDS
from lab.processes import REPO

pytestmark = pytest.mark.process

EXERCISES = REPO / "exercises"
FOLDERS = {int(p.name[:2]): p for p in sorted(EXERCISES.glob("[0-9][0-9]-*"))}
RECORD_TRACK = (1, 2, 3, 4, 5)  # each builds on the last; grade N runs checks 1..N
STANDS_ALONE = (6, 7)  # each from a starting point of its own (Temporal; the agent loop): grade N runs check N


def grade(n: int, impl: str | Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "grader.grade", str(n), "--impl", str(impl), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    done.stdout = done.stdout + done.stderr  # one text to search and to show
    return done


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- practice fails, solution passes

FIRST_MESSAGE = {
    1: ("the record holds no run", "TODO 1 (exercise 1)"),
    2: ("but the record holds no intent for send_confirmation", "TODO 4 (exercise 2)"),
    3: ("resume did not run record_outcome", "TODO 5 (exercise 3)"),
    4: ("the window holds", "tokens; the budget is 300", "TODO 8 (exercise 4) in bounded_memory.py"),
    5: ("did not end in its failed state after a hard bounce", "PermanentError", "TODO 11 (exercise 5)"),
    6: ("the workflow task failed and the run parks: RestrictedWorkflowAccessError", "the provider got 0 email",
        "TODO 13 (exercise 6) in agent_workflow.py"),
    7: ("holds no turn 1, although the run was killed after turn 2 was received", "TODO 15 (exercise 7) in "
        "agent_loop.py"),
}


@pytest.mark.parametrize("n", sorted(FOLDERS))
def test_the_untouched_practice_fails_with_its_exercises_first_message(n):
    """The last practice of the record track runs as a learner runs it, every check up to its own; the
    others their own check (each passes the checks before it as the next exercise's run shows)."""
    before = tree_digest(FOLDERS[n] / "practice")
    whole = n == RECORD_TRACK[-1] or n in STANDS_ALONE
    done = grade(n, "practice", *([] if whole else ["--only", str(n)]))
    assert done.returncode == 1, done.stdout
    failed = [line for line in done.stdout.splitlines() if "FAIL" in line]
    assert len(failed) == 1 and f"check {n}:" in done.stdout.split(failed[0])[0].splitlines()[-1], done.stdout
    for needle in FIRST_MESSAGE[n]:
        assert needle in done.stdout, done.stdout
    # The checks of the exercises before it pass: practice N+1 is solution N plus the new TODOs.
    assert done.stdout.count("  PASS") == (n - 1 if whole and n not in STANDS_ALONE else 0), done.stdout
    if whole and n > 3:  # check 3 passed here, but the quick check's answer belongs to exercise 3's grading
        assert "What must resuming not do?" not in done.stdout, done.stdout
    assert tree_digest(FOLDERS[n] / "practice") == before, "the grader wrote into the learner's folder"


@pytest.mark.parametrize("n", sorted(FOLDERS))
def test_the_solution_passes_every_check_up_to_its_exercise(n):
    """Each solution passes its own check: the checks before it ran on the last practice of the track,
    which is every solution before it plus TODOs (test_each_practice_is_the_previous_solution_plus_its_todos)."""
    before = tree_digest(FOLDERS[n] / "solution")
    done = grade(n, "solution", "--only", str(n))
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("  PASS") == 1 and "every check passed" in done.stdout, done.stdout
    assert tree_digest(FOLDERS[n] / "solution") == before, "the grader wrote into the learner's folder"
    if n == 3:  # the quick check's answer comes with the evidence of the learner's own run
        assert "What must resuming not do?" in done.stdout and "the resume sent none" in done.stdout, done.stdout


# ---------------------------------------------------------------- the wrong answers a learner would write


@dataclass(frozen=True)
class WrongAnswer:
    name: str
    exercise: int
    check: int
    old: str  # in the exercise's solution/flow.py
    new: str
    message: tuple[str, ...]  # what the grader must say
    file: str = "flow.py"
    also: tuple[str, str] | None = None  # a second (old, new) of the same change, when it moves code
    exit: int = 1  # 3: the program died of its own exception, and the grader names the lesson's mistake above it
    never: tuple[str, ...] = ()  # what the grader must not say: a neighbouring TODO it could wrongly blame


ADVANCE = '''        with transaction(conn):
            conn.execute("INSERT INTO steps VALUES (?, ?, ?)", (inputs.run_id, name, json.dumps(results[name])))
            conn.execute("UPDATE runs SET current_step = ?, status = ? WHERE run_id = ?",
                         (after, "running" if after else "completed", inputs.run_id))
'''
INTENT = '''            with transaction(conn):
                (attempts,) = conn.execute("SELECT COUNT(*) FROM intents WHERE run_id = ? AND step = ?",
                                           (inputs.run_id, name)).fetchone()
                conn.execute("INSERT INTO intents VALUES (?, ?, ?, ?, ?)",
                             (inputs.run_id, name, attempts + 1, key, json.dumps(asdict(request))))
'''
CALL = "        results[name] = asdict(await call_step(name, step, request, deps))\n"

WRONG_ANSWERS = [
    WrongAnswer(
        "records the result but never moves the run on", 1, 1,
        old='            conn.execute("UPDATE runs SET current_step = ?, status = ? WHERE run_id = ?",\n'
            '                         (after, "running" if after else "completed", inputs.run_id))\n',
        new="",
        message=("is not where the run got to", "current_step 'draft'", "TODO 2 (exercise 1)")),
    WrongAnswer(
        "starts a run id that is already there again", 1, 1,
        old='conn.execute("INSERT INTO runs (run_id', new='conn.execute("INSERT OR REPLACE INTO runs (run_id',
        message=("a second time ran it again", "a run id names one run", "TODO 1 (exercise 1)")),
    WrongAnswer(
        "moves the run on before the step's result is recorded", 1, 1,
        old=ADVANCE,
        new='''        with transaction(conn):
            conn.execute("UPDATE runs SET current_step = ?, status = ? WHERE run_id = ?",
                         (after, "running" if after else "completed", inputs.run_id))
        with transaction(conn):
            conn.execute("INSERT INTO steps VALUES (?, ?, ?)", (inputs.run_id, name, json.dumps(results[name])))
''',
        message=("the run advanced before the step's result was recorded", "killed right after the program's commit",
                 "TODO 2 (exercise 1)")),
    WrongAnswer(
        "the run's row written with its first result", 1, 1,
        old="            with transaction(conn):\n"
            '                conn.execute("INSERT INTO runs (run_id, task, email, status, current_step) "\n'
            "                             \"VALUES (?, ?, ?, 'running', ?)\", (run_id, task, email, NAMES[0]))\n",
        new='            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():\n'
            "                raise sqlite3.IntegrityError(run_id)  # the run's row comes with its first result\n",
        also=('            conn.execute("INSERT INTO steps VALUES (?, ?, ?)"',
              '            conn.execute("INSERT OR IGNORE INTO runs (run_id, task, email, status, current_step) "\n'
              "                         \"VALUES (?, ?, ?, 'running', ?)\",\n"
              "                         (inputs.run_id, inputs.task, inputs.email, name))\n"
              '            conn.execute("INSERT INTO steps VALUES (?, ?, ?)"'),
        message=("(killed as draft began, no result yet recorded before)", "create the run's row",
                 "TODO 1 (exercise 1)")),
    WrongAnswer(
        "records the intent after sending, not before", 2, 2,
        old=INTENT + '        say(f"step {name} started: run {inputs.run_id}")\n' + CALL,
        new='        say(f"step {name} started: run {inputs.run_id}")\n' + CALL
            + "        if name in EFFECTS:\n" + INTENT.replace("            ", "            ", 1),
        message=("records the intent only after the request went out", "TODO 4 (exercise 2)")),
    WrongAnswer(
        "a random key per attempt", 3, 3,
        old="            key = idempotency_key(inputs.run_id, name)\n",
        new="            key = random_key(inputs.run_id, name)\n",
        message=("the provider applied the confirmation email 2 times", "resume sent a different key",
                 "build the key from the run id and the step name", "TODO 3 (exercise 2)")),
    WrongAnswer(
        "resume runs the whole flow again (stable keys: one email, two drafts)", 3, 3,
        old="        await run_steps(conn, inputs, results, deps, start_at=current_step)\n",
        new="        await run_steps(conn, inputs, {}, deps)\n",
        message=("resume ran draft again", "although the record holds its result", "draft calls at the model 1 -> 2",
                 "TODO 6 (exercise 3)")),
    WrongAnswer(
        "resume drafts again instead of reading the recorded draft (a different body)", 3, 3,
        old="    deps = make_deps()\n    try:\n        await run_steps(",
        new="    deps = make_deps()\n"
            "    results['draft'] = asdict(await flow.draft(draft_request(inputs, results), deps))  # no effect: redo\n"
            "    try:\n        await run_steps(",
        message=("resume sent a request not built from the record", "is not the recorded draft's",
                 "TODO 5 (exercise 3)")),
    WrongAnswer(
        "resume starts over at draft, the recorded results overwritten", 3, 3,
        old="        await run_steps(conn, inputs, results, deps, start_at=current_step)\n",
        new="        await run_steps(conn, inputs, results, deps)\n",
        also=('"INSERT INTO steps VALUES', '"INSERT OR REPLACE INTO steps VALUES'),
        message=("the model wrote 2 drafts for run", "which needed one: the resume ran draft again",
                 "(Draft 2 of the grader", "(Draft 1 of the grader", "TODO 6 (exercise 3)")),
    WrongAnswer(
        "resume continues one step past the recorded one", 3, 3, exit=3,
        old="        await run_steps(conn, inputs, results, deps, start_at=current_step)\n",
        new="        after = NAMES[min(NAMES.index(current_step) + 1, len(NAMES) - 1)]  # the step after the last one\n"
            "        await run_steps(conn, inputs, results, deps, start_at=after)\n",
        message=("died looking up the result of draft (KeyError: 'draft'): resume did not start at current_step",
                 "TODO 6 (exercise 3)", "Traceback (most recent call last)")),
    WrongAnswer(
        "resume runs a completed run again", 3, 3,
        old='    if status != "running":\n'
            '        say(f"run {run_id} is {status}: nothing to resume")\n        return 0\n',
        new="",
        also=("start_at=current_step)", 'start_at=current_step or "draft")'),
        message=("already completed, ran it again", "a completed run has no current step", "TODO 5 (exercise 3)")),
    # exercise 4: the memory's rule, and its place in the flow
    WrongAnswer(
        "a tool result is a block of its own (a round split)", 4, 4, file="bounded_memory.py",
        old='        elif message.role == "tool":\n            if message.tool_call_id in self.dropped_calls:',
        new="        elif False:\n            if message.tool_call_id in self.dropped_calls:",
        message=("a tool call and its results were split", "TODO 7 (exercise 4) in bounded_memory.py")),
    WrongAnswer(
        "evicts everything older for a message too large to keep", 4, 4, file="bounded_memory.py",
        old="        if sum(self.count(m) for m in block) > room:  # too large to keep on its own\n",
        new="        if False:\n",
        message=("was evicted for a block too large to keep", "nothing older goes for it",
                 "TODO 8 (exercise 4) in bounded_memory.py")),
    WrongAnswer(
        "evicts the newest block first", 4, 4, file="bounded_memory.py",
        old="            oldest = self.blocks.pop(0)\n", new="            oldest = self.blocks.pop()\n",
        message=("but a newer block went", "whole blocks evicted oldest first",
                 "TODO 8 (exercise 4) in bounded_memory.py")),
    WrongAnswer(
        "a late result of an evicted round kept on its own", 4, 4, file="bounded_memory.py",
        old="            if message.tool_call_id in self.dropped_calls:\n                return [message.id]\n",
        new="            if message.tool_call_id in self.dropped_calls:\n"
            "                self.blocks.append([message])  # its call is gone: it stands alone\n"
            "                return []\n",
        message=("had already been evicted: a result kept without its call", "evicted on arrival",
                 "TODO 7 (exercise 4) in bounded_memory.py")),
    WrongAnswer(
        "a larger system message replaces the first and evicts nothing", 4, 4, file="bounded_memory.py",
        old="            self.system = message\n"
            "            block: list[Message] = []  # in no block: it is never evicted\n",
        new="            self.system = message\n            return evicted\n",
        message=("a larger system message replacing sys", "a pinned message evicts the rest down to the budget",
                 "TODO 8 (exercise 4) in bounded_memory.py")),
    WrongAnswer(
        "a pinned message as large as the budget accepted", 4, 4, file="bounded_memory.py",
        old="        if message.pinned and self.count(message) >= self.max_tokens:",
        new="        if message.pinned and self.count(message) > self.max_tokens:",
        message=("which leaves no room under the budget of 300, was accepted", "refused with ValueError",
                 "TODO 7 (exercise 4) in bounded_memory.py")),
    WrongAnswer(
        "builds on the lab's finished window", 4, 4, file="bounded_memory.py",
        old="from durable_agents.memory.messages import Message\n",
        new="from durable_agents.memory import InMemoryStore, MemoryPolicy  # noqa: F401\n"
            "from durable_agents.memory.messages import Message\n",
        message=("uses `InMemoryStore` from durable_agents.memory.stores", "asks you to write the window yourself",
                 "import Message and ToolCall from durable_agents.memory.messages")),
    WrongAnswer(
        "memory is kept but never feeds the prompt", 4, 4,
        old="    deps.context, deps.remember = bounded_memory.context, bounded_memory.remember\n",
        new="    deps.remember = bounded_memory.remember\n",
        message=("was not given the customer's earlier exchange", "TODO 9 (exercise 4) in flow.py")),
    WrongAnswer(
        "the run's exchange is never remembered", 4, 4,
        old="    await flow.remember_exchange(remember_request(inputs, results), deps)\n", new="",
        message=("its exchange is not in the customer's memory", "TODO 10 (exercise 4) in flow.py")),
    # exercise 5: every retry bounded, the failure terminal
    WrongAnswer(
        "retries a permanent error", 5, 5,
        old="        except TransientError as err:", new="        except StepError as err:",
        message=("a permanent error was retried", "TODO 12 (exercise 5)")),
    WrongAnswer(
        "gives up at the first 503", 5, 5,
        old="            return await step(request, deps)\n        except TransientError as err:",
        new="            return await step(request, deps)\n        except ZeroDivisionError as err:",
        message=("failed after two 503s that a retry would have ridden out", "TODO 12 (exercise 5)")),
    WrongAnswer(
        "retries forever", 5, 5,
        old="            if time.monotonic() - began + delay > budget:\n", new="            if False:\n",
        message=(f"was still running after {BUDGET_SECONDS + SETTLE_SECONDS:.0f} s (killed)",
                 "a retry must stop when its budget is spent", "TODO 12 (exercise 5)")),
    WrongAnswer(
        "counts tries instead of timing them (three tries)", 5, 5,
        old="            if time.monotonic() - began + delay > budget:\n", new="            if delay > 0.5:\n",
        message=("stopped retrying the 503s 0.", "the budget is time, not a number of tries",
                 "TODO 12 (exercise 5)")),
    WrongAnswer(
        "counts tries instead of timing them (five: past a short budget)", 5, 5,
        old="            if time.monotonic() - began + delay > budget:\n", new="            if delay > 2.0:\n",
        message=("sent a request 3.", "s after its first one, past its 2 s budget", "checked before each pause",
                 "TODO 12 (exercise 5)")),
    WrongAnswer(
        "the failed run's error is the step's own message (the step unnamed)", 5, 5,
        old='(f"step {name} failed: {err}", inputs.run_id)', new="(str(err), inputs.run_id)",
        message=("does not say which step failed", "its name inside an idempotency key does not count",
                 "TODO 11 (exercise 5)")),
    WrongAnswer(
        "counts a crash as an error (three attempts at most)", 5, 5,
        old="        try:\n            results[name] = asdict(await call_step(",
        new="        try:\n            if name in EFFECTS and attempts >= 3:  # three tries are enough\n"
            '                raise PermanentError(f"gave up after {attempts} attempts")\n'
            "            results[name] = asdict(await call_step(",
        message=("killed right after the provider took its email three times in a row, resumed after each kill",
                 "resume 3, the one left to finish, exited 1", "the run is failed, not completed",
                 "a crash spends no retry budget", "TODO 12 (exercise 5)")),
    WrongAnswer(
        "counts a crash as an error (two attempts at most)", 5, 5,
        old="        try:\n            results[name] = asdict(await call_step(",
        new="        try:\n            if name in EFFECTS and attempts >= 2:  # a second failure ends it\n"
            '                raise PermanentError(f"gave up after {attempts} attempts")\n'
            "            results[name] = asdict(await call_step(",
        message=("killed right after the provider took its email 2 time(s) of the check's three",
                 "resume 2 (where kill 3 was armed) exited 1 before the email went out again",
                 "the run is failed, not completed", "TODO 12 (exercise 5)")),
    WrongAnswer(
        "five tries half a second apart, failing with 'retry budget of 2 s spent'", 5, 5,
        old="            if time.monotonic() - began + delay > budget:\n"
            '                raise PermanentError(f"retry budget of {budget:g} s spent; last error: {err}") from None\n'
            '            say(f"step {name}: {err}; trying again in {delay:.1f} s")\n'
            "            await asyncio.sleep(delay)\n",
        new="            if delay > 1.6:  # five tries: two seconds\n"
            '                raise PermanentError(f"retry budget of 2 s spent; last error: {err}") from None\n'
            '            say(f"step {name}: {err}; trying again in 0.5 s")\n'
            "            await asyncio.sleep(0.5)\n",
        message=("s after its first request, well within its 7 s budget", "the budget is time, not a number of tries",
                 "requests for at least 3.25 s", "TODO 12 (exercise 5)")),
    WrongAnswer(
        "the spent budget's error names another budget", 5, 5,
        old='raise PermanentError(f"retry budget of {budget:g} s spent; last error: {err}")',
        new='raise PermanentError(f"retry budget of 900 s spent; last error: {err}")',
        message=("spent a retry budget of 2 s, but its error does not give those seconds",
                 "retry budget of 900 s spent",
                 "TODO 12 (exercise 5)")),
    WrongAnswer(
        "the failed state recorded, the run stopped quietly (exit 0)", 5, 5,
        old='            raise RunFailed(f"run {inputs.run_id} failed at step {name}: {err}") from None\n',
        new="            return  # the run is over: failed, recorded\n",
        message=("was recorded failed after a hard bounce, but the process exited 0",
                 "exit 1: a run that ended failed says so", "TODO 11 (exercise 5)")),
    WrongAnswer(
        "the failed run's current step cleared", 5, 5,
        old="\"UPDATE runs SET status = 'failed', error = ? WHERE run_id = ?\"",
        new="\"UPDATE runs SET status = 'failed', error = ?, current_step = NULL WHERE run_id = ?\"",
        message=("names send_confirmation, but its record says it is at step None",
                 "a failed run stays at the step that failed", "TODO 11 (exercise 5)")),
    # exercise 6: the activities
    WrongAnswer(
        "a new key on every attempt of the activity", 6, 6, file="agent_activities.py",
        old="        return await flow.send_confirmation(request, self.deps)\n",
        new='        key = f"{request.idempotency_key}/attempt-{activity.info().attempt}"  # unique per attempt\n'
            "        return await flow.send_confirmation(SendRequest(**{**vars(request), 'idempotency_key': key}),"
            " self.deps)\n",
        message=("applied the confirmation email 2 times", "sent a different key",
                 "TODO 14 (exercise 6) in agent_activities.py")),
    WrongAnswer(
        "the workflow runs the effects as activities that nothing defines (TODO 13 without 14)", 6, 6,
        file="agent_activities.py",
        old='    @activity.defn(name="send_confirmation")\n', new='    @activity.defn(name="send_email")\n',
        message=("the workflow runs an activity named send_confirmation, and the worker has none by that name",
                 "TODO 14 (exercise 6) in agent_activities.py")),
    WrongAnswer(
        "a ten-minute start-to-close timeout: the killed attempt waits", 6, 6, file="agent_workflow.py",
        old="STEP_TIMEOUT = timedelta(seconds=5)\n", new="STEP_TIMEOUT = timedelta(minutes=10)  # plenty\n",
        message=("it is waiting for the timeout of activity", "start-to-close timeout of 600 s",
                 "TODO 13 (exercise 6) in agent_workflow.py")),
    WrongAnswer(
        "no retries: a killed worker's attempt is never tried again", 6, 6, file="agent_workflow.py",
        old="                      maximum_attempts=10,", new="                      maximum_attempts=1,",
        message=("did not complete after its workers were killed: it is failed", "TODO 13 (exercise 6)")),
    # exercise 7: the agent loop
    WrongAnswer(
        "a tool call's key from the attempt", 7, 7, file="agent_loop.py",
        old='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{index}-{digest}"\n',
        new='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{index}-{digest}-{os.getpid()}"  # per attempt\n',
        message=("reached the provider under another key than the one its result is recorded with",
                 "TODO 17 (exercise 7) in agent_loop.py")),
    WrongAnswer(
        "resume reads the results but not the turns: a turn asked again", 7, 7, file="agent_loop.py",
        old="    turns = {n: turn_from_json(answer) for n, answer in\n"
            '             conn.execute("SELECT turn, answer FROM turns WHERE run_id = ?", (run_id,))}\n',
        new="    turns: Turns = {}  # the results say what was done\n",
        message=("asked the model for turn 1 again, although the record held it", "TODO 19 (exercise 7)",
                 "TODO 18 (exercise 7)")),
    WrongAnswer(
        "a turn recorded once its calls ran", 7, 7, file="agent_loop.py",
        old="            record_turn(conn, inputs.run_id, answer)\n            turns[n] = answer\n",
        new="            turns[n] = answer\n",
        message=("a tool call ran before its turn was recorded", "the record holds no turn 2",
                 "TODO 19 (exercise 7)"),
        also=("            record_result(conn, inputs.run_id, key, results[(n, index)])\n",
              "            record_result(conn, inputs.run_id, key, results[(n, index)])\n"
              '        if not conn.execute("SELECT 1 FROM turns WHERE run_id = ? AND turn = ?", (inputs.run_id, n))'
              ".fetchone():\n"
              "            record_turn(conn, inputs.run_id, turns[n])  # the turn, once its calls are done\n")),
    WrongAnswer(
        "a key from the run and the call, without the turn", 7, 7, file="agent_loop.py",
        old='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{index}-{digest}"\n',
        new='    return f"{KEY_PREFIX}/{run_id}/call-{index}-{digest}"  # the run and the call\n',
        message=("turn 1's call 0 (lookup_order) and turn 2's call 0 (issue_refund)", "were sent under one key",
                 "TODO 17 (exercise 7) in agent_loop.py")),
    WrongAnswer(
        "the model's call id trusted raw in the key", 7, 7, file="agent_loop.py",
        old='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{index}-{digest}"\n',
        new='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{index}-{call_id}"\n',
        message=("the model's call id went into it as the model wrote it", "'call 1'",
                 "TODO 17 (exercise 7) in agent_loop.py")),
    WrongAnswer(
        "a key from the run, the turn and the call's id, without the call's place", 7, 7, file="agent_loop.py",
        old='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{index}-{digest}"\n',
        new='    return f"{KEY_PREFIX}/{run_id}/turn-{turn}/call-{digest}"\n',
        message=("under one key: the provider refused the second (409 idempotency_conflict",
                 "TODO 17 (exercise 7) in agent_loop.py")),
    WrongAnswer(
        "resume runs every call of the last turn again", 7, 7, file="agent_loop.py",
        old="            if (n, index) in results:\n                continue\n", new="",
        message=("ran turn 2's call 0 (issue_refund) again, although the record held its result",
                 "TODO 19 (exercise 7)")),
    WrongAnswer(  # the skeleton's loop kept on resume: the turns after it look like a changed key, and are not
        "resume asks the turn after the last recorded one, that turn's unfinished calls skipped", 7, 7,
        file="agent_loop.py",
        old="        if n == 0 or all((n, i) in results for i in range(len(turns[n].calls))):\n",
        new="        if True:  # the last recorded turn is done: ask the next\n",
        message=("turn 2's call 0 (issue_refund) of run", "was skipped", "the record holds turn 3",
                 "TODO 19 (exercise 7) in agent_loop.py"),
        never=("TODO 17",)),
    WrongAnswer(
        "resume asks the next turn once the last one's first call has a result", 7, 7, file="agent_loop.py",
        old="        if n == 0 or all((n, i) in results for i in range(len(turns[n].calls))):\n",
        new="        if n == 0 or not turns[n].calls or (n, 0) in results:  # its first call ran: the turn is done\n",
        message=("turn 2's call 1 (send_email) of run", "was skipped", "without sending it",
                 "TODO 19 (exercise 7) in agent_loop.py"),
        never=("TODO 16", "TODO 17")),
]



def test_each_wrong_answer_has_a_message_of_its_own():
    assert len({w.message for w in WRONG_ANSWERS}) == len(WRONG_ANSWERS)
    firsts = {n: FIRST_MESSAGE[n][0] for n in FIRST_MESSAGE}
    for wrong in WRONG_ANSWERS:
        assert firsts[wrong.check] not in wrong.message, wrong.name


@pytest.mark.parametrize("wrong", WRONG_ANSWERS, ids=[w.name for w in WRONG_ANSWERS])
def test_a_wrong_answer_fails_with_its_own_message(wrong, tmp_path):
    for path in (FOLDERS[wrong.exercise] / "solution").glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    solution = (tmp_path / wrong.file).read_text()
    assert solution.count(wrong.old) == 1, f"{wrong.name}: the solution no longer has the code this answer changes"
    changed = solution.replace(wrong.old, wrong.new)
    if wrong.also:
        assert changed.count(wrong.also[0]) == 1, f"{wrong.name}: the solution no longer has the code it moves"
        changed = changed.replace(*wrong.also)
    (tmp_path / wrong.file).write_text(changed)
    done = grade(wrong.exercise, tmp_path, "--only", str(wrong.check))
    assert done.returncode == wrong.exit, done.stdout
    for needle in wrong.message:
        assert needle in done.stdout, f"{wrong.name}: expected {needle!r} in:\n{done.stdout}"
    for needle in wrong.never:
        assert needle not in done.stdout, f"{wrong.name}: {needle!r} is not this answer's mistake:\n{done.stdout}"


# A right answer written another way passes: the grader holds the README's contract, not the solution's code.
RIGHT_ANSWERS = [
    WrongAnswer(  # the README's schedule: pauses from about 0.2 s (at most 0.5 s), doubling
        "a doubling that starts at 0.3 s", 5, 5,
        old="    began, delay = time.monotonic(), 0.2\n", new="    began, delay = time.monotonic(), 0.3\n",
        message=("every check passed",)),
]


@pytest.mark.parametrize("right", RIGHT_ANSWERS, ids=[r.name for r in RIGHT_ANSWERS])
def test_a_right_answer_written_otherwise_passes(right, tmp_path):
    for path in (FOLDERS[right.exercise] / "solution").glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    solution = (tmp_path / right.file).read_text()
    assert solution.count(right.old) == 1, f"{right.name}: the solution no longer has the code this answer changes"
    (tmp_path / right.file).write_text(solution.replace(right.old, right.new))
    done = grade(right.exercise, tmp_path, "--only", str(right.check))
    assert done.returncode == 0, done.stdout
    for needle in right.message:
        assert needle in done.stdout, f"{right.name}: expected {needle!r} in:\n{done.stdout}"


# ---------------------------------------------------------------- the track holds together

TODO_BLOCK = r"^\s*# TODO (\d+) \(exercise (\d+)\).*?^\s*# END TODO \1\n"


def code_lines(path: Path) -> tuple[list[str], list[tuple[int, int, int, int]]]:
    """The file's lines after its module docstring, imports and blank lines left out, and its TODO blocks as
    (number, exercise, first line, last line) over those lines."""
    import ast
    import re

    text = path.read_text()
    body = ast.parse(text).body
    start = body[1].lineno - 1 if ast.get_docstring(ast.parse(text)) else 0
    lines = [line for line in text.splitlines(keepends=True)[start:]
             if line.strip() and not line.lstrip().startswith(("import ", "from "))]
    joined = "".join(lines)
    blocks = []
    for match in re.finditer(TODO_BLOCK, joined, re.M | re.S):
        first = joined.count("\n", 0, match.start())
        blocks.append((int(match[1]), int(match[2]), first, first + match[0].count("\n") - 1))
    return lines, blocks


def differences_outside_todos(a: Path, practice: Path) -> list[str]:
    """Lines where ``a`` and ``practice`` differ outside the practice's TODO blocks."""
    import difflib

    theirs, _ = code_lines(a)
    mine, blocks = code_lines(practice)
    inside = {i for _, _, first, last in blocks for i in range(first, last + 1)}
    out = []
    matcher = difflib.SequenceMatcher(a=theirs, b=mine, autojunk=False)
    for op, a1, a2, b1, b2 in matcher.get_opcodes():
        if op == "equal":
            continue
        touched = set(range(b1, b2)) or {b1, b1 - 1}
        if not touched & inside or (b2 > b1 and not set(range(b1, b2)) <= inside):
            out.append(f"{op} {a.parent.name} lines {a1}-{a2} / practice lines {b1}-{b2}: "
                       f"{''.join(theirs[a1:a2] + mine[b1:b2])[:300]!r}")
    return out


def test_each_practice_is_the_previous_solution_plus_its_todos():
    seen_todos: list[int] = []
    for n in sorted(FOLDERS):
        practice, solution = FOLDERS[n] / "practice", FOLDERS[n] / "solution"
        assert sorted(p.name for p in practice.glob("*.py")) == sorted(p.name for p in solution.glob("*.py"))
        todos = []
        for path in sorted(practice.glob("*.py")):
            _, blocks = code_lines(path)
            assert {exercise for _, exercise, _, _ in blocks} <= {n}, f"{path}: a TODO names another exercise"
            # A TODO may take several blocks of one file (TODO 1: what a COMMIT promises, in open_record, and the
            # run's row, in start): its number counts once, and its blocks stay in that file.
            numbers = sorted({number for number, _, _, _ in blocks})
            assert not set(numbers) & set(todos), f"{path}: a TODO's blocks are spread over files"
            todos += numbers
            # The solution answers exactly the TODOs: outside them, it is the practice.
            assert differences_outside_todos(solution / path.name, path) == [], path
            assert "# TODO" not in (solution / path.name).read_text(), solution / path.name
            before = FOLDERS[n - 1] / "solution" / path.name if n - 1 in FOLDERS else None
            if n in RECORD_TRACK and before is not None and before.exists():
                # ... and the practice starts from the solution before it.
                assert differences_outside_todos(before, path) == [], path
        assert todos, f"exercise {n}'s practice has no TODO block"
        seen_todos += sorted(todos)
    assert seen_todos == list(range(1, len(seen_todos) + 1)), "TODOs are numbered 1, 2, ... through the track"


def test_the_graders_registries_come_from_the_exercises_and_the_check_modules():
    """Each TODO's exercise and file are read from the practice files (grader.todos), and every exercise
    folder has a check whose main file both its practice and its solution hold (grader.registry): a new
    exercise is one folder and one check module, with no list to extend by hand."""
    from grader.registry import CHECKS
    from grader.todos import todo, todo_places

    places = todo_places()
    assert sorted(places) == list(range(1, len(places) + 1)), places
    for n, (exercise, file) in places.items():
        assert f"# TODO {n} (exercise {exercise})" in (FOLDERS[exercise] / "practice" / file).read_text(), n
    assert todo(17, "x") == "TODO 17 (exercise 7) in agent_loop.py: x"
    assert sorted(CHECKS) == sorted(FOLDERS)
    for n, check in CHECKS.items():
        assert check.number == n and check.seconds > 0, n
        for impl in ("practice", "solution"):
            assert (FOLDERS[n] / impl / check.main_file).is_file(), (n, impl, check.main_file)
    assert [n for n, c in CHECKS.items() if c.stands_alone] == list(STANDS_ALONE)


def test_the_exercises_never_import_the_finished_engines():
    import ast

    finished = ("durable_agents.runrecord", "durable_agents.memory.window", "durable_agents.memory.stores",
                "durable_agents.memory.sqlite_store", "durable_agents.memory.reader")
    for path in EXERCISES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.startswith(finished) or n == "memory"], (path, names)


# ---------------------------------------------------------------- exit codes, hangs, cleanup


def test_bad_input_is_exit_2_and_says_what_to_give(tmp_path):
    cases = [
        (["9"], "give the number of an exercise the grader checks"),
        (["one"], "give the number of an exercise"),
        (["2", "--impl", str(tmp_path)], "no flow.py there. Give the folder that holds your flow.py"),
        (["2", "--only", "3"], "--only 3: give a check between 1 and 2"),
    ]
    for args, needle in cases:
        done = subprocess.run([sys.executable, "-m", "grader.grade", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and needle in done.stderr, (args, done.stdout + done.stderr)


def test_a_program_that_raises_is_exit_3_with_its_own_frames(tmp_path):
    solution = (FOLDERS[3] / "solution" / "flow.py").read_text()
    broken = solution.replace("SELECT name, result FROM steps", "SELECT name, reslt FROM steps")  # a typo
    assert broken != solution
    (tmp_path / "flow.py").write_text(broken)
    done = grade(3, tmp_path, "--only", "3")
    assert done.returncode == 3, done.stdout
    assert "your program could not run" in done.stdout and "no such column: reslt" in done.stdout, done.stdout
    frames = [line for line in done.stdout.splitlines() if line.strip().startswith('File "')]
    assert frames and all(str(tmp_path) in line for line in frames), done.stdout  # trimmed to the learner's file


def test_a_hang_fails_the_check_that_hung_and_nothing_is_left_running(tmp_path):
    solution = (FOLDERS[3] / "solution" / "flow.py").read_text()
    old = '    say(f"resuming run {run_id} at step {current_step}'
    assert solution.count(old) == 1
    (tmp_path / "flow.py").write_text(solution.replace(old, "    await asyncio.sleep(3600)\n" + old))
    done = subprocess.run([sys.executable, "-m", "grader.grade", "3", "--impl", str(tmp_path), "--only", "3",
                           "--keep"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GRADER_PROCESS_SECONDS": "4"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "check 3: resume by run id" in done.stdout and "was still running after 4 s (killed)" in done.stdout
    work = done.stdout.split("(work folder kept: ")[1].split(")")[0]
    try:
        assert processes_of(work) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def processes_of(work: str) -> list[str]:
    """Processes started in the grader's work folder or naming it: the learner's, the provider's."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if cwd.startswith(work) or work in cmdline:
            found.append(f"{proc.name} {cmdline}")
    return found


def test_a_grader_stopped_midway_leaves_nothing_running():
    """SIGTERM while a learner's process is running: the grader's finally blocks stop it and the provider."""
    proc = subprocess.Popen([sys.executable, "-m", "grader.grade", "3", "--impl", "solution", "--only", "3", "--keep"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    work = ""
    try:
        deadline = time.monotonic() + 60
        while "(work folder: " not in (line := proc.stdout.readline()):  # type: ignore[union-attr]
            assert line and time.monotonic() < deadline, "the grader never said its work folder"
        work = line.split("(work folder: ")[1].split(",")[0]
        while not any("grader.launch" in p for p in processes_of(work)):
            assert proc.poll() is None and time.monotonic() < deadline, "no learner process ever ran"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, rest
    assert f"(work folder kept: {work})" in rest, rest
    try:
        assert processes_of(work) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the bootstrap's commit count


def test_a_process_that_ends_by_itself_writes_how_many_commits_it_made(tmp_path):
    """grader.launch's GRADER_COMMITS_FILE: what check 1 schedules its kills by, written on a normal end and on
    sys.exit; schema statements and reads are not commits."""
    program = tmp_path / "flow.py"
    program.write_text(
        "import sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1])\n"
        "conn.execute('CREATE TABLE t (x)')\n"
        "with conn:\n    conn.execute('INSERT INTO t VALUES (1)')\n"
        "conn.execute('INSERT INTO t VALUES (2)'); conn.commit()\n"
        "conn.execute('SELECT * FROM t').fetchall()\n"
        "sys.exit(int(sys.argv[2]))\n")
    for code in (0, 3):
        counted = tmp_path / f"commits-{code}"
        done = subprocess.run([sys.executable, "-m", "grader.launch", str(program), str(tmp_path / f"{code}.db"),
                               str(code)], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "GRADER_COMMITS_FILE": str(counted)})
        assert done.returncode == code, done.stderr
        assert counted.read_text() == "2", (code, done.stderr)


# ---------------------------------------------------------------- exercise 6 by hand


def test_exercise_6s_starter_says_a_failed_run_failed_in_one_line(dev_server, provider, task_queue):
    """The README's by-hand path, with a run that fails (the provider's hard bounce): the starter prints the
    cause where the result would be and exits 1, the first time and when the same run id is started again."""
    from lab.processes import Proc

    folder = FOLDERS[6] / "solution"
    env = {"TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue, "PROVIDER_URL": provider.url,
           "MEMORY_DB": "off"}
    worker = Proc("ex6-worker", [sys.executable, str(folder / "worker.py")], env=env, cwd=folder)
    try:
        worker.wait_for_line("worker ready", timeout=60)
        run_id = f"ex6-bounce-{os.getpid()}"
        starts = [subprocess.run([sys.executable, str(folder / "starter.py"), run_id, "Confirm the refund",
                                  "--email", "nobody@mailbox.invalid"], cwd=folder, capture_output=True, text=True,
                                 timeout=60, env={**os.environ, **env}) for _ in range(2)]
    finally:
        worker.kill()
    for done, first in zip(starts, ("started, or already running", "has ended already:"), strict=True):
        assert done.returncode == 1, done.stdout + done.stderr
        assert first in done.stdout and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
        assert f"run {run_id} failed: PermanentError: the provider refused to send the email" in done.stdout
        assert "start a new run id" in done.stdout, done.stdout
