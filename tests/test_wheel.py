"""The adapter as a user gets it: its wheel built from this checkout, installed into a fresh virtual
environment outside the repository (no ``-e``, not the lab's ``.venv``, whose ``lab.pth`` puts the checkout on
the path), its dependencies from the wheelhouse ``make install`` made from ``requirements/adapter.lock``
(``--no-index``: nothing is downloaded here). Then the example agent of docs/your-agent.md, copied into a
project folder of its own as a user would hold it, runs from that environment against a dev server: its worker
SIGKILLed right after the booking, a standby worker finishing the run; each effect once at the agent's own
service."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from examples.scheduler.client import SchedulerClient
from lab.processes import REPO, Proc, free_port
from tests.tiers import starts

pytestmark = pytest.mark.process

WHEELHOUSE = Path(sys.prefix) / "wheelhouse"
SPEC = "examples.scheduler.agent:AGENT"
POINT = "tool:book_room:after_effect"
TASK = "Book a room on 2027-01-12 for the planning meeting and invite the attendee."
ATTENDEE = "ana@example.com"
# What the repository holds beside the package: none of it may reach a user's site-packages.
THE_LAB = ("lab", "lesson", "grader", "bench", "peers", "exercises", "provider", "examples", "timeline", "tests",
           "worker", "starter", "workflows", "activities", "steps", "runrecord", "dbosflow", "memory", "storage",
           "wiring", "flowclient", "drafting", "payloadcodec", "providerclient")


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no virtual environment of the lab's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
@starts("process")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel`` builds from what the distribution is made of (pyproject.toml, README.md and the
    package), copied out of the checkout so that the build leaves nothing in it."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(REPO / "durable_agents", source / "durable_agents",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
          str(out), str(source)])
    (built,) = out.glob("durable_agents-*.whl")
    return built


@pytest.fixture(scope="module")
@starts("process")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed, from the wheelhouse alone."""
    if not WHEELHOUSE.is_dir():
        pytest.fail(f"no wheelhouse at {WHEELHOUSE}: `make install` makes it (requirements/adapter.lock)")
    where = tmp_path_factory.mktemp("user") / "venv"
    assert not where.is_relative_to(REPO)
    _run([sys.executable, "-m", "venv", str(where)], env=_clean_env())
    _run([str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
          str(WHEELHOUSE), str(wheel)], env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
    return where


def test_the_wheel_holds_the_package_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    version = wheel.name.split("-")[1]
    assert tops == {"durable_agents", f"durable_agents-{version}.dist-info"}, sorted(tops)
    assert "durable_agents/py.typed" in names
    assert "durable_agents/workflows/agent_loop.py" in names and "durable_agents/runrecord/cli.py" in names


def test_installing_it_adds_its_namespace_alone_and_nothing_of_the_checkout(venv):
    python = str(venv / "bin" / "python")
    probe = ("import importlib.metadata as m, importlib.util, json, sys, durable_agents\n"
             "files = [str(f) for f in m.files('durable-agents')]\n"
             f"lab = [n for n in {THE_LAB!r} if importlib.util.find_spec(n) is not None]\n"
             "print(json.dumps({'files': files, 'lab': lab, 'path': sys.path, 'at': durable_agents.__file__,\n"
             "                  'version': durable_agents.__version__}))")
    seen = json.loads(_run([python, "-c", probe], cwd=venv.parent, env=_clean_env()).stdout)
    tops = {f.split("/")[0] for f in seen["files"]}
    assert tops == {"durable_agents", f"durable_agents-{seen['version']}.dist-info"}, sorted(tops)
    assert seen["lab"] == [], f"the installed environment can import the lab's {seen['lab']}"
    assert Path(seen["at"]).is_relative_to(venv), seen["at"]
    assert not [p for p in seen["path"] if p and Path(p).resolve().is_relative_to(REPO)], seen["path"]
    site = Path(seen["at"]).parent.parent
    assert not [n for n in THE_LAB if (site / n).exists() or (site / f"{n}.py").exists()]


def test_the_example_agent_killed_after_its_booking_applies_each_effect_once(venv, dev_server, tmp_path):
    """As docs/your-agent.md runs it, with the installed package's commands: a worker armed at the booking's
    crash point dies by SIGKILL after the service applied the booking; a standby worker finishes the run; the
    booking's retry asks the service by its key and sends nothing again."""
    python = str(venv / "bin" / "python")
    project = tmp_path / "project"  # the user's own code: their agent and its service, nothing else
    shutil.copytree(REPO / "examples", project / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    port, queue, run_id = free_port(), f"wheel-{time.time_ns()}", f"wheel-{int(time.time())}"
    url = f"http://127.0.0.1:{port}"
    env = _clean_env(TEMPORAL_ADDRESS=dev_server.address, TEMPORAL_NAMESPACE="default", TASK_QUEUE=queue,
                     SCHEDULER_URL=url, MEMORY_DB=str(tmp_path / "memory.db"), CRASH_AT="")
    procs: list[Proc] = []
    try:
        service = Proc("service", [python, "-m", "examples.scheduler.service", "--db", str(tmp_path / "s.db"),
                                   "--port", str(port)], env=env, cwd=project)
        procs.append(service)
        service.wait_for_line("scheduler listening", timeout=30)
        first = Proc("worker1", [python, "-m", "durable_agents.worker", "--agent", SPEC],
                     env={**env, "CRASH_AT": POINT}, cwd=project)
        procs.append(first)
        first.wait_for_line("worker ready", timeout=60)
        _run([python, "-m", "durable_agents.starter", "loop", run_id, TASK, "--agent", SPEC,
              "--param", f"attendee={ATTENDEE}", "--no-wait"], cwd=project, env=env)
        assert first.wait(60) == -9, first.output()
        second = Proc("worker2", [python, "-m", "durable_agents.worker", "--agent", SPEC], env=env, cwd=project)
        procs.append(second)
        deadline = time.monotonic() + 60
        while True:
            shown = subprocess.run([python, "-m", "durable_agents.starter", "status", run_id, "--json"],
                                   cwd=project, env=env, capture_output=True, text=True, timeout=60)
            status = json.loads(shown.stdout) if shown.returncode in (0, 1, 3) and shown.stdout else None
            if status is not None and status["status"] != "running":
                break
            assert time.monotonic() < deadline, f"the run did not end in 60 s: {shown.stdout}{shown.stderr}"
            time.sleep(0.2)
        assert status["status"] == "completed", status
        counts = _counts(url)
    finally:
        for proc in procs:
            proc.kill()
    keys = [k for k in counts["applied"] if f"/{run_id}/" in k]
    assert len(keys) == 2 and all(counts["applied"][k] == 1 and counts["requests"][k] == 1 for k in keys), counts
    assert sorted(counts["lookups"].get(k, 0) for k in keys) == [0, 1], counts


def _counts(url: str) -> dict:
    import asyncio

    async def read() -> dict:
        client = SchedulerClient(url)
        try:
            return await client.counts()
        finally:
            await client.aclose()

    return asyncio.run(read())
