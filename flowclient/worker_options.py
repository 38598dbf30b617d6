"""The Temporal worker's options, as ``python worker.py`` runs with them: the
workflow sandbox, the workflow cache and its sticky timeout, the task slots.
Kept apart from the process so tests, replays, lessons and benches run
workflows under exactly the shipped options without importing the script.

- the sandbox is Temporal's default plus ``sqlite3`` (``workflow_restrictions``);
- a workflow cache of ``DEFAULT_CACHE`` with a ``CACHED_STICKY_TIMEOUT``
  (100 ms) sticky schedule-to-start timeout, or no cache (``cache=0``);
- at most 8 workflow tasks at a time, so a burst waits on the server (where
  no timeout runs) rather than inside the process, where the 2 s workflow
  task timeout does.

docs/benchmarks.md gives the measurements behind each number ("The worker's
default" and "1,000 runs through one worker and through two").
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxMatcher, SandboxRestrictions


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


NO_CACHE_OPTIONS: dict[str, Any] = {
    "max_cached_workflows": 0,
    "max_concurrent_workflow_tasks": 8,
    "workflow_runner": SandboxedWorkflowRunner(restrictions=workflow_restrictions()),
}


# With a cache, the workflow task that follows an activity completion goes to
# the sticky queue of the worker that last ran the workflow; if that worker was
# killed, the task waits there this long before any live worker may take it.
# On a server whose timers fire ~1 s late (Temporal's default timer precision)
# 100 ms acts like ~1 s: there ``cache=0`` resumes faster (docs/benchmarks.md).
CACHED_STICKY_TIMEOUT = timedelta(milliseconds=100)
DEFAULT_CACHE = 1000


def worker_options(*, cache: int = DEFAULT_CACHE) -> dict[str, Any]:
    """The Worker options with a cache of ``cache`` workflows (0: no cache, ``NO_CACHE_OPTIONS``)."""
    if cache < 0:
        raise ValueError(f"--cache must be 0 or more, not {cache}")
    if cache:
        return {**NO_CACHE_OPTIONS, "max_cached_workflows": cache,
                "sticky_queue_schedule_to_start_timeout": CACHED_STICKY_TIMEOUT}
    return NO_CACHE_OPTIONS


TUNED_OPTIONS = worker_options()
"""What ``python worker.py`` runs with: the tuned options and the default cache (benches import it)."""
