"""docker-compose.yml and deploy/, checked without a Docker engine.

The PyYAML checks always run: the file parses, the services and ports are the
documented ones, every image is pinned to an explicit tag, the workers reach
the server and the provider by service name, and every path the Dockerfile
and the compose file refer to exists, and the image ships the packages
pyproject.toml finds and nothing it leaves out. ``docker compose config`` (the client
validates against the Compose schema without a daemon) runs only where the
compose plugin is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from lab.processes import LAB_SERVER_CONFIG

yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# What stays out of the image and of mypy's tree (and, like the rest of the lab, out of the wheel).
NOT_SHIPPED = ("tests", "bench", "exercises", "docs")

EXPECTED_SERVICES = {
    "postgresql", "temporal-schema", "temporal", "temporal-create-namespace",
    "temporal-ui", "codec-server", "provider", "worker", "starter",
}
# Published ports, as docs/deploy.md lists them: all on the host's loopback only.
EXPECTED_PORTS = {
    "temporal": ["127.0.0.1:7233:7233"],
    "temporal-ui": ["127.0.0.1:8080:8080"],
    "provider": ["127.0.0.1:8780:8780"],
    "codec-server": ["127.0.0.1:8081:8081"],
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_are_the_documented_ones(compose):
    assert set(compose["services"]) == EXPECTED_SERVICES
    docs = (REPO / "docs" / "deploy.md").read_text()
    for name in EXPECTED_SERVICES:
        assert f"`{name}`" in docs, f"service {name} is not described in docs/deploy.md"


def test_published_ports_are_the_documented_ones_and_loopback_only(compose):
    published = {name: svc.get("ports") for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == EXPECTED_PORTS
    docs = (REPO / "docs" / "deploy.md").read_text()
    for ports in EXPECTED_PORTS.values():
        host_port = ports[0].split(":")[1]
        assert host_port in docs


def _images(compose) -> dict[str, str]:
    return {name: svc["image"] for name, svc in compose["services"].items() if "image" in svc}


def test_every_image_is_pinned_to_an_explicit_tag(compose):
    images = _images(compose)
    assert set(images) == EXPECTED_SERVICES, "every service names its image (the project's is built and tagged)"
    for name, image in images.items():
        assert "${" not in image, f"{name}: {image} depends on the environment; pin it in the file"
        repo, sep, tag = image.rpartition(":")
        assert sep and repo and "/" not in tag, f"{name}: {image} has no explicit tag"
        assert tag != "latest", f"{name}: {image} floats"
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", tag), f"{name}: {image}: tag {tag!r} is not an exact version"
    # Server and admin-tools (schema) move together; the server is the one the lab measured.
    assert images["temporal"] == "temporalio/server:1.32.0"
    assert images["temporal-schema"] == images["temporal-create-namespace"] == "temporalio/admin-tools:1.32.0"
    assert images["temporal-ui"].startswith("temporalio/ui:")
    assert images["postgresql"].startswith("postgres:")
    dockerfile_from = re.findall(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.M)
    assert dockerfile_from and all(re.search(r":\d+\.\d+\.\d+", f) for f in dockerfile_from), dockerfile_from


def test_postgres_flushes_every_commit_before_acknowledging_it(compose):
    """A power cut of the compose stack loses no acknowledged history: fsync and synchronous_commit
    are on, written out in the file (docs/powercut.md, "What a learner's laptop promises")."""
    command = compose["services"]["postgresql"].get("command") or []
    settings = dict(arg.split("=", 1) for flag, arg in zip(command, command[1:], strict=False) if flag == "-c")
    for name in ("fsync", "synchronous_commit", "full_page_writes"):
        assert settings.get(name) == "on", f"postgresql must run with -c {name}=on; its command is {command}"
    assert command[0] == "postgres", command


def test_server_runs_on_postgres_after_the_schema_job(compose):
    svc = compose["services"]
    assert svc["temporal"]["environment"]["DB"] == "postgres12"
    assert svc["temporal"]["environment"]["POSTGRES_SEEDS"] == "postgresql"
    assert svc["temporal"]["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"
    assert svc["temporal-schema"]["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert svc["temporal-schema"]["command"] == ["/scripts/setup-postgres.sh"]
    script = (REPO / "deploy" / "scripts" / "setup-postgres.sh").read_text()
    assert "temporal_visibility" in script and "update-schema" in script
    assert svc["worker"]["depends_on"]["temporal-create-namespace"]["condition"] == "service_completed_successfully"


def test_workers_reach_the_server_and_the_provider_by_service_name(compose):
    svc = compose["services"]
    env = svc["worker"]["environment"]
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["PROVIDER_URL"] == "http://provider:8780"
    assert env["TASK_QUEUE"] == "agent-flow"
    assert svc["worker"]["deploy"]["replicas"] >= 2
    assert svc["starter"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert svc["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    # The codec server, behind its profile, serves the UI's origin; the UI knows where it is.
    codec = svc["codec-server"]
    assert codec["profiles"] == ["codec"] and codec["environment"]["LAB_CODEC_SERVER_ALLOW_REMOTE"] == "1"
    assert "http://localhost:8080" in codec["command"]
    assert svc["temporal-ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"] == "${LAB_UI_CODEC_ENDPOINT:-}"
    provider = svc["provider"]
    assert provider["environment"]["PROVIDER_ALLOW_REMOTE"] == "1"
    cmd = provider["command"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "8780"


def test_paths_in_compose_and_dockerfile_exist(compose):
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).is_file(), name
        for env_file in [svc["env_file"]] if isinstance(svc.get("env_file"), str) else svc.get("env_file", []):
            assert (REPO / env_file).is_file(), (name, env_file)
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), (name, volume)
        if svc.get("entrypoint") == ["/bin/sh"]:
            script = svc["command"][0]
            assert script.startswith("/scripts/")
            assert (REPO / "deploy" / "scripts" / script.removeprefix("/scripts/")).is_file(), (name, script)
    temporal = compose["services"]["temporal"]
    dyn = temporal["environment"]["DYNAMIC_CONFIG_FILE_PATH"].removeprefix("config/dynamicconfig/")
    dyn_file = REPO / "deploy" / "dynamicconfig" / dyn
    assert dyn_file.is_file()
    dynamic = yaml.safe_load(dyn_file.read_text())
    assert isinstance(dynamic, dict)
    # The stack's server runs with the settings the lab's dev server was measured with.
    for key, value in LAB_SERVER_CONFIG.items():
        assert key in dynamic, f"{dyn_file.name} lacks {key} (lab/processes.py sets it)"
        assert str(dynamic[key][0]["value"]) == str(yaml.safe_load(value)), (key, dynamic[key])

    for source in _copied():
        assert (REPO / source).exists(), f"deploy/Dockerfile copies {source}, which does not exist"
    # Locked: the dependencies from requirements/deploy.lock with their hashes, then the project alone.
    text = DOCKERFILE.read_text()
    assert "pip install --require-hashes -r requirements/deploy.lock" in text
    assert "pip install --no-deps --no-build-isolation ." in text
    assert text.index("requirements/deploy.lock") < text.index("--no-deps")


def _copied() -> list[str]:
    copied: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _dest = line.split()[1:]
            copied += [s.rstrip("/") or "." for s in sources]
    return copied


def _shipped_packages() -> list[str]:
    """The packages `pip install .` builds, found as setuptools finds them (the one list there is)."""
    from setuptools import find_namespace_packages, find_packages

    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages
    found = []
    for where in find.get("where", ["."]):
        found += finder(str(REPO / where), include=find.get("include", ["*"]), exclude=find.get("exclude", []))
    return found


def _dockerignore_rules() -> list[re.Pattern[str]]:
    """.dockerignore as Docker reads it (moby's patternmatcher): patterns relative to the context's root,
    `**` any number of directories, `*` and `?` within one name; a directory left out takes its contents."""
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), f".dockerignore: {line!r}: keep it a plain deny list (no exceptions read)"
        pattern = line.strip("/")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append(re.compile(regex))
    return rules


def _ignored(relative: str, rules: list[re.Pattern[str]]) -> bool:
    parts = relative.split("/")
    return any(rule.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1) for rule in rules)


# What the image runs of the lab, from its working directory (docker-compose.yml's commands): the scripts and
# the stand-in provider. The adapter it runs is the package `pip install .` installs.
IMAGE_RUNS_FROM_THE_TREE = ("worker.py", "starter.py", "provider")


def test_the_image_ships_what_pyproject_ships_and_nothing_it_leaves_out():
    """One list of packages: pyproject's `packages.find`, the adapter alone. The image copies the tree,
    installs the package from it and runs the lab's scripts and provider from its working directory;
    .dockerignore leaves out the rest; mypy checks the same tree. Nothing here may name a package."""
    copied = _copied()
    assert "." in copied, f"deploy/Dockerfile must copy the tree (`COPY . .`), not a list of packages: {copied}"
    packages = _shipped_packages()
    tops = {name.split(".")[0] for name in packages}
    assert tops == {"durable_agents"}, f"pyproject.toml ships {sorted(tops)}: the adapter's package alone"
    assert {"durable_agents.steps", "durable_agents.workflows", "durable_agents.dbosflow"} <= set(packages), packages
    rules = _dockerignore_rules()
    needed = [PYPROJECT["project"]["readme"], "pyproject.toml", "requirements/deploy.lock"]
    directories = [REPO / package.replace(".", "/") for package in packages]
    for name in IMAGE_RUNS_FROM_THE_TREE:
        path = REPO / name
        if path.is_dir():
            directories += [d for d in (path, *path.rglob("*")) if d.is_dir() and d.name != "__pycache__"]
        else:
            needed.append(name)
    for directory in directories:
        needed += [str(path.relative_to(REPO)) for path in directory.iterdir()
                   if path.is_file() and not path.name.endswith((".pyc", ".pyo"))]
    left_out = [path for path in needed if _ignored(path, rules)]
    assert not left_out, f".dockerignore leaves out what the image installs or runs: {left_out}"
    # What does not ship stays out of the image, and out of mypy's tree.
    must_not = [*NOT_SHIPPED, ".git", ".venv", ".state", "durable_agents/steps/__pycache__/flow.cpython-311.pyc",
                ".state/provider.db", "provider.db-wal"]
    kept = [path for path in must_not if not _ignored(path, rules)]
    assert not kept, f"the image would hold {kept}, which does not ship: leave it out in .dockerignore"
    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["files"] == ["."], "mypy checks the tree; what it leaves out is in its exclude"
    excludes = [mypy["exclude"]] if isinstance(mypy["exclude"], str) else mypy["exclude"]
    for name in NOT_SHIPPED:
        assert any(re.search(pattern, f"{name}/") for pattern in excludes), f"mypy does not exclude {name}/"
    for name in (*tops, "provider", "lab"):
        assert not any(re.search(pattern, f"{name}/") for pattern in excludes), f"mypy excludes {name}/"


def _compose_cli() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        probe = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return argv
    return None


@pytest.mark.process
def test_docker_compose_config_accepts_the_file():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose client here (the PyYAML checks above still ran)")
    done = subprocess.run([*cli, "-f", str(COMPOSE), "config", "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _as_compose_fills(value: object) -> str:
    """A value as compose fills it when the host sets nothing: ``${VAR:-default}`` is the default."""
    found = re.fullmatch(r"\$\{\w+:-(.*)\}", str(value))
    return found.group(1) if found else str(value)


def test_the_stack_runs_production_options_that_its_processes_accept(compose):
    """The options docs/operations.md recommends for production, as the stack sets them:
    each parses with the reader the process uses (a typo would stop every worker), the
    shutdown grace outlasts the longest attempt, and compose waits longer than the grace
    before its SIGKILL, so a rolling restart lets attempts in flight finish."""
    from durable_agents.drafting import model_from_env
    from durable_agents.flowclient.runs import parking_window, workflow_task_timeout
    from durable_agents.flowclient.worker_options import graceful_shutdown_timeout, worker_options
    from durable_agents.steps.retry import ATTEMPT_TIMEOUT_SECONDS

    svc = compose["services"]
    worker = {k: _as_compose_fills(v) for k, v in svc["worker"]["environment"].items()}
    starter = {k: _as_compose_fills(v) for k, v in svc["starter"]["environment"].items()}
    options = worker_options(env=worker)
    assert options["max_concurrent_activities"] == int(worker["LAB_MAX_CONCURRENT_ACTIVITIES"])
    assert options["sticky_queue_schedule_to_start_timeout"].total_seconds() == float(
        worker["LAB_STICKY_TIMEOUT_SECONDS"])
    grace = graceful_shutdown_timeout(worker).total_seconds()
    assert grace >= max(ATTEMPT_TIMEOUT_SECONDS.values()), grace
    stop = re.fullmatch(r"(\d+)s", svc["worker"]["stop_grace_period"])
    assert stop and int(stop.group(1)) >= grace + 5, (svc["worker"]["stop_grace_period"], grace)
    # Two requests of the model (its parse attempts) fit the draft's attempt timeout.
    llm = model_from_env({**worker, "LLM_BASE_URL": "http://model:11434/v1", "LLM_MODEL": "m"})
    assert llm.timeout * llm.max_parse_attempts < ATTEMPT_TIMEOUT_SECONDS["draft"], llm.timeout
    assert workflow_task_timeout(starter).total_seconds() == 10
    assert parking_window(starter).total_seconds() >= 3 * 86400  # outlasts a weekend
