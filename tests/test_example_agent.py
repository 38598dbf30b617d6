"""The example agent from outside the lab (examples/scheduler): ``make example`` passes, and docs/your-agent.md
shows its 40 lines as they are (so what the page shows is what that run ran)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from lab.processes import REPO

AGENT = REPO / "examples" / "scheduler" / "agent.py"
PAGE = REPO / "docs" / "your-agent.md"


@pytest.mark.fast
def test_the_page_shows_the_agent_as_it_is_in_at_most_40_lines():
    shown = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert shown is not None, "docs/your-agent.md shows no python block"
    code = AGENT.read_text()
    assert shown.group(1) == code, "docs/your-agent.md's first python block is not examples/scheduler/agent.py"
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 40, len(lines)
    assert "steps" not in code and "lab" not in re.findall(r"^from (\w+)", code, re.M)  # the adapter alone


@pytest.mark.process
def test_make_example_kills_the_agent_after_a_booking_and_each_effect_applies_once():
    done = subprocess.run([sys.executable, "-m", "lab.scheduler_demo"], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASS")]
    assert len(passed) == 8 and "FAIL" not in done.stdout, done.stdout
    # The killed booking, on each engine: looked up by its retry, not sent again; the invite sent once.
    assert done.stdout.count("applied 1, requests 1, lookups 1") == 2, done.stdout
    assert done.stdout.count("applied 1, requests 1, lookups 0") == 2, done.stdout
