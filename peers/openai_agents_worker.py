"""One worker of the Agents SDK lane, as its own OS process (the driver SIGKILLs it)::

    python -m peers.openai_agents_worker --variant activity_as_tool --task-queue Q

It connects to ``TEMPORAL_ADDRESS`` with ``OpenAIAgentsPlugin`` (the integration's README: the plugin on the
client and the worker), the model reached through ``peers.openai_agents_model`` (chat completions at
``LLM_BASE_URL``, counted under ``LAB_PEER_RUN``, the crash point ``peer:between_turns``), and runs
``peers.openai_agents_workflow`` with the tool activities of ``peers.openai_agents_activities`` (every variant's
worker registers them: a ``function_tool`` run schedules none). ``CRASH_AT`` arms the crash points
(``peers.lane.CRASH_POINTS``).

Worker options: the lab's (``durable_agents.flowclient.worker_options``: its sandbox, cache, 100 ms sticky timeout and
slots), so a resume after a kill waits on the same things in every lane; the plugin adds its pass-through modules to the
sandbox. Prints ``worker ready`` once polling; stops on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

# Before the Agents SDK reads it: no trace export (its exporter would call OpenAI's servers).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from temporalio.client import Client  # noqa: E402
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from durable_agents.flowclient.signals import run_until_signalled  # noqa: E402
from durable_agents.flowclient.worker_options import worker_options  # noqa: E402
from durable_agents.steps import crashpoints  # noqa: E402
from peers.lane import READY  # noqa: E402
from peers.openai_agents_activities import ACTIVITIES  # noqa: E402
from peers.openai_agents_model import model_provider  # noqa: E402
from peers.openai_agents_workflow import (  # noqa: E402
    MODEL_HEARTBEAT,
    MODEL_RETRY,
    MODEL_START_TO_CLOSE,
    VARIANTS,
    OpenAIAgentsPeerRun,
)


def plugin() -> OpenAIAgentsPlugin:
    """The plugin as this lane configures it: the model's activity options beside the model's provider."""
    params = ModelActivityParameters(start_to_close_timeout=MODEL_START_TO_CLOSE, heartbeat_timeout=MODEL_HEARTBEAT,
                                     retry_policy=MODEL_RETRY)
    return OpenAIAgentsPlugin(model_params=params, model_provider=model_provider())


async def run_worker(variant: str, task_queue: str) -> None:
    address = os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233")
    client = await Client.connect(address, plugins=[plugin()])
    worker = Worker(client, task_queue=task_queue, workflows=[OpenAIAgentsPeerRun], activities=list(ACTIVITIES),
                    **worker_options())

    def ready() -> None:
        armed = ", ".join(sorted(crashpoints.armed())) or "none"
        print(f"{READY}: openai-agents lane, variant {variant}, task queue {task_queue!r}, pid {os.getpid()}, "
              f"crash points {armed}", flush=True)

    await run_until_signalled(worker, ready)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m peers.openai_agents_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    parser.add_argument("--task-queue", required=True)
    args = parser.parse_args(argv)
    try:
        asyncio.run(run_worker(args.variant, args.task_queue))
    except ValueError as err:  # a setting missing or wrong (LLM_BASE_URL): said before connecting
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
