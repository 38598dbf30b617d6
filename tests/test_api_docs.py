"""The adapter's API reference is generated from its docstrings (pdoc, ``make api-docs``) without a warning,
and documents every name the namespace exports."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

import durable_agents
from lab.processes import REPO

pytestmark = pytest.mark.process


def api_modules() -> list[str]:
    """``API_MODULES`` as the Makefile gives it to pdoc: the one list."""
    makefile = (REPO / "Makefile").read_text()
    found = re.search(r"^API_MODULES := ((?:.*\\\n)*.*)$", makefile, re.M)
    assert found, "the Makefile has no API_MODULES"
    return shlex.split(found[1].replace("\\\n", " "))


def test_the_reference_builds_without_a_warning_and_names_every_export(tmp_path):
    modules = api_modules()
    assert modules[0] == "durable_agents" and "durable_agents.agent" in modules and "durable_agents.tools" in modules
    done = subprocess.run([sys.executable, "-m", "pdoc", "--output-directory", str(tmp_path), *modules], cwd=REPO,
                          env={**os.environ, "PDOC_ALLOW_EXEC": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    page = (tmp_path / "durable_agents.html").read_text()
    missing = [name for name in durable_agents.__all__ if f'id="{name}"' not in page]
    assert not missing, f"the namespace's page lacks {missing}"
    for module in ("agent", "tools", "flowclient/agents", "runrecord", "dbosflow", "memory", "worker", "starter"):
        assert (tmp_path / "durable_agents" / f"{module}.html").is_file(), module
