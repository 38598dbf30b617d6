"""The manual path (docs/commands.md), verbatim: its block of commands, run as a
newcomer would on a fresh clone (in a scratch copy, so nothing lands in this
checkout's .state/): the dev server, the provider and a worker in the
background, then the starter, whose run must complete. `make install` and
`source .venv/bin/activate` are this test's own environment."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab.processes import REPO, port_is_free, wait_for_port

pytestmark = pytest.mark.process

FIXED_PORTS = (7233, 8233, 8780)  # the dev server, its UI, the provider: the manual path uses the defaults
PAGE = REPO / "docs" / "commands.md"


def manual_block() -> list[str]:
    page = PAGE.read_text()
    section = page[page.index("## The manual way"):]
    block = re.search(r"```sh\n(.*?)\n```", section, re.S).group(1)
    commands, pending = [], ""
    for line in block.splitlines():
        line = line.split("  #")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append((pending + line).strip())
        pending = ""
    return commands


def test_the_manual_path_runs_verbatim(tmp_path):
    taken = [p for p in FIXED_PORTS if not port_is_free(p)]
    if taken:
        pytest.fail(f"ports {taken} are taken: docs/commands.md's manual path uses the defaults; stop what holds them")
    commands = manual_block()
    assert commands[:3] == ["make install", "source .venv/bin/activate", "mkdir -p .state"], commands
    clone = tmp_path / "clone"
    clone.mkdir()
    for item in REPO.iterdir():
        if item.name not in (".state", ".git", ".venv"):
            (clone / item.name).symlink_to(item)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONUNBUFFERED": "1"}
    for name in ("TEMPORAL_ADDRESS", "PROVIDER_URL", "TASK_QUEUE", "MEMORY_DB", "RUNRECORD_DB"):
        env.pop(name, None)
    background: list[subprocess.Popen] = []
    try:
        subprocess.run(["bash", "-c", commands[2]], cwd=clone, env=env, check=True)
        server, provider, worker, starter = commands[3:]
        logs = []
        for command, port in ((server, 7233), (provider, 8780), (worker, None)):
            log = open(tmp_path / f"{len(logs)}.log", "w")
            logs.append(log)
            background.append(subprocess.Popen(["bash", "-c", command], cwd=clone, env=env,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            if port:
                wait_for_port(port, 60)
        try:
            done = subprocess.run(["bash", "-c", starter], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=120)
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"the starter did not finish: {err.stdout}\n" + "\n".join(
                f"--- {c}\n{(tmp_path / f'{i}.log').read_text()[-3000:]}"
                for i, c in enumerate(commands[3:6]))) from err
        assert done.returncode == 0, done.stdout + done.stderr
        assert "run order-1234: completed" in done.stdout, done.stdout
        assert (clone / ".state" / "temporal.db").exists() and (clone / ".state" / "provider.db").exists()
    finally:
        for proc in reversed(background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        shutil.rmtree(clone / ".state", ignore_errors=True)
