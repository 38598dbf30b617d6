"""Runs the Temporal worker for the agent flow and the agent loop (``durable_agents.workflows.agent_loop``).

    python worker.py [--task-queue Q] [--agent package.module:attribute ...] [--cache N] [--identity NAME] [--verbose]

The worker serves the lab's flow and its refund agent, and each agent ``--agent`` names (a
``durable_agents.Agent``, by import string: docs/your-agent.md); a loop run is run by the agent it names.

Everything comes from the environment: the connection (``durable_agents.flowclient.connect``:
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS, profiles), the
provider (PROVIDER_URL), the model (LLM_BASE_URL, LLM_MODEL, LLM_API_KEY; the
offline model when unset), conversation memory (MEMORY_DB), payload
encryption (LAB_CODEC_KEY, ``payloadcodec``), tracing (LAB_OTEL) and
Prometheus metrics (LAB_METRICS_ADDRESS, ``durable_agents.flowclient.metrics``). A bad
setting stops the worker before it connects, saying what to give instead.

Any number of worker processes may poll one task queue, on one machine or
many: each takes whatever task comes next, and a dead one's work moves to
the others. The options (``durable_agents.flowclient.worker_options``) are tuned for a fast
resume after SIGKILL and for throughput: a workflow cache with a 100 ms sticky
timeout (``--cache 0``: none), Temporal's default sandbox plus ``sqlite3``
(non-deterministic calls in workflow code are refused), at most 8 workflow
tasks and 20 attempts at a time, and workflow-task failures left to park a run
(a bad deploy) rather than fail it. docs/benchmarks.md has the measurements
behind each; docs/operations.md the variables that change them
(LAB_MAX_CONCURRENT_ACTIVITIES, LAB_STICKY_TIMEOUT_SECONDS,
LAB_GRACEFUL_SHUTDOWN_SECONDS) and the values a production worker would take.

Before polling, the worker loads what its first step would otherwise load on
the event loop that heartbeats (``durable_agents.wiring.preload``: the OpenAI-compatible
model's client), so that the first draft does not stall every attempt's
heartbeats. On SIGTERM or Ctrl-C it stops polling and lets running attempts
finish for the shutdown grace (5 s unless LAB_GRACEFUL_SHUTDOWN_SECONDS says).

Prints ``worker ready`` once polling starts; tests and the demo wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.worker import Worker

from durable_agents.activities import FlowActivities
from durable_agents.activities.loop import LoopActivities
from durable_agents.agent import Agent, load_agent
from durable_agents.flowclient.connect import connect, exit_now, flush_tracing, task_queue
from durable_agents.flowclient.logs import configure_logging
from durable_agents.flowclient.metrics import metrics_runtime
from durable_agents.flowclient.signals import run_until_signalled
from durable_agents.flowclient.worker_options import DEFAULT_CACHE, graceful_shutdown_timeout, worker_options
from durable_agents.providerclient import provider_url_from_env
from durable_agents.steps import crashpoints
from durable_agents.steps.refund_agent import REFUND_AGENT
from durable_agents.steps.served import close_services, serve, serve_on, warn_unreached_points
from durable_agents.wiring import close_memory, deps_from_env, preload
from durable_agents.workflows.agent_flow import AgentFlow
from durable_agents.workflows.agent_loop import AgentLoop

log = logging.getLogger("worker")


async def run_worker(queue: str, *, cache: int = DEFAULT_CACHE, identity: str | None = None,
                     agents: Sequence[Agent] = ()) -> None:
    options = worker_options(cache=cache)
    grace = graceful_shutdown_timeout()
    deps = deps_from_env()  # configuration errors first, before any connection
    served = serve([REFUND_AGENT, *agents], deps)
    warn_unreached_points(served)  # a CRASH_AT that names no tool served here kills nothing
    serve_on(queue, served)  # what the loop's workflow code reads: the agents this worker serves
    # Now, not at the first draft: an import there holds the event loop that
    # sends every running attempt's heartbeats (docs/benchmarks.md).
    preload(deps)
    runtime, metrics_url = metrics_runtime()  # LAB_METRICS_ADDRESS: the SDK's Prometheus metrics
    named: dict[str, Any] = {"identity": identity} if identity else {}  # else the SDK's pid@host
    client = await connect(runtime=runtime, **named)
    activities = FlowActivities(deps)
    loop_activities = LoopActivities(deps, served=served)  # the agent loop's (durable_agents.workflows.agent_loop)
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[AgentFlow, AgentLoop],
        activities=activities.all() + loop_activities.all(),
        graceful_shutdown_timeout=grace,
        **options,
    )
    def ready() -> None:
        armed = ", ".join(sorted(crashpoints.armed())) or "none"
        if metrics_url:
            print(f"worker metrics: {metrics_url}", flush=True)
        codec = client.data_converter.payload_codec
        # Names only: never a key, an API key or a payload.
        key_id = getattr(codec, "key_id", None)  # payloadcodec's codec names its key; another may not
        encrypted = f"encrypted with key id {key_id!r}" if codec is not None else "not encrypted"
        print(
            f"worker ready: task queue {queue!r}, pid {os.getpid()}, "
            f"model {deps.llm.name}, provider {provider_url_from_env()}, crash points {armed}, "
            f"agents {', '.join(s.shown() for s in served)}, "
            f"payloads {encrypted}, workflow cache {options.get('max_cached_workflows', 'default')}, "
            f"activity slots {options['max_concurrent_activities']}, "
            f"shutdown grace {grace.total_seconds():g} s, identity {client.identity}",
            flush=True,
        )

    def stopping() -> None:
        print(f"worker stopping (finishing in-flight activities, up to {grace.total_seconds():g} s)", flush=True)

    await run_until_signalled(worker, ready, stopping)
    await close_services(served, deps)
    await deps.provider.aclose()
    close_memory(deps.remember)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-queue", default=None, help="default: $TASK_QUEUE or agent-flow")
    parser.add_argument("--agent", action="append", default=[], metavar="MODULE:ATTR",
                        help="also serve this agent (a durable_agents.Agent by import string, e.g. "
                             "examples.scheduler.agent:AGENT); repeatable. The refund agent is always served")
    parser.add_argument("--cache", type=int, default=DEFAULT_CACHE, metavar="N",
                        help=f"cache up to N workflows, 100 ms sticky timeout (default {DEFAULT_CACHE}); 0: no cache, "
                             "no sticky queue (resume does not wait on a dead worker's queue, "
                             "at a cost in throughput: docs/benchmarks.md)")
    parser.add_argument("--identity", default=None,
                        help="the name this worker gives Temporal (history records it on every task it runs); "
                             "default: pid@host")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="debug logging (the SDK's, and a line per HTTP request); never payloads or bodies")
    args = parser.parse_args(argv)
    # --verbose: the SDK's debug lines and one line per HTTP request, but no
    # request bodies or payloads (durable_agents/flowclient/logs.py).
    configure_logging(args.verbose)
    # Workflow log lines (the replay report) carry the run id in their text already.
    workflow.logger.workflow_info_on_message = False
    try:
        agents = [load_agent(spec) for spec in args.agent]
        asyncio.run(run_worker(args.task_queue or task_queue(), cache=args.cache, identity=args.identity,
                               agents=agents))
    except (ConnectionError, ValueError) as err:  # unreachable server, bad configuration (codec key too)
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        flush_tracing()
    return 0


if __name__ == "__main__":
    exit_now(main())
