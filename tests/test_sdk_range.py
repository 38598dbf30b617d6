"""The adapter declares ``temporalio`` as a range (pyproject.toml), and the engine-facing tests pass at both
ends of it: at the version requirements/dev.lock locks (the rest of the suite) and at the range's lowest, the
release requirements/sdk-floor.in names, which ``make install`` puts in ``.venv/sdk-floor``. Here those tests
run again with that directory first on the path of every process they start (the workers, the CLIs), the rest
of the environment as the lock has it.

Why 1.34.0 is the floor: it is the first release whose ``workflow.info()`` has ``original_execution_run_id``,
which the workflows read (the run's id across resets: the start id, the retry rule's anchor). Below it every
workflow task fails with an ``AttributeError`` (measured on 1.33.0 and 1.28.0); ``SimplePlugin`` itself is
there from 1.19.0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from lab.processes import REPO

FLOOR = Path(sys.prefix) / "sdk-floor"
ENGINE_FACING = ["tests/test_sandbox.py", "tests/test_replay_fixtures.py", "tests/test_workflow_logic.py",
                 "tests/test_loop_temporal.py", "tests/test_own_agent.py", "tests/test_worker_options.py"]
"""The tests that drive the SDK itself: its sandbox, the replay of recorded histories, the flow's and the loop's
workflows on real workers, an agent of a user's served through the plugin."""


def declared_floor() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "temporalio"]
    (low,) = [s.version for s in spec if s.operator == ">="]
    return low


def test_the_floor_installed_is_the_ranges_lower_bound():
    pinned = re.search(r"^temporalio==(\S+)$", (REPO / "requirements" / "sdk-floor.in").read_text(), re.M)
    assert pinned and pinned[1] == declared_floor(), "requirements/sdk-floor.in names the range's lower bound"
    locked = re.search(r"^temporalio==(\S+) ", (REPO / "requirements" / "sdk-floor.lock").read_text(), re.M)
    assert locked and locked[1] == declared_floor(), "run `make lock`"


@pytest.mark.process
@pytest.mark.timeout(900)
def test_the_engine_facing_tests_pass_at_the_lowest_temporalio_of_the_range(tmp_path):
    if not (FLOOR / "temporalio").is_dir():
        pytest.fail(f"no {FLOOR}: `make install` puts the range's lowest temporalio there")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FLOOR), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    seen = subprocess.run([sys.executable, "-c", "import temporalio; print(temporalio.__version__)"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == declared_floor(), seen.stdout + seen.stderr
    # DBOS's cases of the agent's tests drive no temporalio; two workers, as the tests mostly wait on processes.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "-k", "not dbos",
                           "--basetemp", str(tmp_path / "basetemp"), *ENGINE_FACING], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    summary = done.stdout.strip().splitlines()[-1:] or [""]
    assert done.returncode == 0 and " passed" in summary[0], done.stdout[-6000:] + done.stderr[-2000:]
