"""worker.py with an event-loop lag probe, for bench/bench_worker_stall.py only:
``python bench/stall_worker.py [worker.py options]`` with ``STALL_PROBE_FILE``
set to where the samples go (JSON, written when the worker stops).

It runs worker.py's own ``main`` in this process, with the shipped options
(the environment chooses them, as for worker.py); only two things are added
around it, neither of which runs on a path the worker takes without them:

- a probe task on the worker's event loop: it asks to sleep 10 ms, again and
  again, and records by how much each wake-up came late. A late wake-up is
  time the loop spent on something else (a callback that did not yield, or
  the GIL held by the workflow threads, or the process not scheduled at all):
  the same stall every attempt's heartbeats see;
- ``temporalio.activity.heartbeat`` wrapped to record when each call is made,
  per attempt: the activity wrapper calls it every 0.3 s, so a gap between two
  calls beyond 0.3 s is what the heartbeat loop lost to a stall. The first
  call is timed from the attempt's start as the server recorded it;
- ``FlowActivities._run`` (every attempt of every step goes through it)
  wrapped to count the attempts running at once, for the most there were.

``STALL_NO_PRELOAD=1`` replaces ``durable_agents.wiring.preload`` with nothing: the worker
as it was before it loaded the model's client ahead of the first draft.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.chdir(REPO)

from temporalio import activity  # noqa: E402

from durable_agents import worker  # noqa: E402  (worker.py itself, imported as a module)
from durable_agents.activities import FlowActivities  # noqa: E402
from durable_agents.flowclient.connect import exit_now  # noqa: E402

PROBE_INTERVAL = 0.010

lags: list[tuple[float, float]] = []  # (wall-clock time of the wake-up, seconds late)
beats: dict[str, list[float]] = {}  # "<run>/<activity id>" -> wall-clock time of each heartbeat() call
first_beat: dict[str, float] = {}  # the same key -> seconds from the attempt's start to its first heartbeat()

running = 0
most_running = 0

_heartbeat = activity.heartbeat
_run_attempt = FlowActivities._run


async def _counting_run(self, step):
    global running, most_running
    running += 1
    most_running = max(most_running, running)
    try:
        return await _run_attempt(self, step)
    finally:
        running -= 1


def _recording_heartbeat(*details: object) -> None:
    now = time.time()
    info = activity.info()
    key = f"{info.workflow_id}/{info.activity_id}"
    calls = beats.setdefault(key, [])
    if not calls and info.started_time is not None:
        first_beat[key] = now - info.started_time.timestamp()
    calls.append(now)
    _heartbeat(*details)


async def _probe() -> None:
    while True:
        asked = time.monotonic()
        await asyncio.sleep(PROBE_INTERVAL)
        woke = time.monotonic()
        lags.append((time.time(), woke - asked - PROBE_INTERVAL))


_run_worker = worker.run_worker


async def _run_worker_probed(*args, **kwargs) -> None:
    probe = asyncio.ensure_future(_probe())
    try:
        await _run_worker(*args, **kwargs)
    finally:
        probe.cancel()
        gaps = [b - a for calls in beats.values() for a, b in zip(calls, calls[1:], strict=False)]
        Path(os.environ["STALL_PROBE_FILE"]).write_text(json.dumps({
            "interval": PROBE_INTERVAL, "lags": lags, "beat_gaps": gaps,
            "first_beats": list(first_beat.values()), "beating_attempts": len(beats),
            "most_running": most_running,
        }))


def main() -> int:
    if not os.environ.get("STALL_PROBE_FILE"):
        print("STALL_PROBE_FILE must name the file the samples go to", file=sys.stderr)
        return 2
    activity.heartbeat = _recording_heartbeat  # the activity wrapper looks it up on the module at each call
    FlowActivities._run = _counting_run  # type: ignore[method-assign]
    worker.run_worker = _run_worker_probed  # durable_agents.worker.main looks it up at its call
    if os.environ.get("STALL_NO_PRELOAD") == "1":
        worker.preload = lambda deps: None
    return worker.main(sys.argv[1:])


if __name__ == "__main__":
    exit_now(main())
