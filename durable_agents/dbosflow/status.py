"""A DBOS run's status in the shared vocabulary (``durable_agents.steps.runstate``), read
with ``DBOSClient`` (DBOS's own reader: no launch, so nothing is recovered
by looking).

How DBOS's record maps onto the words:

- workflow ``SUCCESS`` -> run **completed**; ``ERROR`` -> **failed** (the
  error is the lab's ``step <name> failed after <n> attempt(s): ...``, or
  DBOS's own, e.g. a step name that differs from the recorded one);
  ``MAX_RECOVERY_ATTEMPTS_EXCEEDED`` (DBOS's dead letter, its backstop
  behind the run's own worker-death limit) -> **failed**, naming the step the
  run was at; ``CANCELLED`` -> **failed**;
  ``PENDING``/``ENQUEUED`` -> **running**, or **parked** when the run was
  started under another application version than this code's (DBOS recovers
  it only in a process of its own version), or by another flow than this
  process's (``plan_mismatch``: launching it here would mis-resume it).
- the steps are the run's own: those of the flow its inputs recorded
  (``durable_agents.steps.plan.plan_signature``: names and kinds), or, for a run started
  before inputs recorded it, those of this process's flow.
- a step with an output row -> **completed** (or **adopted**); with an error
  row -> **failed**, or **in_doubt** for an effect step one of whose recorded
  errors may have been applied, as on the other engines: a ``StepError`` that
  says so (a 5xx, a timeout, an unreadable 2xx), a death too many
  (``WorkerDeaths``: the process may have died mid-request), DBOS's step
  timeout or any other unexpected exception (nothing says the request was not
  sent). DBOS keeps every attempt's error when its retries are spent
  (``DBOSMaxStepRetriesExceeded.errors``), only the last one otherwise.
- a run of the agent loop (workflow ``agent_loop``, ``durable_agents.dbosflow.loop``): its
  steps are those its recorded outputs decide (``durable_agents.steps.loop.LoopPlan.names``:
  every recorded turn's calls, then the next turn), a call an effect step
  when its recorded turn asks for a tool with one; it is parked under another
  version than the loop's (``loop_app_version``) or another loop's signature.
  ``render`` adds the loop turn by turn (``loop_lines``): each turn's calls,
  each call's key, status and result, the final answer.
- the first step without a row in a pending run -> **running**: DBOS records
  neither that an attempt started nor which process is alive, so "running"
  and "waiting for a process to recover it" look the same (the note says so).

Attempts and crashes per step come from what the lab adds to each output
(the dispatch that ran it, the attempt within it) and DBOS's
``recovery_attempts`` (one per dispatch): every dispatch between the one
that recorded the previous step and the one that recorded this step died
while this step was next.
"""

from __future__ import annotations

import json
from typing import Any

from durable_agents.dbosflow.engine import (
    RECOVERY_BACKSTOP,
    VERSION_ENV,
    WORKFLOW_NAME,
    StepFailed,
    WorkerDeaths,
    app_version,
    current_flow,
    flow_changed,
)
from durable_agents.dbosflow.loop import (
    DECISION_STEP,
    LOOP_RECOVERY_BACKSTOP,
    LOOP_VERSION_ENV,
    LOOP_WORKFLOW_NAME,
    WAIT_STEP,
    loop_app_version,
    loop_changed,
    no_window,
)
from durable_agents.steps import approval as approvals
from durable_agents.steps import loop
from durable_agents.steps.controls import printable
from durable_agents.steps.errors import StepError
from durable_agents.steps.limits import InputError
from durable_agents.steps.plan import FlowStep, plan_signature
from durable_agents.steps.runstate import RunEntry, StepEntry, describe_step, iso, run_entry, step_entry
from durable_agents.steps.runview import render_table


class DbosRunNotFound(LookupError):
    """No such run in DBOS's system database, or no database yet (``TemporalRunNotFound`` and
    ``RecordRunNotFound`` are the other engines' answers)."""


def client(db):
    from dbos import DBOSClient

    from durable_agents.dbosflow.legacy import accept_pre_0_2_pickles
    from durable_agents.dbosflow.sysdb import system_db

    accept_pre_0_2_pickles()  # errors pickled by 0.1.0 name its modules by their old names
    db = system_db(db)  # a path (SQLite) or a URL (PostgreSQL): durable_agents.dbosflow.sysdb
    if not db.exists():
        raise DbosRunNotFound(f"no DBOS system database at {db}: start a run first "
                              "(python -m durable_agents.dbosflow start ...)")
    return DBOSClient(system_database_url=db.url)


def read(db, run_id: str) -> dict[str, Any]:
    """What DBOS holds for ``run_id``: ``{"workflow": WorkflowStatus, "steps": [StepInfo]}``."""
    c = client(db)
    try:
        found = c.list_workflows(workflow_ids=[run_id])
        if not found:
            raise DbosRunNotFound(f"no run {run_id!r} in {db}: check the id, or start it with "
                                  "python -m durable_agents.dbosflow start")
        return {"workflow": found[0], "steps": c.list_workflow_steps(run_id)}
    finally:
        c.destroy()


def _ms(value: int | None) -> str | None:
    return iso(value / 1000) if value is not None else None


def recorded_inputs(wf: Any) -> dict[str, Any] | None:
    """The run's inputs as DBOS recorded them (the workflow's one argument), or None when read without them."""
    inputs = getattr(wf, "input", None)
    args = inputs.get("args") if isinstance(inputs, dict) else None
    first = args[0] if args else None
    return first if isinstance(first, dict) else None


def recorded_plan(wf: Any) -> list[str] | None:
    """The flow's signature the run's inputs recorded (``durable_agents.dbosflow.engine.new_inputs``); None for a run
    started before inputs recorded it, or a status read without its inputs."""
    plan = (recorded_inputs(wf) or {}).get("plan")
    return [str(entry) for entry in plan] if isinstance(plan, list) else None


def is_loop(wf: Any) -> bool:
    """The run is one of the agent loop (``durable_agents.dbosflow.loop``), by the workflow DBOS recorded it under."""
    return getattr(wf, "name", None) == LOOP_WORKFLOW_NAME


def plan_mismatch(raw: dict[str, Any], flow: tuple[FlowStep, ...] | None = None) -> str | None:
    """Why a process of ``flow`` (this process's, by default) would mis-resume the run, or None: the flow its
    inputs recorded differs; or, for a run recorded before inputs held it, a step DBOS recorded is not the
    flow's step at that position (DBOS would end the run in ``DBOSUnexpectedStepError``). For a loop run:
    the loop's signature its inputs recorded differs from this code's
    (``durable_agents.dbosflow.loop.loop_changed``)."""
    if is_loop(raw["workflow"]):
        inputs = recorded_inputs(raw["workflow"]) or {}
        if inputs.get("agent"):  # an agent of the user's: its version is its application version's
            return None
        return loop_changed(inputs.get("loop"))
    flow = flow or current_flow()
    recorded = recorded_plan(raw["workflow"])
    if recorded is not None:
        return flow_changed(recorded, flow)
    done = [r["function_name"] for r in sorted(raw["steps"], key=lambda r: r.get("function_id") or 0)]
    code = [step.name for step in flow]
    if done == code[:len(done)]:
        return None
    return f"the run recorded the steps {done}, and this process's flow is {code}"


def _steps_of(wf: Any, flow: tuple[FlowStep, ...]) -> list[tuple[str, bool]]:
    """The run's steps, each with whether it has an effect: as its inputs recorded them, else ``flow``'s."""
    recorded = recorded_plan(wf) or plan_signature(flow)
    return [(name, bool(kind)) for name, _, kind in (entry.partition(":") for entry in recorded)]


def status_of(raw: dict[str, Any], version: str | None = None,
              flow: tuple[FlowStep, ...] | None = None) -> RunEntry:
    """The run in the shared vocabulary, read by a process of ``version`` running ``flow`` (this process's:
    ``app_version``, ``current_flow``; for a loop run, ``loop_app_version``), which decide whether it is
    parked. A loop run whose calls waited for a person shows them as ``approvals``."""
    wf = raw["workflow"]
    flow = flow or current_flow()
    if is_loop(wf):
        version = version or loop_app_version()
        run_steps = loop_steps(raw)
    else:
        version = version or app_version(flow=flow)
        run_steps = _steps_of(wf, flow)
    entry = _status(raw, run_steps, version, flow)
    waits = approvals.status_entries(approvals_of(raw)) if is_loop(wf) else []
    approvals.mark_waiting_steps(entry["steps"], waits)  # type: ignore[arg-type]
    if waits:
        entry["approvals"] = waits  # type: ignore[typeddict-unknown-key]
        waiting = next((w for w in waits if w["state"] == "waiting"), None)
        if waiting is not None and entry["status"] == "running":
            entry["detail"] = (f"{waiting['call']} waits for a person's decision on {waiting['tool']} until "
                               f"{waiting['until']}: `python -m durable_agents.dbosflow approve {wf.workflow_id} "
                               f"{waiting['call']} --by NAME` (or deny); a decision sent with no process running "
                               "is kept in DBOS's system database")
    return entry


def approvals_of(raw: dict[str, Any]) -> list[tuple[approvals.Wait, approvals.Decision | None, str | None]]:
    """A loop run's waits for a person, from its ``<call>/wait`` and ``<call>/decision`` rows
    (``durable_agents.dbosflow.loop._decided``): each wait, its decision and its outcome (None while it waits)."""
    rows = {r["function_name"]: r["output"]["result"] for r in raw["steps"]
            if r["error"] is None and isinstance(r["output"], dict) and "result" in r["output"]}
    out = []
    for name, result in rows.items():
        if not name.endswith(f"/{WAIT_STEP}") or not isinstance(result, dict):
            continue
        call = name.removesuffix(f"/{WAIT_STEP}")
        decided = rows.get(f"{call}/{DECISION_STEP}")
        decision = (approvals.Decision.from_json(decided["decision"])
                    if isinstance(decided, dict) and decided.get("decision") else None)
        out.append((approvals.Wait.from_json(result), decision, decided.get("outcome") if decided else None))
    return sorted(out, key=lambda found: found[0].since)


def _status(raw: dict[str, Any], run_steps: list[tuple[str, bool]], version: str,
            flow: tuple[FlowStep, ...]) -> RunEntry:
    """The run's entry from its steps (each with whether it has an effect) and DBOS's rows."""
    wf, rows = raw["workflow"], raw["steps"]
    run_id = wf.workflow_id
    dispatches = wf.recovery_attempts or 1
    by_name = {r["function_name"]: r for r in rows}
    steps: list[StepEntry] = []
    previous = 1
    current = None
    effect_steps = {name for name, effect in run_steps if effect}
    for name, effect in run_steps:
        row = by_name.get(name)
        decided = by_name.get(f"{name}/{DECISION_STEP}")
        if decided is not None and isinstance(decided["output"], dict):
            previous = decided["output"]["dispatch"]  # a process killed during a wait did not die in the call
        if row is not None and row["error"] is None and isinstance(row["output"], dict):
            out = row["output"]
            crashes = out["dispatch"] - previous
            previous = out["dispatch"]
            result = out["result"]
            adopted = result.get("adopted") if isinstance(result, dict) else None
            steps.append(step_entry(name, "adopted" if adopted else "completed", out["attempt"], result,
                                    crashes=crashes, note=adopted.get("reason") if adopted else None))
            continue
        if current is None:
            current = name
            crashes = dispatches - previous
            if row is not None:  # the step's error, recorded by DBOS
                err = row["error"]
                doubt = effect and any(_may_have_applied(e) for e in _errors(err))
                steps.append(step_entry(name, "in_doubt" if doubt else "failed", _attempts(err, crashes),
                                        crashes=crashes, last_error=_text(err)))
            else:
                steps.append(step_entry(name, "running", crashes + 1, crashes=crashes))
            continue
        steps.append(step_entry(name))
    status = wf.status
    if status == "SUCCESS":
        return run_entry(run_id, "completed", steps)
    if status in ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
        return run_entry(run_id, "failed", steps, error=_run_error(wf, current, dispatches, steps, effect_steps))
    if wf.app_version and wf.app_version != version:
        return run_entry(run_id, "parked", steps, detail=version_refusal(raw, version, flow))
    mismatch = plan_mismatch(raw, flow)
    if mismatch is not None:
        what = "the code" if is_loop(wf) else "the code, or the LAB_FLOW,"
        return run_entry(run_id, "parked", steps, detail=f"{mismatch}: resume it with {what} that started it")
    active = next((s for s in steps if s["status"] == "running"), None)
    if active is not None:
        active["note"] = (f"dispatch {dispatches} of the run: DBOS records no attempt start and no owner, so a "
                          f"process may be running it, or none is: "
                          f"`python -m durable_agents.dbosflow resume {run_id}` recovers it "
                          "(DBOS recovers every pending run of its version when it launches)")
    now = describe_step(active, waiting_for="a DBOS launch to recover it") if active else None
    return run_entry(run_id, "running", steps, detail=now)


def _errors(err: Any) -> list[Any]:
    """Every attempt's error DBOS recorded in a step's row (``DBOSMaxStepRetriesExceeded``), or the one."""
    return list(getattr(err, "errors", None) or [err])


def _last(err: Any) -> Any:
    return _errors(err)[-1]


def _may_have_applied(err: Any) -> bool:
    """Whether an effect step's attempt that raised ``err`` may have applied its request: the lab's errors
    say so themselves (``in_doubt``); a refusal of the input never left; anything else says nothing."""
    if isinstance(err, StepError):
        return err.in_doubt
    return not isinstance(err, InputError)


def _attempts(err: Any, crashes: int) -> int:
    """A step whose error DBOS recorded: the dispatches that died in it, plus the
    one that recorded the error, unless that one refused to run it (``WorkerDeaths``)."""
    return crashes if isinstance(_last(err), WorkerDeaths) else crashes + 1


def _text(err: Any) -> str:
    last = _last(err)
    return last.message if isinstance(last, StepError) else f"{type(last).__name__}: {last}"


def version_refusal(raw: dict[str, Any], version: str, flow: tuple[FlowStep, ...]) -> str:
    """Why a process of ``version`` running ``flow`` leaves the run pending, and the command that resumes it:
    this code under the run's version when its flow is the run's, else the code that started it."""
    wf = raw["workflow"]
    started = (f"started under application version {wf.app_version!r}; this code is {version!r}. DBOS recovers "
               "a pending run only in a process of its own version")
    env = LOOP_VERSION_ENV if is_loop(wf) else VERSION_ENV
    command = f"{env}={wf.app_version} python -m durable_agents.dbosflow resume {wf.workflow_id}"
    mismatch = plan_mismatch(raw, flow)
    if mismatch is None and is_loop(wf):
        return f"{started}, and this code's agent loop is the run's: run `{command}`, or keep it parked"
    if mismatch is None:
        return f"{started}, and this code's flow is the run's: run `{command}`, or keep it parked"
    what = "the code" if is_loop(wf) else "the code, or the LAB_FLOW,"
    return (f"{started}, and a process of this code would mis-resume it ({mismatch}): resume it with {what} "
            f"that started it (there: `{command}`), or keep it parked")


def _run_error(wf, current: str | None, dispatches: int, steps: list[StepEntry], effect_steps: set[str]) -> str:
    if wf.status == "MAX_RECOVERY_ATTEMPTS_EXCEEDED":
        step = current or "?"
        for s in steps:
            if s["name"] == step:
                s["status"] = "in_doubt" if step in effect_steps else "failed"
                s["last_error"] = "the process running it died"
        return (f"step {step} failed after {dispatches - 1} dispatch(es) died: worker died {dispatches - 1} times "
                f"(DBOS's own limit, {LOOP_RECOVERY_BACKSTOP if is_loop(wf) else RECOVERY_BACKSTOP} recoveries "
                "per run, the backstop behind the run's "
                f"per-step rule; it moved the run to MAX_RECOVERY_ATTEMPTS_EXCEEDED, its dead letter; "
                f"DBOS.resume_workflow would run it again from there)")
    if wf.status == "CANCELLED":
        return f"canceled at step {current or '?'} (DBOS: CANCELLED)"
    err = wf.error
    if isinstance(err, StepFailed):
        return err.message
    return f"{type(err).__name__}: {err}" if err is not None else f"DBOS status {wf.status}"


def dumps(status: RunEntry) -> str:
    return json.dumps(status, indent=2)


def render(status: RunEntry, raw: dict[str, Any]) -> str:
    wf = raw["workflow"]
    lines = [render_table(status)]
    if is_loop(wf):
        lines.extend(printable(line) for line in loop_lines(raw, status))
        waits: list[dict[str, Any]] = status.get("approvals") or []  # type: ignore[assignment]
        lines.extend(printable(line) for line in approvals.status_lines(waits))
    workflow = LOOP_WORKFLOW_NAME if is_loop(wf) else WORKFLOW_NAME
    lines.append(f"  DBOS: workflow {wf.workflow_id} ({workflow}) {wf.status}, application version "
                 f"{wf.app_version}, executor {wf.executor_id}, dispatches (recovery_attempts) {wf.recovery_attempts}, "
                 f"{len(raw['steps'])} step row(s)")
    return "\n".join(lines)


# ------------------------------------------------------------------ the agent loop's runs


def _outputs(raw: dict[str, Any]) -> dict[str, Any]:
    """Each step's recorded result (the lab's output around it: ``{"result", "dispatch", "attempt"}``), by name;
    a loop call's wait for a person and its decision (``<call>/wait``, ``<call>/decision``) are not steps of the
    plan: ``approvals_of`` reads them."""
    return {r["function_name"]: r["output"]["result"] for r in raw["steps"]
            if r["error"] is None and isinstance(r["output"], dict) and "result" in r["output"]
            and not r["function_name"].endswith((f"/{WAIT_STEP}", f"/{DECISION_STEP}"))}


def loop_steps(raw: dict[str, Any]) -> list[tuple[str, bool]]:
    """A loop run's steps so far, each with whether it has an effect: those its recorded outputs decide
    (``durable_agents.steps.loop.LoopPlan.names``: the recorded ones, then the calls and the next turn a recorded turn
    adds), an effect read from the recorded turn's call (``durable_agents.steps.loop.EFFECT_OF_TOOL``)."""
    results = _outputs(raw)
    effects = loop.recorded_effects((recorded_inputs(raw["workflow"]) or {}).get("loop"))
    names = loop.LoopPlan(loop.LoopInputs(raw["workflow"].workflow_id, "", ""), no_window).names(results)
    out = []
    for name in names:
        turn, index = loop.parse_step(name)
        recorded_turn = results.get(loop.turn_step(turn)) if index is not None else None
        calls = recorded_turn.get("calls") or [] if isinstance(recorded_turn, dict) else []
        call = loop.as_call(calls[index]) if index is not None and index < len(calls) else None
        out.append((name, call is not None and call.name in effects))
    return out


def loop_effect_calls(raw: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each call with an effect of a loop run's recorded turns, by step name: its tool and its idempotency key
    (``durable_agents.steps.loop.tool_key`` of the recorded turn: the key every attempt of that call sends)."""
    run_id = raw["workflow"].workflow_id
    calls: dict[str, tuple[str, str]] = {}
    effects = loop.recorded_effects((recorded_inputs(raw["workflow"]) or {}).get("loop"))
    for name, result in _outputs(raw).items():
        turn, index = loop.parse_step(name)
        if index is None:
            for i, call in enumerate(loop.as_call(c) for c in result.get("calls") or ()):
                if call.name in effects:
                    calls[loop.call_step(turn, i)] = (call.name, loop.tool_key(run_id, turn, i, call.id))
    return calls


def loop_call_keys(raw: dict[str, Any]) -> dict[str, str]:
    """Each call with an effect of a loop run's recorded turns, by step name, and its idempotency key."""
    return {step: key for step, (_, key) in loop_effect_calls(raw).items()}


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def loop_lines(raw: dict[str, Any], status: RunEntry) -> list[str]:
    """A loop run turn by turn: what each turn asked for, each call's arguments, key, status and result (as
    the model got it back), and the final answer. Run data: the caller escapes each line for the terminal."""
    numbers = recorded_inputs(raw["workflow"]) or {}
    results = _outputs(raw)
    keys = loop_call_keys(raw)
    lines = [f"  the agent loop: at most {numbers.get('max_turns')} turns; window of at most "
             f"{numbers.get('window_tokens')} tokens and {numbers.get('window_messages')} messages, derived from "
             "DBOS's recorded step outputs for each turn"]
    calls: list[loop.AskedCall] = []
    for entry in status["steps"]:
        name = entry["name"]
        turn, index = loop.parse_step(name)
        shown = entry["status"] + (f", attempt {entry['attempts']}" if entry["attempts"] > 1 else "")
        if index is None:
            if name not in results:
                lines.append(f"  turn {turn}: {shown}")
                continue
            calls = [loop.as_call(c) for c in results[name].get("calls") or ()]
            asked = ", ".join(c.name for c in calls) if calls else "no tool: the final answer"
            lines.append(f"  turn {turn}: asked for {asked}")
            continue
        call = calls[index]
        lines.append(f"    call {index} {call.name} {_clip(call.arguments, 100)}")
        key = keys.get(name)
        lines.append(f"      key {key}" if key else "      no key: no effect (read-only, or not a tool)")
        if name in results:
            shown += f": {results[name].get('status')} {_clip(str(results[name].get('content')))}"
        lines.append(f"      {shown}")
    answer = loop.LoopPlan.final_answer(results)
    if answer is not None:
        lines.append(f"  final answer: {_clip(answer, 400)}")
    return lines
