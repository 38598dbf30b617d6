"""The Temporal worker's options, as ``python worker.py`` runs with them: the
workflow sandbox, the workflow cache and its sticky timeout, the task slots,
the shutdown grace. Kept apart from the process so tests, replays, lessons
and benches run workflows under exactly the shipped options without
importing the script.

- the sandbox is Temporal's default plus ``sqlite3`` (``workflow_restrictions``);
- a workflow cache of ``DEFAULT_CACHE`` with a ``CACHED_STICKY_TIMEOUT``
  (100 ms; ``LAB_STICKY_TIMEOUT_SECONDS``) sticky schedule-to-start timeout,
  or no cache (``cache=0``);
- at most 8 workflow tasks at a time, so a burst waits on the server (where
  no timeout runs) rather than inside the process, where the 2 s workflow
  task timeout does;
- at most ``MAX_CONCURRENT_ACTIVITIES`` attempts at a time
  (``LAB_MAX_CONCURRENT_ACTIVITIES``), for the same reason: every attempt runs
  on the one event loop that also sends the heartbeats, and an attempt still
  waiting on the server has none of its timeouts running;
- ``graceful_shutdown_timeout``: how long a stopping worker lets its running
  attempts finish (``LAB_GRACEFUL_SHUTDOWN_SECONDS``).

A bad value stops the worker before it connects (``ValueError`` naming the
variable). docs/benchmarks.md gives the measurements behind each number ("The
worker's default", "1,000 runs through one worker and through two", "The
stall a busy worker has"); docs/operations.md the lab's value of each option
beside the one a production deployment would choose.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxMatcher, SandboxRestrictions

from durable_agents.flowclient.settings import env_count, env_seconds

STICKY_TIMEOUT_ENV = "LAB_STICKY_TIMEOUT_SECONDS"
ACTIVITY_SLOTS_ENV = "LAB_MAX_CONCURRENT_ACTIVITIES"
GRACEFUL_SHUTDOWN_ENV = "LAB_GRACEFUL_SHUTDOWN_SECONDS"


def workflow_restrictions() -> SandboxRestrictions:
    """Temporal's default sandbox, plus sqlite3, which the default leaves open.

    The default already passes the standard library and temporalio through
    (imported once, not per workflow task) and refuses their non-deterministic
    members at run time through proxies; the lab's own modules that workflow
    code needs are passed through where it imports them
    (``workflow.unsafe.imports_passed_through``). Passing *every* module
    through (``with_passthrough_all_modules``) would also pass the workflow
    module itself, whose imports would then be the real modules, unproxied:
    nothing would be refused. tests/test_sandbox.py checks each refusal.
    """
    default = SandboxRestrictions.default
    no_database = SandboxMatcher(children={"sqlite3": SandboxMatcher.all_uses_runtime})
    return dataclasses.replace(default, invalid_module_members=default.invalid_module_members | no_database)


MAX_CONCURRENT_ACTIVITIES = 20
"""Attempts one worker runs at a time (the SDK's default is 100). Every attempt
runs on the worker's one event loop, beside every attempt's heartbeats, and
its timeouts (start-to-close, ``LLM_TIMEOUT``) run from when the worker takes
it; an attempt without a slot waits on the server, where none runs. In bursts
of 50-200 runs at most 9-20 attempts ran at once with millisecond steps, and
20 slots ran every burst as fast as 100 (docs/benchmarks.md, "The stall a busy
worker has"): 20 changes nothing for the lab's flow and bounds what a slow
model would pile up. A production worker sets it from its model's capacity
(docs/operations.md)."""

NO_CACHE_OPTIONS: dict[str, Any] = {
    "max_cached_workflows": 0,
    "max_concurrent_workflow_tasks": 8,
    "max_concurrent_activities": MAX_CONCURRENT_ACTIVITIES,
    "workflow_runner": SandboxedWorkflowRunner(restrictions=workflow_restrictions()),
}


# With a cache, the workflow task that follows an activity completion goes to
# the sticky queue of the worker that last ran the workflow; if that worker was
# killed, the task waits there this long before any live worker may take it.
# On a server whose timers fire ~1 s late (Temporal's default timer precision)
# 100 ms acts like ~1 s: there ``cache=0`` resumes faster (docs/benchmarks.md).
# Tuned for a server on the same machine: over a network, a live worker's own
# sticky task can miss it, and the run is replayed from its whole history on
# whichever worker takes it (docs/operations.md).
CACHED_STICKY_TIMEOUT = timedelta(milliseconds=100)
DEFAULT_CACHE = 1000

GRACEFUL_SHUTDOWN = timedelta(seconds=5)
"""How long a stopping worker (SIGTERM, Ctrl-C) lets its running attempts finish
before it cuts them (each cut attempt fails as ``WorkerShutdown`` and runs again
on another worker). The lab's: its steps take milliseconds, and a stop should
be quick to watch. Below the draft's 60 s attempt timeout, so a deploy cuts a
long model call: a production worker runs with more (docs/operations.md; the
compose stack sets it)."""


def worker_options(*, cache: int = DEFAULT_CACHE, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Worker options with a cache of ``cache`` workflows (0: no cache, and
    so no sticky queue), and ``LAB_MAX_CONCURRENT_ACTIVITIES`` and
    ``LAB_STICKY_TIMEOUT_SECONDS`` from ``env`` (default ``os.environ``) when
    set. Raises ``ValueError`` naming the variable when a value is unusable."""
    env = os.environ if env is None else env
    if cache < 0:
        raise ValueError(f"--cache must be 0 or more, not {cache}")
    slots = env_count(env, ACTIVITY_SLOTS_ENV, MAX_CONCURRENT_ACTIVITIES, low=1, high=1000)
    # Read even without a cache, so that a bad value is refused whatever --cache says.
    sticky = env_seconds(env, STICKY_TIMEOUT_ENV, CACHED_STICKY_TIMEOUT, low=0, high=600)
    options = {**NO_CACHE_OPTIONS, "max_concurrent_activities": slots}
    if cache:
        options.update(max_cached_workflows=cache, sticky_queue_schedule_to_start_timeout=sticky)
    return options


def graceful_shutdown_timeout(env: Mapping[str, str] | None = None) -> timedelta:
    """``GRACEFUL_SHUTDOWN``, or ``LAB_GRACEFUL_SHUTDOWN_SECONDS`` from ``env``
    (default ``os.environ``; 0 cuts running attempts at once). Apart from
    ``worker_options`` because only ``worker.py`` stops on a signal: an
    in-process worker in a test or a bench keeps the SDK's default."""
    env = os.environ if env is None else env
    return env_seconds(env, GRACEFUL_SHUTDOWN_ENV, GRACEFUL_SHUTDOWN, low=0, high=3600, allow_zero=True)


TUNED_OPTIONS = worker_options(env={})
"""What ``python worker.py`` runs with when no variable is set: the tuned options
and the default cache (benches import it)."""
