"""``python -m durable_agents.dbosflow``: the agent flow on DBOS Transact (SQLite, no server; or PostgreSQL).

    python -m durable_agents.dbosflow start RUN_ID "TASK" --email ADDR [--conversation ID] [--param NAME=VALUE ...]
    python -m durable_agents.dbosflow loop RUN_ID "TASK" --email ADDR [--max-turns N] [--window-tokens N]
                                           [--window-messages N] [--orders ORDER=CENTS ...]
    python -m durable_agents.dbosflow loop RUN_ID "TASK" --agent MODULE:ATTR [--param NAME=VALUE ...] [...]
    python -m durable_agents.dbosflow resume RUN_ID [--agent MODULE:ATTR]
    python -m durable_agents.dbosflow status RUN_ID [--json]
    python -m durable_agents.dbosflow steps RUN_ID [--json] # DBOS's own rows for the run, as it stores them
    python -m durable_agents.dbosflow list

``loop`` starts a run of the agent loop (``durable_agents.steps.loop``; ``durable_agents.dbosflow.loop``):
each turn and each tool call a DBOS step, the model chooses its tools until
it answers with no tool call, each turn recorded before any of its calls
runs, each effect applied once. Its numbers (the turn limit, the window's
bounds) are recorded with the run's inputs; ``resume`` and ``status``
recognise a loop run by its workflow and need nothing more. A loop run has
the loop's application version (``durable_agents.dbosflow.loop.loop_app_version``, derived
from the loop's shape; ``DBOSFLOW_LOOP_APP_VERSION`` overrides it), so
``loop`` and ``resume`` of a loop run recover the pending loop runs of that
version, ``start`` and ``resume`` of a flow run the pending flow runs. The
model is ``durable_agents.wiring.deps_from_env``'s (``LLM_BASE_URL``, ``LLM_MODEL``; the
scripted offline model by default).

Every command takes ``--db PATH`` or ``--db URL`` (default ``$DBOSFLOW_DB`` or
``.state/dbosflow.db``: DBOS's system database; a path is SQLite, a
``postgresql://`` URL PostgreSQL, ``durable_agents.dbosflow.sysdb``; ``python -m lab.postgres``
runs a server for it). ``start`` and ``resume``
launch DBOS in this process and wait for the run, printing ``step <name>
started: run <id> attempt <n>`` for every execution and ``HH:MM:SS <name>:
completed (attempt n)`` for every step DBOS records.

``resume`` is DBOS's recovery: launching DBOS re-dispatches **every** pending
run of this application version in the database (not only RUN_ID), then the
command waits for RUN_ID and for those (``start`` launches DBOS too, so it
recovers them as well). A run of another version is not recovered (exit 6).
The flow is the lab's (``durable_agents.steps.plan.FLOW``), or the one ``LAB_FLOW`` names
(``module:NAME``); the application version is derived from it
(``durable_agents.dbosflow.engine.app_version``). Before launching, ``start`` and ``resume``
check every pending run the launch would recover against this process's
flow, and refuse (exit 6, nothing launched) rather than let DBOS dispatch a
run into another flow's steps. ``--param NAME=VALUE`` gives the run a
parameter a step reads (``durable_agents.steps.params``), recorded with its inputs.
``status``, ``steps`` and ``list`` only read (``DBOSClient``): nothing is
recovered by looking. ``steps --json`` prints ``durable_agents.dbosflow.compare.dbos_side``:
the lab's ``python -m lesson.compare ... --dbos RUN_ID`` runs it for its DBOS column, so the
comparison imports nothing of this engine.

Exit codes, as ``python -m durable_agents.runrecord`` where they mean the same:

==  =====================================================================
0   completed (start, loop, resume, status); status of a running run; steps; list
1   the run failed (start, loop, resume, status): a step's error (loop: the turn limit), DBOS's dead letter,
    a changed flow
2   bad input (loop: a turn limit or window bound out of range too; nothing recorded), unknown run id
3   start, loop: RUN_ID already exists (resume it); status: parked (another application version, or another
    flow or loop)
4   resume: the run has failed; DBOS does not run a failed workflow again on launch
6   resume: the run belongs to another application version, or another flow or loop; start, loop, resume: a
    pending run the launch would recover was started by another flow or loop; nothing was launched
==  =====================================================================
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from durable_agents.agent import Agent
from durable_agents.memory import chat_tokens
from durable_agents.providerclient import seed_given
from durable_agents.steps.controls import printable
from durable_agents.steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
from durable_agents.steps.loop import start_tokens
from durable_agents.steps.loopargs import (
    add_decision_commands,
    add_loop_arguments,
    agent_given,
    loop_numbers,
    orders_given,
    run_params,
    settled_agent,
)
from durable_agents.steps.params import parse_params
from durable_agents.steps.plan import missing_params
from durable_agents.steps.refund_agent import REFUND_AGENT
from durable_agents.steps.runstate import exit_code
from durable_agents.steps.served import Served, serve, warn_unreached_points

if TYPE_CHECKING:
    from durable_agents.dbosflow.sysdb import SystemDb
    from durable_agents.steps.retry import RetryRule

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_EXISTS, EXIT_TERMINAL, EXIT_VERSION = 0, 1, 2, 3, 4, 6


def _db(args) -> SystemDb:
    from durable_agents.dbosflow.engine import db_path_from

    return db_path_from(args.db)


def _set_flow() -> None:
    """This process's flow (``LAB_FLOW``, or the lab's), given to the engine before anything reads its version."""
    from durable_agents.dbosflow import engine
    from durable_agents.steps.plan import flow_from_env

    try:
        engine.set_flow(flow_from_env())
    except ValueError as err:
        raise InputError(str(err)) from err


def _retry_rule() -> RetryRule:
    """The run's retry rule (``durable_agents.steps.retry.rule_from_env``); a bad one is bad input."""
    from durable_agents.steps.retry import rule_from_env

    try:
        return rule_from_env()
    except ValueError as err:
        raise InputError(str(err)) from err


def _exists(db: SystemDb, run_id: str) -> bool:
    """Whether RUN_ID is already in ``db``; if so, says on stderr that nothing was started and what to do."""
    from durable_agents.dbosflow.status import DbosRunNotFound, read

    try:
        read(db, run_id)
    except DbosRunNotFound:
        return False
    print(f"error: run {run_id} already exists in {db}; nothing was started. Resume it "
          f"(python -m durable_agents.dbosflow resume {run_id}) or pick a new RUN_ID", file=sys.stderr, flush=True)
    return True


def _print_status(db: SystemDb, run_id: str) -> int:
    from durable_agents.dbosflow import status as st

    raw = st.read(db, run_id)
    status = st.status_of(raw)
    print(st.render(status, raw), flush=True)
    return exit_code(status)


@asynccontextmanager
async def _launched(db: SystemDb, version: str | None = None) -> AsyncIterator[None]:
    """DBOS launched in this process on ``db`` under ``version`` (the flow's by default), recovering that
    version's pending runs, for the body; the steps' clients closed and DBOS destroyed when it ends, however
    it ends. Both workflows are registered (the flow's and the loop's), so a run of either kind that the
    launch recovers finds its function."""
    from dbos import DBOS

    from durable_agents.dbosflow import engine
    from durable_agents.dbosflow import loop as _loop_workflow  # noqa: F401 - registers the agent loop's workflow with DBOS
    from durable_agents.wiring import deps_from_env

    env = dict(os.environ)
    try:
        deps_from_env(env)  # configuration errors (provider URL, model, memory) before anything runs
    except ValueError as err:
        raise InputError(str(err)) from err
    engine.set_environment(lambda: deps_from_env(env), db, flow=engine.current_flow())
    engine.configure(db, version=version)
    await asyncio.to_thread(DBOS.launch)
    try:
        yield
    finally:
        await engine.close_deps()
        await asyncio.to_thread(DBOS.destroy)


def _pending(db: SystemDb, version: str) -> list[str]:
    """The runs DBOS will recover when this process launches: PENDING, of this version."""
    from durable_agents.dbosflow.status import DbosRunNotFound, client

    try:
        c = client(db)
    except DbosRunNotFound:
        return []
    try:
        return [wf.workflow_id for wf in c.list_workflows(status="PENDING", app_version=version)]
    finally:
        c.destroy()


def _mismatched(db: SystemDb, run_ids: list[str]) -> str | None:
    """Why launching would mis-resume one of ``run_ids`` (pending runs it would recover), or None."""
    from durable_agents.dbosflow.status import plan_mismatch, read

    for run_id in run_ids:
        mismatch = plan_mismatch(read(db, run_id))
        if mismatch is not None:
            return f"run {run_id}: {mismatch}"
    return None


def _refuse_mismatched(db: SystemDb, version: str, recovered: list[str]) -> int | None:
    """EXIT_VERSION, said why, when a run this launch would recover was started by another flow."""
    mismatch = _mismatched(db, recovered)
    if mismatch is None:
        return None
    print(f"refused: launching DBOS under application version {version!r} would recover every pending run of that "
          f"version, and {mismatch}. DBOS would run this code's steps against that run's record (and end it in "
          "DBOSUnexpectedStepError), so nothing was launched. Resume it with the code that started it, or launch "
          "under this code's own version (unset DBOSFLOW_APP_VERSION, or DBOSFLOW_LOOP_APP_VERSION for a loop "
          "run).", file=sys.stderr, flush=True)
    return EXIT_VERSION


async def _finish(run_id: str) -> None:
    from dbos import DBOS, WorkflowHandleAsync

    from durable_agents.dbosflow.engine import RESULT_POLL_SECONDS

    handle: WorkflowHandleAsync[Any] = await DBOS.retrieve_workflow_async(run_id)
    try:
        await handle.get_result(polling_interval_sec=RESULT_POLL_SECONDS)
    except Exception:  # noqa: BLE001 - the run failed; its status says how, in the lab's words
        pass


async def _wait(db: SystemDb, run_id: str, recovered: list[str]) -> int:
    """Wait for RUN_ID, and for every other run this launch recovered: exiting
    while they run would cut them off like a crash (each would cost a recovery)."""
    others = [r for r in recovered if r != run_id]
    if others:
        print(f"DBOS recovered {len(others)} other pending run(s) of this version on launch: {', '.join(others)}; "
              "waiting for them too", flush=True)
    await asyncio.gather(*(_finish(r) for r in [run_id, *others]))
    from durable_agents.dbosflow import status as st

    for other in others:
        print(f"also recovered: run {other}: {st.status_of(st.read(db, other))['status']}", flush=True)
    return _print_status(db, run_id)


async def _cmd_start(args) -> int:
    from durable_agents.dbosflow import engine

    run_id = check_run_id(args.run_id)
    task, email = check_task(args.task), check_email(args.email)
    conversation = check_conversation_id(args.conversation or run_id)
    params = parse_params(args.param)
    rule = _retry_rule()
    _set_flow()
    missing = missing_params(engine.current_flow(), params)
    if missing is not None:
        raise InputError(f"run {run_id} was not started: {missing}")
    db = _db(args)
    if _exists(db, run_id):
        return EXIT_EXISTS
    recovered = _pending(db, engine.app_version())
    refused = _refuse_mismatched(db, engine.app_version(), recovered)
    if refused is not None:
        return refused
    async with _launched(db):
        await engine.start_run(run_id, engine.new_inputs(run_id, task, email, conversation,
                                                         secrets.token_hex(8), rule, params=params))
        print(f"run {run_id} started in {db} (DBOS workflow id {run_id}, application version "
              f"{engine.app_version()})", flush=True)
        return await _wait(db, run_id, recovered)


def _serve(agent: Agent) -> Served:
    """``agent`` as this process's (``durable_agents.dbosflow.loop.serve_agent``): its services built here."""
    from durable_agents.dbosflow import loop as dbos_loop

    served = serve([agent])[0]
    warn_unreached_points([served])
    dbos_loop.serve_agent(served)
    return served


async def _cmd_loop(args) -> int:
    from durable_agents.dbosflow import loop as dbos_loop

    run_id = check_run_id(args.run_id)
    task = check_task(args.task)
    agent = agent_given(args.agent)
    email, params = run_params(args, agent)
    # Checked before the database is opened: refused input leaves nothing behind, not even a file.
    max_turns, window_tokens, window_messages = loop_numbers(args, start_tokens(task, chat_tokens, agent.instructions),
                                                             agent=agent)
    served = _serve(agent)
    seed_given(orders_given(args.orders))
    rule = _retry_rule()
    _set_flow()  # a flow run this launch recovers (a shared DBOSFLOW_*_APP_VERSION) is checked against it
    db = _db(args)
    if _exists(db, run_id):
        return EXIT_EXISTS
    version = dbos_loop.loop_app_version()
    recovered = _pending(db, version)
    refused = _refuse_mismatched(db, version, recovered)
    if refused is not None:
        return refused
    async with _launched(db, version):
        await dbos_loop.start_loop_run(run_id, dbos_loop.new_loop_inputs(
            run_id, task, email, secrets.token_hex(8), rule, max_turns=max_turns, window_tokens=window_tokens,
            window_messages=window_messages, served=served, params=params,
            agent_spec=args.agent if args.agent and served.name != REFUND_AGENT.name else ""))
        print(f"loop run {run_id} started in {db} (DBOS workflow id {run_id}, application version {version}; "
              f"at most {max_turns} turns)", flush=True)
        return await _wait(db, run_id, recovered)


async def _cmd_resume(args) -> int:
    from durable_agents.dbosflow import engine
    from durable_agents.dbosflow.loop import loop_app_version
    from durable_agents.dbosflow.status import is_loop, read, recorded_inputs, version_refusal

    run_id = check_run_id(args.run_id)
    _set_flow()
    db = _db(args)
    raw = read(db, run_id)  # unknown id: say so before launching anything
    before = raw["workflow"]
    if is_loop(before):  # the agent it names: --agent, or the import string it recorded
        spec = args.agent or str((recorded_inputs(before) or {}).get("agent_spec") or "")
        _serve(agent_given(spec))
    # A process launches under one version: the loop's for a loop run, the flow's for a flow run.
    version = loop_app_version() if is_loop(before) else engine.app_version()
    if before.status == "SUCCESS":
        print(f"run {run_id} is already completed; no step to run. Its result:", flush=True)
        return _print_status(db, run_id)
    if before.status in ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
        _print_status(db, run_id)
        print(f"refused: run {run_id} is {before.status} in DBOS; DBOS does not run a failed workflow again on "
              "launch, so nothing was done", file=sys.stderr, flush=True)
        return EXIT_TERMINAL
    if before.app_version != version:
        print(f"refused: run {run_id} was {version_refusal(raw, version, engine.current_flow())}. Launching here "
              "would leave it waiting, so nothing was launched.", file=sys.stderr, flush=True)
        return EXIT_VERSION
    recovered = _pending(db, version)
    refused = _refuse_mismatched(db, version, sorted(set(recovered) | {run_id}))
    if refused is not None:
        return refused
    async with _launched(db, version):
        print(f"launched DBOS (application version {version}): it recovers every pending run of that version in "
              f"{db}; run {run_id} was at dispatch {before.recovery_attempts}", flush=True)
        return await _wait(db, run_id, recovered)


def _cmd_status(args) -> int:
    from durable_agents.dbosflow import status as st

    run_id = check_run_id(args.run_id)
    _set_flow()
    db = _db(args)
    raw = st.read(db, run_id)
    status = st.status_of(raw, version=_recorded_agent_version(raw))
    print(st.dumps(status) if args.json else st.render(status, raw), flush=True)
    return exit_code(status)


def _recorded_agent_version(raw: dict) -> str | None:
    """The version of the agent a loop run recorded (by its import string), for ``status``: a run of an agent
    of the user's is read as a process serving that agent would (parked only if that agent's code changed).
    None (this process's) for a flow run, the refund agent's runs, or an agent that cannot be loaded here."""
    from durable_agents.dbosflow.loop import loop_app_version
    from durable_agents.dbosflow.status import is_loop, recorded_inputs
    from durable_agents.steps.served import Served

    spec = str((recorded_inputs(raw["workflow"]) or {}).get("agent_spec") or "")
    if not is_loop(raw["workflow"]) or not spec:
        return None
    try:
        return loop_app_version(served=Served(agent_given(spec)))
    except (InputError, ValueError):
        return None


DECISION_SEEN_SECONDS = 3.0
"""How long ``approve``/``deny`` watch for the running process to record the decision before saying it is kept."""


def _cmd_decide(args) -> int:
    """``approve``/``deny RUN_ID CALL``: a person's decision on a waiting call, sent as a DBOS message on the
    call's topic (kept in the system database with no process running; the decision's id as the send's
    idempotency key, so the same decision twice is one message). Judged first against the run's rows
    (``durable_agents.steps.approval.judge``): refused, exit 2, nothing sent. Then the process running the run
    records it within a moment ("decided"), or none runs ("kept")."""
    from durable_agents.dbosflow import status as st
    from durable_agents.dbosflow.loop import DECISION_STEP
    from durable_agents.steps import approval as approvals

    run_id = check_run_id(args.run_id)
    asked = approvals.Asked.checked(args.call, args.verdict, args.by, args.reason, args.digest)
    call = asked.call
    db = _db(args)
    raw = st.read(db, run_id)  # an unknown run: said, exit 2
    found = {w.call: (w, d, outcome) for w, d, outcome in st.approvals_of(raw)}
    wait, decided, outcome = found.get(call, (None, None, None))
    decision = asked.decision(wait)
    ran = any(r["function_name"] == call for r in raw["steps"])
    verdict, said = approvals.judge(wait, decided, decision, ran=ran,
                                    expired=approvals.ended_by_deadline(wait, outcome, time.time()))
    if verdict == approvals.REJECTED:
        print(printable(f"refused: {said}"), file=sys.stderr, flush=True)
        return EXIT_INPUT
    if verdict == approvals.SAME:
        print(printable(said), flush=True)
        return EXIT_OK
    c = st.client(db)
    try:
        c.send(run_id, decision.to_json(), topic=call, idempotency_key=decision.id)
    finally:
        c.destroy()
    deadline = time.monotonic() + DECISION_SEEN_SECONDS
    while time.monotonic() < deadline:
        rows = {r["function_name"]: r for r in st.read(db, run_id)["steps"]}
        row = rows.get(f"{call}/{DECISION_STEP}")
        if row is not None and isinstance(row["output"], dict):
            taken = row["output"]["result"].get("decision") or {}
            if taken.get("id") == decision.id:
                print(printable(f"decided: {said}"), flush=True)
                return EXIT_OK
            print(printable(f"refused: {call}: already {row['output']['result'].get('outcome')} by another "
                            "decision, taken first"), file=sys.stderr, flush=True)
            return EXIT_INPUT
        time.sleep(0.2)
    print(printable(f"kept: {call}: sent as a DBOS message, kept in the system database; no process took it "
                    f"within {DECISION_SEEN_SECONDS:g} s: the one running {run_id} takes it, or the next "
                    f"`python -m durable_agents.dbosflow resume {run_id}` ({decision.said()})"), flush=True)
    return EXIT_OK


async def _cmd_settle(args) -> int:
    """What the services hold under each of the run's effect keys (``durable_agents.steps.settle``): a loop run's calls
    through their tools' lookups, a flow run's steps at the provider. It reads and asks; DBOS's record is
    not written (a resume's next attempt sends the same key, and the service answers it once)."""
    from durable_agents.dbosflow import engine
    from durable_agents.dbosflow import status as st
    from durable_agents.providerclient import ProviderClient, provider_url_from_env
    from durable_agents.steps.plan import effect_steps
    from durable_agents.steps.settle import render_settle, settle
    from durable_agents.wiring.settle import settle_loop_calls

    run_id = check_run_id(args.run_id)
    _set_flow()
    raw = st.read(_db(args), run_id)  # unknown id: say so before asking anything
    recorded = st.recorded_inputs(raw["workflow"]) or {}
    if st.is_loop(raw["workflow"]):
        agent = settled_agent(args.agent or str(recorded.get("agent_spec") or ""), str(recorded.get("agent") or ""),
                              f"python -m durable_agents.dbosflow settle {run_id} --agent MODULE:ATTR")
        report = await settle_loop_calls(st.loop_effect_calls(raw), agent)
    else:
        async with ProviderClient(provider_url_from_env(os.environ)) as provider:
            report = await settle(provider, run_id, effect_steps(engine.current_flow()))
    status = st.status_of(raw)
    print(json.dumps({"run_id": run_id, "steps": report, "run_status": status["status"]}, indent=2) if args.json
          else render_settle(run_id, report, retry=None,
                             footer="DBOS's record is not changed: "
                             f"`python -m durable_agents.dbosflow resume {run_id}` runs an "
                                    "open run on, each call under its same key"), flush=True)
    return EXIT_OK


def _cmd_steps(args) -> int:
    from durable_agents.dbosflow.compare import dbos_side

    run_id = check_run_id(args.run_id)
    _set_flow()
    side = dbos_side(_db(args), run_id)
    if args.json:
        print(json.dumps(side, indent=2, default=str), flush=True)
        return EXIT_OK
    wf = side["workflow"]
    print(f"workflow_status: {wf['workflow_id']} {wf['status']} version {wf['app_version']} "
          f"recovery_attempts {wf['recovery_attempts']} executor {wf['executor_id']}")
    print(f"  {'id':>2} {'function_name':<18} {'started (UTC)':<24} {'completed (UTC)':<24} {'bytes':>5}  output/error")
    for row in side["rows"]:
        print(f"  {row['function_id']:>2} {row['name']:<18} {row['started_at'] or '-':<24} "
              f"{row['completed_at'] or '-':<24} {row['bytes']:>5}  {row['summary']}")
    t = side["totals"]
    print(f"  totals: {t['rows']} rows, {t['bytes']} bytes ({t['detail']})")
    return EXIT_OK


def _cmd_list(args) -> int:
    from durable_agents.dbosflow.status import DbosRunNotFound, client

    db = _db(args)
    try:
        c = client(db)
    except DbosRunNotFound:
        print(f"no runs in {db}")
        return EXIT_OK
    try:
        for wf in c.list_workflows():
            print(f"  {wf.workflow_id:<40} {wf.status:<32} version {wf.app_version}  dispatches {wf.recovery_attempts}")
    finally:
        c.destroy()
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    from durable_agents.steps import loop

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=None,
                        help="DBOS's system database: a SQLite file or a postgresql:// URL "
                             "(default: $DBOSFLOW_DB or .state/dbosflow.db)")
    parser = argparse.ArgumentParser(
        prog="python -m durable_agents.dbosflow",
        description="The agent flow and the agent loop on DBOS Transact (SQLite or PostgreSQL).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", parents=[common], help="start a run (DBOS workflow id = RUN_ID) and wait for it")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("task", metavar="TASK")
    p.add_argument("--email", required=True)
    p.add_argument("--conversation", default=None)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter a step of the flow reads (e.g. amount=1250), recorded with the run; repeatable")
    p.set_defaults(func=_cmd_start)
    p = sub.add_parser(
        "loop", parents=[common],
        help="start a run of the agent loop (DBOS workflow id = RUN_ID) and wait for it: the model chooses its "
             "tools turn by turn",
        description="Start a run of the agent loop (durable_agents.steps.loop) as a DBOS workflow and wait for it. "
                    "Each turn the "
                    "model is asked, on a window of the conversation derived from DBOS's recorded step outputs, "
                    f"and chooses tools ({', '.join(loop.TOOL_NAMES)}); each turn and each tool call is a DBOS "
                    "step, the turn's output recorded before any of its calls runs, each call's effect applied "
                    "once under a key from the run, the turn and the call. The run completes when a turn asks "
                    "for no tool (its text is the final answer) and fails when the turn limit is reached with "
                    "tools still asked for. Resume and status take its RUN_ID like any other run's.")
    add_loop_arguments(p)
    p.set_defaults(func=_cmd_loop)
    p = sub.add_parser("resume", parents=[common],
                       help="launch DBOS (recovering pending runs of the run's version) and wait for RUN_ID")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--agent", default=None, metavar="MODULE:ATTR",
                   help="a loop run's agent (a durable_agents.Agent by import string); default: the one the run "
                        "recorded, else the refund agent. A process serves one agent: its application version")
    p.set_defaults(func=_cmd_resume)
    p = sub.add_parser("status", parents=[common], help="the run in the shared status vocabulary (reads only)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true", help="exactly the shape of `starter.py status --json`")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("settle", parents=[common],
                       help="ask each effect's service, by key, whether it was applied (reads only)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--agent", default=None, metavar="MODULE:ATTR",
                   help="a loop run's agent by import string, whose tools' lookups ask their services (default: "
                        "the one the run recorded, else the refund agent)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_settle)
    p = sub.add_parser("steps", parents=[common], help="DBOS's recorded rows for the run (reads only)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_steps)
    add_decision_commands(sub, [common], _cmd_decide)
    p = sub.add_parser("list", parents=[common], help="every run in the database")
    p.set_defaults(func=_cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    from durable_agents.dbosflow.status import DbosRunNotFound
    from durable_agents.dbosflow.sysdb import DatabaseUnreachable

    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = args.func(args)
        return asyncio.run(result) if asyncio.iscoroutine(result) else result
    except (InputError, DbosRunNotFound, DatabaseUnreachable) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("interrupted: the run stays PENDING in DBOS; resume recovers it", file=sys.stderr, flush=True)
        return 130
