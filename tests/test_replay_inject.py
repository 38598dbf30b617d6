"""LAB.md's "break determinism" exercise: what a learner injects with
``python -m lesson.replay HISTORY --inject CODE`` meets the sandbox's refusal,
written the way they would write it (``time.time()`` for a wall-clock read),
not a NameError for a module the copy of the workflow did not import; a line
that fails on its own says so, and which names it may use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from temporalio.client import WorkflowHistory

from lab.processes import REPO
from lesson.replay import INJECT_MODULES, replay

HISTORY = REPO / "tests" / "data" / "histories" / "6ad4721c745f" / "completed.json"


def lesson_replay(inject: str) -> subprocess.CompletedProcess:
    """The learner's command, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "lesson.replay", str(HISTORY.relative_to(REPO)), "--inject", inject],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.process
def test_a_wall_clock_read_as_a_learner_writes_it_is_refused_by_the_sandbox():
    done = lesson_replay("time.time()")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REFUSED by the sandbox" in done.stdout and "Cannot access time.time" in done.stdout, done.stdout
    assert "is not defined" not in done.stdout


@pytest.mark.parametrize("code", ["datetime.datetime.now()", "time.monotonic()", "uuid.uuid4()", "os.urandom(4)",
                                  "secrets.token_hex()", "os.getenv('HOME')", "socket.gethostname()"])
async def test_each_natural_name_reaches_the_sandbox(code: str):
    history = WorkflowHistory.from_json(HISTORY.stem, json.loads(HISTORY.read_text()))
    line = await replay(history, code)
    called = code.split("(")[0]
    assert line.startswith("REFUSED by the sandbox") and f"Cannot access {called}" in line, line


@pytest.mark.process
def test_a_line_that_fails_on_its_own_says_so_and_names_what_it_may_use():
    done = lesson_replay("numpy.random.rand()")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the injected line 'numpy.random.rand()' failed by itself" in done.stdout, done.stdout
    assert "name 'numpy' is not defined" in done.stdout and "before the sandbox judged it" in done.stdout
    assert f"It may use {', '.join(INJECT_MODULES)}" in done.stdout
