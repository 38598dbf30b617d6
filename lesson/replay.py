"""Replay a recorded history with the current workflow code, as a worker does
when it resumes a run: the workflow function runs again from the start, and
every activity it schedules is answered from the history (its recorded
result), never executed. The code must make the same decisions in the same
order; if it does not, Temporal says so (a non-determinism error) instead of
guessing.

    python -m lesson.replay HISTORY.json [--workflow-id ID] [--inject CODE]
    python -m lesson.replay --run RUN_ID            # the history of a run on the server

HISTORY.json is what ``temporal workflow show --output json`` writes (the
committed ones are in tests/data/histories/). The workflow id defaults to
the file's name without ``.json``. With the payload codec on (LAB_CODEC_KEY),
encrypted histories are decrypted as the worker would.

``--inject CODE`` replays with a copy of the workflow module whose ``run``
begins with CODE, e.g. ``--inject "random.random()"``, ``--inject
"time.time()"`` or ``--inject "datetime.datetime.now()"``: what the sandbox
says to workflow code that is not deterministic (the module is not changed).
The modules a learner reaches for (``INJECT_MODULES``: the clock, random
numbers, ids, files, the network) are imported for CODE, so what it meets is
the sandbox's refusal, not a NameError; a line that fails on its own is
reported as such, with those names. It uses the worker's own runner
(``durable_agents.flowclient.worker_options``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import re
import sys
import tempfile
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from durable_agents.payloadcodec import data_converter_from_env
from lab.processes import REPO

ANCHOR = "    async def run(self, inp: FlowInput) -> RunStatus:\n"
# Imported for the injected line: the wall clock (time, datetime), random numbers (random, secrets,
# os.urandom), ids (uuid), files and the environment (os), databases (sqlite3), the network (socket,
# urllib.request). Importing them is allowed in workflow code; using them is what the sandbox refuses.
INJECT_MODULES = ("datetime", "os", "random", "secrets", "socket", "sqlite3", "time", "urllib.request", "uuid")


def _workflow_class(inject: str | None):
    if not inject:
        from durable_agents.workflows.agent_flow import AgentFlow

        return AgentFlow
    source = (REPO / "durable_agents" / "workflows" / "agent_flow.py").read_text()
    if source.count(ANCHOR) != 1:
        raise SystemExit("lesson.replay: cannot find where run() begins in durable_agents/workflows/agent_flow.py")
    injected = source.replace(ANCHOR, ANCHOR + f"        import {', '.join(INJECT_MODULES)}  # noqa\n"
                              f"        {inject}  # injected by lesson.replay --inject\n")
    folder = Path(tempfile.mkdtemp(prefix="lesson-replay-"))
    (folder / "injected_flow.py").write_text(injected)
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("injected_flow", folder / "injected_flow.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the injected copy of the workflow from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["injected_flow"] = module
    spec.loader.exec_module(module)
    return module.AgentFlow


async def replay(history: WorkflowHistory, inject: str | None = None) -> str:
    from temporalio.runtime import Runtime, TelemetryConfig

    from durable_agents.flowclient.worker_options import worker_options

    # The refusal is the answer here, one line: the SDK's own logging of the
    # failed workflow task (a traceback, and the core's warning) stays quiet.
    logging.getLogger("temporalio").setLevel(logging.CRITICAL)
    replayer = Replayer(workflows=[_workflow_class(inject)], workflow_runner=worker_options()["workflow_runner"],
                        data_converter=data_converter_from_env(),
                        runtime=Runtime(telemetry=TelemetryConfig(logging=None)))
    events = len(history.events)
    completed = sum(1 for e in history.events if e.HasField("activity_task_completed_event_attributes"))
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is not None:
        text = str(result.replay_failure)
        refused = re.search(r"Cannot access [^ ]+ from inside a workflow", text)
        if refused:
            return (f"REFUSED by the sandbox while replaying {history.workflow_id}: {refused.group(0)} "
                    "(RestrictedWorkflowAccessError): workflow code must be deterministic")
        nondeterminism = re.search(r"\[TMPRL1100\][^\"]*", text)
        if nondeterminism:
            return (f"REFUSED: the code does not make the recorded decisions of {history.workflow_id}: "
                    f"{nondeterminism.group(0)[:300]}")
        own = re.search(r'message: "((?:[^"\\]|\\.)*)"', text)
        if inject and own:
            # Neither the sandbox nor the replay judged it: the line failed by itself (a typo, a name not imported).
            return (f"REFUSED: the injected line {inject!r} failed by itself while replaying {history.workflow_id}, "
                    f"before the sandbox judged it: {own.group(1)[:300]}. It may use {', '.join(INJECT_MODULES)} "
                    '(imported for it), e.g. --inject "time.time()"')
        return f"REFUSED: replaying {history.workflow_id} failed: {text.splitlines()[0][:400]}"
    return (f"replayed {history.workflow_id}: {events} events, {completed} activity results read from history, "
            "0 activities executed; the code made the recorded decisions again")


async def _from_server(run_id: str) -> WorkflowHistory:
    from durable_agents.flowclient.connect import connect

    client = await connect()
    return await client.get_workflow_handle(run_id).fetch_history()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lesson.replay", description=__doc__.splitlines()[0])
    parser.add_argument("history", nargs="?", help="a history file (temporal workflow show --output json)")
    parser.add_argument("--run", help="replay this run's history, fetched from the Temporal server")
    parser.add_argument("--workflow-id", help="default: the file name without .json")
    parser.add_argument("--inject", help="a line of code to put at the start of run(), e.g. 'random.random()' or "
                                         f"'time.time()'; it may use {', '.join(INJECT_MODULES)}")
    args = parser.parse_args(argv)
    if bool(args.history) == bool(args.run):
        parser.error("give a history file or --run RUN_ID (one of them)")
    if args.run:
        history = asyncio.run(_from_server(args.run))
    else:
        path = Path(args.history)
        if not path.is_file():
            print(f"error: no history file at {path}", file=sys.stderr)
            return 2
        history = WorkflowHistory.from_json(args.workflow_id or path.stem, json.loads(path.read_text()))
    line = asyncio.run(replay(history, args.inject))
    print(line, flush=True)
    return 1 if line.startswith("REFUSED") else 0


if __name__ == "__main__":
    from durable_agents.flowclient.connect import exit_now

    exit_now(main())
