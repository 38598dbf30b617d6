"""Real processes for the demo, the tests and the benchmarks.

Every part runs as its own OS process so that "killed" means SIGKILL of a
process, and effects are counted by a process that outlived the kill. Each
helper waits for the process's ready line with a deadline and, if it does not
come, fails with what the process printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The process harness is the adapter's test kit's (durable_agents.testing.processes); the lab uses it from here,
# its processes started in the checkout unless told otherwise.
from durable_agents.testing import processes as _harness
from durable_agents.testing.processes import (
    FAST_QUEUES,
    FAST_TIMERS,
    FILE_PRAGMAS,
    LAB_SERVER_CONFIG,
    DevServer,
    ProcessTimeout,
    free_port,
    port_is_free,
    temporal_cli,
    wait_for_namespace,
    wait_for_port,
    wait_until,
)

__all__ = ["BaseProc", "FAST_QUEUES", "FAST_TIMERS", "FILE_PRAGMAS", "LAB_SERVER_CONFIG", "REPO", "DevServer", "Proc",
           "ProcessTimeout", "free_port", "port_is_free", "start_codec_server", "start_worker", "temporal_cli",
           "wait_for_namespace", "wait_for_port", "wait_until"]

REPO = Path(__file__).resolve().parent.parent

BaseProc = _harness.Proc
"""The harness's process, as the package's own helpers (``DevServer``, the model stand-in) start it."""


class Proc(_harness.Proc):
    """``durable_agents.testing.processes.Proc``, started in the checkout unless ``cwd`` says otherwise."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO,
                 echo: bool = False) -> None:
        super().__init__(name, argv, env, cwd, echo)


def start_codec_server(env: dict[str, str], origins: list[str] | None = None, port: int = 0,
                       echo: bool = False) -> tuple[Proc, str]:
    """``python -m durable_agents.payloadcodec.server`` with the codec keys in ``env``; returns (process, URL)."""
    argv = [sys.executable, "-m", "durable_agents.payloadcodec.server", "--port", str(port), "--verbose"]
    for origin in origins or []:
        argv += ["--origin", origin]
    proc = Proc("codec-server", argv, env=env, echo=echo)
    line = proc.wait_for_line("codec server listening on", timeout=30)
    return proc, line.rsplit(" ", 1)[-1]


def start_worker(temporal_address: str, provider_url: str, task_queue: str,
                 extra_env: dict[str, str] | None = None, args: list[str] | None = None,
                 echo: bool = False, name: str = "worker", repo: Path = REPO) -> Proc:
    """``python worker.py`` of the checkout ``repo`` (this one unless told), run in
    that directory so that its modules are the ones imported (another commit's
    worktree: tests/test_upgrade.py); returns once it prints ``worker ready``."""
    env = {
        "TEMPORAL_ADDRESS": temporal_address,
        "TEMPORAL_NAMESPACE": "default",
        "TASK_QUEUE": task_queue,
        "PROVIDER_URL": provider_url,
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    proc = Proc(name, [sys.executable, "worker.py", *(args or [])], env=env, cwd=repo, echo=echo)
    proc.wait_for_line("worker ready", timeout=60)
    return proc
