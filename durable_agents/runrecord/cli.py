"""``python -m durable_agents.runrecord``: start, resume and inspect runs on the hand-rolled SQLite run record.

    python -m durable_agents.runrecord start RUN_ID "TASK" --email ADDR [--conversation ID] [--param NAME=VALUE ...]
    python -m durable_agents.runrecord loop RUN_ID "TASK" --email ADDR [--max-turns N] [--window-tokens N]
                                            [--window-messages N] [--orders ORDER=CENTS ...]
    python -m durable_agents.runrecord resume RUN_ID [--wait [--wait-limit SECONDS]]
    python -m durable_agents.runrecord retry RUN_ID
    python -m durable_agents.runrecord status RUN_ID [--json]
    python -m durable_agents.runrecord settle RUN_ID [--json]  # on a failed run, records the answer
    python -m durable_agents.runrecord list

The record beside Temporal's history and DBOS's rows is the lab's comparison, run from the lab's side:
``python -m lesson.compare RECORD_RUN_ID --temporal TEMPORAL_RUN_ID`` (the package starts no module of the lab).

Every command takes ``--db PATH`` (default ``$RUNRECORD_DB`` or
``.state/runrecord.db``); start and resume take ``--lease-seconds`` (default
``$RUNRECORD_LEASE_SECONDS`` or 10). ``start`` and ``resume`` are the runner:
they drive the run to its end in this process, printing a line per step.
``--param NAME=VALUE`` gives the run a parameter a step reads (``durable_agents.steps.params``).
The flow is the lab's (``durable_agents.steps.plan.FLOW``), or the one ``LAB_FLOW`` names
(``module:NAME``, ``durable_agents.steps.plan.flow_from_env``); ``status`` and ``resume``
check the run's recorded steps against it.

``loop`` starts a run of the agent loop (``durable_agents.steps.loop``): the model chooses its
tools turn by turn until it answers with no tool call, each turn recorded
before any of its calls runs, each effect applied once. Its numbers (the turn
limit, the window's bounds) are recorded with the run; ``resume``, ``retry``,
``status`` and ``settle`` recognise a loop run from its row and need nothing
more. The model is ``durable_agents.wiring.deps_from_env``'s (``LLM_BASE_URL``, ``LLM_MODEL``;
the scripted offline model by default).

Exit codes:

==  =====================================================================
0   completed (start, loop, resume, retry, status); status of a running run; list; settle
1   the run failed (start, loop, resume, retry, or status of a failed run)
2   bad input (loop: a turn limit or window bound out of range too; nothing recorded), unknown run id,
    a service unreachable (settle), or retry of a run that did not fail
3   start, loop: RUN_ID already exists; nothing was started (resume it instead);
    status: the run is parked (this code's flow differs from the recorded one)
4   resume: the run failed earlier; failed is terminal, refused with the reason
5   resume: another process that may be alive holds the run's lease (named,
    with expiry); with --wait, it still held it at the end of --wait-limit
6   resume: the flow's step list differs from the one the run was started with
7   the lease was lost mid-run (another process took it after it expired)
==  =====================================================================
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from durable_agents.agent import Agent
from durable_agents.providerclient import seed_given
from durable_agents.runrecord import status as status_mod
from durable_agents.runrecord.plans import AgentNotServed, plan_for
from durable_agents.runrecord.runner import (
    APPROVAL_POLL_SECONDS,
    DEFAULT_WAIT_LIMIT,
    FlowChanged,
    Runner,
    RunTerminal,
    check_lease_seconds,
    check_plan,
    lease_seconds_from_env,
)
from durable_agents.runrecord.store import (
    LeaseHeld,
    LeaseLost,
    RecordRunNotFound,
    RunExists,
    RunNotFailed,
    RunRecord,
    SchemaError,
    SettingError,
    db_path_from,
)
from durable_agents.steps import approval as approvals
from durable_agents.steps import loop
from durable_agents.steps.controls import basic_config, printable
from durable_agents.steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
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
from durable_agents.steps.plan import FlowStep, effect_steps, flow_from_env
from durable_agents.steps.refund_agent import REFUND_AGENT
from durable_agents.steps.runstate import exit_code
from durable_agents.steps.served import close_services, serve, warn_unreached_points

(EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_EXISTS, EXIT_TERMINAL, EXIT_LEASE_HELD, EXIT_FLOW_CHANGED,
 EXIT_LEASE_LOST) = range(8)


def _lease(args) -> float:
    return check_lease_seconds(args.lease_seconds) if args.lease_seconds is not None else lease_seconds_from_env()


def _wait_limit(args) -> float:
    if args.wait_limit is None:
        return DEFAULT_WAIT_LIMIT
    try:
        value = float(args.wait_limit)
        if not 0 <= value <= 86400:
            raise ValueError
    except ValueError:
        raise InputError(f"--wait-limit={args.wait_limit!r} must be a number of seconds between 0 and 86400") from None
    return value


def _finish(run, record: RunRecord) -> int:
    print(status_mod.render(run, record.intents(run.run_id), approvals=record.approvals(run.run_id)), flush=True)
    return EXIT_FAILED if run.status == "failed" else EXIT_OK


def _flow() -> tuple[FlowStep, ...]:
    """The flow this process runs: ``LAB_FLOW``'s, or the lab's."""
    try:
        return flow_from_env()
    except ValueError as err:
        raise InputError(str(err)) from None


def _flow_changed(run) -> str | None:
    """Why this code cannot resume ``run`` (its flow differs, or its loop plans other steps), or None."""
    if run.status != "running":
        return None
    try:
        check_plan(run, plan_for(run, _flow()))
    except FlowChanged as err:
        return str(err)
    except AgentNotServed:  # an agent of the user's: its version is checked by the command that runs it
        return None
    return None


def _agents(specs: list[str] | None, recorded: str = "") -> list[Agent]:
    """The agents ``--agent`` names, or, for a run that recorded its agent's import string, that one."""
    given = [agent_given(spec) for spec in specs or ()]
    if not given and recorded:
        given = [agent_given(recorded)]
    return given


def _recorded_spec(args) -> str:
    """The import string of the agent the run ``args.run_id`` names, as its record keeps it ("": none)."""
    path = db_path_from(args.db)
    if not path.exists():
        return ""
    with RunRecord(path) as record:
        try:
            run = record.load(check_run_id(args.run_id))
        except RecordRunNotFound:
            return ""
    return str((run.loop or {}).get("agent_spec") or "")


@asynccontextmanager
async def _runner(args, agents: list[Agent] | None = None) -> AsyncIterator[Runner]:
    """The runner of one command, its steps' parts from the environment; its provider
    client, its memory and its record closed when the command ends, however it ends (memory's
    connection too: its last exchange is then checkpointed into the file, not left to the exit)."""
    from durable_agents.wiring import close_memory, deps_from_env

    try:
        deps = deps_from_env()
    except ValueError as err:  # a model setting the environment got wrong
        raise InputError(str(err)) from err
    served = serve(agents or (), deps)
    warn_unreached_points(served)
    runner = Runner(db_path_from(args.db), deps, flow=_flow(), lease_seconds=_lease(args), agents=served)
    try:
        yield runner
    finally:
        await close_services(served, deps)
        await runner.deps.provider.aclose()
        close_memory(runner.deps.remember)
        runner.close()


async def _cmd_start(args) -> int:
    run_id = check_run_id(args.run_id)
    task = check_task(args.task)
    email = check_email(args.email)
    conversation = check_conversation_id(args.conversation) if args.conversation else None
    params = parse_params(args.param)
    async with _runner(args) as runner:
        return _finish(await runner.start(run_id, task, email, conversation, params=params), runner.record)


async def _cmd_loop(args) -> int:
    run_id = check_run_id(args.run_id)
    task = check_task(args.task)
    agent = agent_given(args.agent)
    email, params = run_params(args, agent)
    # Checked before the record is opened: refused input leaves nothing behind, not even a file.
    max_turns, window_tokens, window_messages = loop_numbers(args, agent=agent)
    seed_given(orders_given(args.orders))
    lab = agent.name == REFUND_AGENT.name
    async with _runner(args, [] if lab else [agent]) as runner:
        run = await runner.start_loop(run_id, task, email, max_turns=max_turns, window_tokens=window_tokens,
                                      window_messages=window_messages, agent="" if lab else agent.name,
                                      params=params, agent_spec="" if lab else args.agent)
        return _finish(run, runner.record)


async def _cmd_resume(args) -> int:
    run_id = check_run_id(args.run_id)
    wait_limit = _wait_limit(args)
    async with _runner(args, _agents(args.agent, _recorded_spec(args))) as runner:
        if runner.record.load(run_id).status == "completed":
            print(f"run {run_id} is already completed; no step to run. Its result:", flush=True)
            return _finish(await runner.resume(run_id), runner.record)  # resume only remembers the exchange
        return _finish(await runner.resume(run_id, wait=args.wait, wait_limit=wait_limit), runner.record)


async def _cmd_retry(args) -> int:
    run_id = check_run_id(args.run_id)
    async with _runner(args, _agents(args.agent, _recorded_spec(args))) as runner:
        return _finish(await runner.restart_failed(run_id), runner.record)


def _cmd_status(args) -> int:
    run_id = check_run_id(args.run_id)
    with RunRecord(db_path_from(args.db)) as record:
        run = record.load(run_id)
        changed = _flow_changed(run)
        waits = record.approvals(run_id)
        status = status_mod.status_of(run, flow_changed=changed, approvals=waits)
        if args.json:
            print(status_mod.dumps(status), flush=True)
        else:
            print(status_mod.render(run, record.intents(run_id), flow_changed=changed, approvals=waits), flush=True)
    return exit_code(status)


def _cmd_decide(args) -> int:
    """``approve``/``deny RUN_ID CALL``: a person's decision on a waiting call, taken in the record (no process
    need be running: the one running the run, or the next resume, reads it there). Its input is checked before
    the record is opened; a decision the record refuses (the call not waiting, already decided otherwise, its
    deadline passed, another digest) is said and exits 2, nothing recorded."""
    run_id = check_run_id(args.run_id)
    asked = approvals.Asked.checked(args.call, args.verdict, args.by, args.reason, args.digest)
    with RunRecord(db_path_from(args.db)) as record:
        record.load(run_id)  # an unknown run: said, exit 2
        wait, _, _ = record.approval(run_id, asked.call)
        verdict, said, _ = record.decide(run_id, asked.decision(wait))
    if verdict == approvals.REJECTED:
        print(printable(f"refused: {said}"), file=sys.stderr, flush=True)
        return EXIT_INPUT
    if verdict == approvals.SAME:
        print(printable(said), flush=True)
        return EXIT_OK
    print(printable(f"decided: {said}"), flush=True)
    print(printable(f"recorded in the run record; the process running {run_id} acts on it within "
                    f"{APPROVAL_POLL_SECONDS:g} s (none running: `python -m durable_agents.runrecord resume "
                    f"{run_id}`)"), flush=True)
    return EXIT_OK


async def _cmd_settle(args) -> int:
    from durable_agents.providerclient import ProviderClient, provider_url_from_env
    from durable_agents.steps.settle import render_settle, settle, settle_advice
    from durable_agents.wiring.settle import settle_loop_calls

    run_id = check_run_id(args.run_id)
    with RunRecord(db_path_from(args.db)) as record:
        run = record.load(run_id)  # unknown id: say so before asking the provider
        if run.loop is not None:
            # Each call asked through its tool's lookup: the agent --agent names, or the one the run recorded.
            agent = settled_agent(args.agent or str(run.loop.get("agent_spec") or ""), str(run.loop.get("agent") or ""),
                                  f"python -m durable_agents.runrecord settle {run_id} --agent MODULE:ATTR")
            report = await settle_loop_calls(status_mod.loop_effect_calls(run), agent)
        else:
            # The run's own effect steps: those that recorded an intent, and those this code's flow says have one.
            keyed = {i.step for i in record.intents(run_id)} | set(effect_steps(_flow()))
            async with ProviderClient(provider_url_from_env(os.environ)) as provider:
                report = await settle(provider, run_id, [s.name for s in run.steps if s.name in keyed])
        settled, notes = _record_answers(record, run, report)
        status = status_mod.status_of(record.load(run_id), flow_changed=_flow_changed(run))
    # What to do next follows from the run's state, as on Temporal: no retry offered for a run retry refuses.
    retry = f"python -m durable_agents.runrecord retry {run_id}"
    refused = (f"run {run_id} reached its turn limit ({run.error}); a retry would ask that turn again under the "
               "same limit. Start a new RUN_ID with a higher --max-turns."
               if run.loop is not None and loop.reached_turn_limit(run.error) else None)
    in_doubt = [step["name"] for step in status["steps"] if step["status"] == "in_doubt"]
    offer, advice = settle_advice(run_id, status["status"], retry=retry, refused=refused, in_doubt=in_doubt,
                                  follow=f"python -m durable_agents.runrecord status {run_id}",
                                  status=f"python -m durable_agents.runrecord status {run_id}")
    print(json.dumps({"run_id": run_id, "steps": report, "run_status": status["status"], "in_doubt": in_doubt,
                      "advice": advice, "recorded": settled}, indent=2) if args.json else
          render_settle(run_id, report, retry=retry if offer else None, recorded=notes, footer=advice), flush=True)
    return EXIT_OK


def _record_answers(record: RunRecord, run, report: list[dict[str, Any]]) -> tuple[dict[str, list[int]],
                                                                                    dict[str, str]]:
    """Record the provider's answers on the run's intents in doubt (``RunRecord.settle_intents``, only
    for a failed run). By step: the attempts settled, and a line saying what the record now holds."""
    from durable_agents.steps.settle import CANNOT_ASK

    steps = {s.name: s for s in run.steps}
    doubtful = {i.position for i in record.intents(run.run_id) if i.state == "in_doubt"}
    asked = {steps[e["step"]].position: (steps[e["step"]].attempts, e) for e in report
             if e["step"] in steps and steps[e["step"]].position in doubtful and e["state"] != CANNOT_ASK}
    unasked = {e["step"] for e in report if e["state"] == CANNOT_ASK}
    done = record.settle_intents(run.run_id, asked) if asked else {}
    settled: dict[str, list[int]] = {}
    notes: dict[str, str] = {}
    for name, step in steps.items():
        if step.position in done:
            settled[name] = done[step.position]
            notes[name] = (f"run record: {status_mod.attempts_text(done[step.position])} settled with this answer; "
                           "the step is no longer in doubt")
        elif step.position in asked and run.status == "running":
            notes[name] = ("run record: not recorded, the run is running: its next attempt repeats the request "
                           f"with the same key, which settles it "
                           f"(`python -m durable_agents.runrecord resume {run.run_id}` if no "
                           "process runs it)")
        elif step.position in asked:
            notes[name] = "run record: not recorded, the run changed while the provider was asked: settle again"
        elif name in unasked and step.position in doubtful:
            notes[name] = ("run record: still in doubt (nothing could be asked): its next attempt sends the same "
                           "key again")
        else:
            notes[name] = "run record: nothing in doubt under this key"
    return settled, notes


def _cmd_list(args) -> int:
    with RunRecord(db_path_from(args.db)) as record:
        runs = record.list_runs()
        if not runs:
            print(f"no runs in {record.path}")
            return EXIT_OK
        print(f"  {'run id':<40} {'status':<10} {'step':<18} {'updated (UTC)':<24} lease")
        for run in runs:
            names = [s.name for s in record.load(run.run_id).steps]
            step = names[run.position] if run.position < len(names) else "-"
            print(printable(f"  {run.run_id:<40} {run.status:<10} {step:<18} "
                            f"{status_mod.iso(run.updated_at):<24} {run.lease_holder or ''}"))
    return EXIT_OK


AGENT_HELP = ("the agent of a loop run of the user's (a durable_agents.Agent by import string); default: the one "
              "the run recorded when it started, else the refund agent")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=None,
                        help="the record's SQLite file (default: $RUNRECORD_DB or .state/runrecord.db)")
    running = argparse.ArgumentParser(add_help=False)
    running.add_argument("--lease-seconds", default=None,
                         help="lease duration (default: $RUNRECORD_LEASE_SECONDS or 10); renewed every third of it")
    parser = argparse.ArgumentParser(prog="python -m durable_agents.runrecord",
                                     description="The agent flow on a SQLite run record.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", parents=[common, running], help="create a run and drive it to the end")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("task", metavar="TASK")
    p.add_argument("--email", required=True, help="where the confirmation email goes")
    p.add_argument("--conversation", default=None, help="conversation id for memory (default: RUN_ID)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter a step of the flow reads (e.g. amount=1250), recorded with the run; repeatable")
    p.set_defaults(func=_cmd_start)
    p = sub.add_parser(
        "loop", parents=[common, running],
        help="create a run of the agent loop and drive it to the end: the model chooses its tools turn by turn",
        description="Create a run of the agent loop (durable_agents.steps.loop) and drive it to the end. "
                    "Each turn the model is "
                    "asked, on a window of the conversation derived from the record, and chooses tools "
                    f"(the refund agent's {', '.join(loop.TOOL_NAMES)}, or --agent's); the turn is recorded "
                    "before any of its calls runs, and each "
                    "call's effect is applied once, under a key from the run, the turn and the call. The run "
                    "completes when a turn asks for no tool (its text is the final answer) and fails when the "
                    "turn limit is reached with tools still asked for. Resume, retry, status and settle take "
                    "its RUN_ID like any other run's.")
    add_loop_arguments(p)
    p.set_defaults(func=_cmd_loop)
    p = sub.add_parser("resume", parents=[common, running],
                       help="continue a run (of the flow or the agent loop) at its recorded step")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--wait", action="store_true",
                   help="if a process that may be alive holds the lease, wait until it ends, lets the lease "
                        "expire or dies, instead of refusing (exit 5); a dead process on this host is taken "
                        "over at once either way")
    p.add_argument("--wait-limit", default=None, metavar="SECONDS",
                   help=f"with --wait, give up (exit 5) after this long (default {DEFAULT_WAIT_LIMIT:.0f})")
    p.add_argument("--agent", action="append", default=[], metavar="MODULE:ATTR", help=AGENT_HELP)
    p.set_defaults(func=_cmd_resume)
    p = sub.add_parser("retry", parents=[common, running],
                       help="restart a failed run at its failed step (fresh budget, same keys)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--agent", action="append", default=[], metavar="MODULE:ATTR", help=AGENT_HELP)
    p.set_defaults(func=_cmd_retry)
    p = sub.add_parser("settle", parents=[common],
                       help="ask, by key, whether each effect was applied (the provider; a loop call's own service, "
                            "through its tool's lookup); on a failed run, record the answer on the intents in doubt")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--agent", default=None, metavar="MODULE:ATTR",
                   help="a loop run's agent by import string, whose tools' lookups ask their services (default: "
                        "the one the run recorded)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_settle)
    p = sub.add_parser("status", parents=[common], help="the run's steps, attempts, results, intents and lease")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--json", action="store_true", help="exactly the shape of `starter.py status --json`")
    p.set_defaults(func=_cmd_status)
    add_decision_commands(sub, [common], _cmd_decide)
    p = sub.add_parser("list", parents=[common], help="every run in the record")
    p.set_defaults(func=_cmd_list)
    return parser


# How each refusal is worded and which exit code it gets.
_REFUSALS: dict[type[Exception], tuple[str, int]] = {
    RunExists: ("error", EXIT_EXISTS),
    RunTerminal: ("refused", EXIT_TERMINAL),
    LeaseHeld: ("refused", EXIT_LEASE_HELD),
    FlowChanged: ("refused", EXIT_FLOW_CHANGED),
    LeaseLost: ("stopped", EXIT_LEASE_LOST),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        print("error: compare is the lab's, not the package's: run `python -m lesson.compare "
              f"{' '.join(argv[1:]) or 'RECORD_RUN_ID --temporal TEMPORAL_RUN_ID'}` from the lab's checkout",
              file=sys.stderr)
        return EXIT_INPUT
    args = _parser().parse_args(argv)
    # Warnings from the steps (memory unavailable, a model's unusable answer) as
    # Python's last-resort handler prints them, escaped like every other line.
    basic_config(logging.WARNING, "%(message)s")
    # SIGTERM behaves like Ctrl-C: the runner hands its lease back before exiting.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = args.func(args)
        return asyncio.run(result) if asyncio.iscoroutine(result) else result
    except (InputError, RecordRunNotFound, SchemaError, SettingError, ConnectionError, RunNotFailed) as err:
        print(printable(f"error: {err}"), file=sys.stderr, flush=True)
        return EXIT_INPUT
    except tuple(_REFUSALS) as err:
        word, code = next(v for kind, v in _REFUSALS.items() if isinstance(err, kind))
        print(printable(f"{word}: {err}"), file=sys.stderr, flush=True)
        return code
    except KeyboardInterrupt:
        print("interrupted; the lease was released: resume to continue", file=sys.stderr, flush=True)
        return 130
