"""Runs the Temporal worker for the agent flow.

    python worker.py [--task-queue Q] [--defaults] [--verbose]

Connection from the environment (``flowclient.connect``: TEMPORAL_ADDRESS,
TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS, profiles); the provider from
PROVIDER_URL; the model from LLM_BASE_URL / LLM_MODEL / LLM_API_KEY (offline
model when unset); conversation memory from MEMORY_DB.

Tuned for a fast resume after SIGKILL (``--defaults`` turns this off, for the
benchmark that measures what it buys):

- sticky schedule-to-start 1 s instead of 10 s: a workflow task parked on the
  dead worker's sticky queue moves to the shared queue after 1 s;
- the activities' 1 s heartbeat timeout and the starter's 2 s workflow task
  timeout are set where those calls are made (workflows/, starter.py).

Prints ``worker ready`` once polling starts; tests and the demo wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from datetime import timedelta

from temporalio.worker import Worker

from activities import FlowActivities
from flowclient.connect import connect, exit_now, task_queue
from llm import model_from_env
from provider.client import ProviderClient, provider_url_from_env
from steps import crashpoints
from steps.flow import StepDeps
from workflows.agent_flow import AgentFlow

log = logging.getLogger("worker")

TUNED_STICKY_TIMEOUT = timedelta(seconds=1)


def build_deps(env=os.environ) -> StepDeps:
    pace = float(env.get("LAB_STEP_SECONDS") or 0)
    return StepDeps(
        provider=ProviderClient(provider_url_from_env(env)),
        llm=model_from_env(env),
        context=_memory_context(env),
        pace_seconds=pace,
    )


def _memory_context(env):
    return lambda conversation_id: []


async def run_worker(queue: str, *, defaults: bool) -> None:
    client = await connect()
    deps = build_deps()
    activities = FlowActivities(deps)
    options = {} if defaults else {"sticky_queue_schedule_to_start_timeout": TUNED_STICKY_TIMEOUT}
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[AgentFlow],
        activities=activities.all(),
        graceful_shutdown_timeout=timedelta(seconds=5),
        **options,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        armed = ", ".join(sorted(crashpoints.armed())) or "none"
        print(
            f"worker ready: task queue {queue!r}, pid {os.getpid()}, "
            f"model {deps.llm.name}, provider {deps.provider.base_url}, crash points {armed}",
            flush=True,
        )
        await stop.wait()
        print("worker stopping (finishing in-flight activities, up to 5 s)", flush=True)
    await deps.provider.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-queue", default=None, help="default: $TASK_QUEUE or agent-flow")
    parser.add_argument("--defaults", action="store_true", help="use Temporal's default timeouts (for comparison)")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(run_worker(args.task_queue or task_queue(), defaults=args.defaults))
    except ConnectionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    exit_now(main())
