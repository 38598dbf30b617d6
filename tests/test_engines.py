"""The lab's engine drivers (``lab.engines``) and what they stand on: the line every engine prints as a
step begins, written and read in one place (``durable_agents.steps.startedline``), and ``Proc.wait``.

The lessons and lab tools drive all four engines through these drivers (tests/test_lesson.py plays the
scenario on each, tests/test_power_cut.py the power cuts); here, the interface itself, on the two engines
that need no server: a run killed at its crash point, its status, the resume and what it executed."""

from __future__ import annotations

import re
import sys

import pytest

from durable_agents.steps.plan import STEP_NAMES
from durable_agents.steps.startedline import Started, parse_started, started_in, started_line
from lab.engines import EngineError, InMemoryDriver, RunRecordDriver, started_steps
from lab.processes import REPO, Proc, ProcessTimeout
from tests.support import EMAIL, TASK


def test_the_started_line_reads_back_as_it_was_written():
    line = started_line("send_confirmation", "order-1234", 2)
    assert line == "step send_confirmation started: run order-1234 attempt 2"
    assert parse_started(line) == Started("send_confirmation", "order-1234", 2)
    # As a worker logs it: behind the record's time, level and logger.
    assert parse_started(f"12:00:01 INFO activities: {line}") == Started("send_confirmation", "order-1234", 2)
    for other in ("step send_confirmation completed: run order-1234 attempt 2", "12:00:01 draft: completed (attempt 1)",
                  "substep draft started: run r-1 attempt 1", "step draft started: run  attempt 1", ""):
        assert parse_started(other) is None, other
    text = "\n".join([started_line("draft", "a", 1), "noise", started_line("draft", "b", 1),
                      started_line("send", "a", 3)])
    assert [(s.step, s.run_id) for s in started_in(text)] == [("draft", "a"), ("draft", "b"), ("send", "a")]


def test_the_exercises_literal_started_lines_read_as_the_engines_do():
    """A learner's file prints the words itself (it imports nothing of the finished engines); whatever reads
    them reads them with the same parser, so the two must not drift apart."""
    files = sorted(REPO.glob("exercises/*/*/flow.py"))
    assert files
    for path in files:
        said = re.findall(r'say\(f"(step \{name\} started: [^"]*)"\)', path.read_text())
        assert said, f"{path} prints no started line"
        for template in said:
            line = template.replace("{name}", "draft").replace("{inputs.run_id}", "lab-1")
            assert parse_started(line) == Started("draft", "lab-1", None), (path, line)


@pytest.mark.process
def test_proc_wait_gives_the_exit_code_with_every_line_read_and_a_timeout_names_what_it_printed_last():
    talker = Proc("talker", [sys.executable, "-c", "print('\\n'.join(map(str, range(500)))); raise SystemExit(3)"])
    assert talker.wait(30) == 3
    assert talker.output().splitlines()[-1] == "499"  # read to the end before wait returned
    sleeper = Proc("sleeper", [sys.executable, "-c", "print('waiting here', flush=True); import time; time.sleep(60)"])
    try:
        sleeper.wait_for_line("waiting here", timeout=30)
        with pytest.raises(ProcessTimeout, match=r"(?s)sleeper \(pid \d+\) still running after 0.2 s.*waiting here"):
            sleeper.wait(0.2)
        assert sleeper.alive()  # a timeout leaves it to the caller
    finally:
        sleeper.kill()


async def test_the_run_record_driver_kills_reads_and_resumes_a_run(provider, tmp_path):
    env = {"PROVIDER_URL": provider.url, "RUNRECORD_DB": str(tmp_path / "runrecord.db"),
           "MEMORY_DB": str(tmp_path / "memory.db")}
    with RunRecordDriver(env, timeout=90) as record:
        first = await record.start("drv-rec-1", TASK, EMAIL, crash_at="runrecord:send_confirmation:after_record")
        await record.killed(first)
        assert started_steps(first) == ["draft", "send_confirmation"]
        before = await record.status("drv-rec-1")
        assert before is not None and before["status"] == "running", before
        assert [s["name"] for s in before["steps"] if s["status"] == "completed"] == ["draft", "send_confirmation"]

        resumed = await record.resume("drv-rec-1")
        assert resumed.code == 0, resumed.proc.output()
        assert started_steps(resumed.proc) == ["record_outcome"]
        assert resumed.status is not None and resumed.status["status"] == "completed", resumed.status
        assert "read the record of run drv-rec-1" in record.how_it_knew(resumed.proc)
        assert await record.status("drv-no-such-run") is None

        # A process that was to die at its crash point and did not: said, with what it printed.
        with pytest.raises(EngineError, match="was to die by SIGKILL at its crash point but exited with 0"):
            await record.killed(await record.start("drv-rec-2", TASK, EMAIL))
        assert record.processes() == []


async def test_the_in_memory_driver_restarts_the_same_command_and_holds_no_record(provider):
    with InMemoryDriver({"PROVIDER_URL": provider.url}, timeout=90) as before:
        first = await before.start("drv-mem-1", TASK, EMAIL, crash_at="in_memory:after_send_confirmation")
        await before.killed(first)
        assert await before.status("drv-mem-1") is None  # nothing recorded: nothing to read
        resumed = await before.resume("drv-mem-1")
        assert (resumed.code, resumed.status) == (0, None), resumed.proc.output()
        assert started_steps(resumed.proc) == list(STEP_NAMES)  # it starts over
        with pytest.raises(EngineError, match="not started by this driver"):
            await before.resume("drv-mem-unknown")
