"""A DBOS run's status in the shared vocabulary (``steps.runstate``), read
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
  (``steps.plan.plan_signature``: names and kinds), or, for a run started
  before inputs recorded it, those of this process's flow.
- a step with an output row -> **completed** (or **adopted**); with an error
  row -> **failed**, or **in_doubt** for an effect step one of whose recorded
  errors may have been applied, as on the other engines: a ``StepError`` that
  says so (a 5xx, a timeout, an unreadable 2xx), a death too many
  (``WorkerDeaths``: the process may have died mid-request), DBOS's step
  timeout or any other unexpected exception (nothing says the request was not
  sent). DBOS keeps every attempt's error when its retries are spent
  (``DBOSMaxStepRetriesExceeded.errors``), only the last one otherwise.
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

from dbosflow.engine import (
    RECOVERY_BACKSTOP,
    WORKFLOW_NAME,
    StepFailed,
    WorkerDeaths,
    app_version,
    current_flow,
    db_url,
    flow_changed,
)
from steps.errors import StepError
from steps.limits import InputError
from steps.plan import FlowStep, plan_signature
from steps.runstate import RunEntry, StepEntry, describe_step, iso, run_entry, step_entry
from steps.runview import render_table


class DbosRunNotFound(LookupError):
    """No such run in DBOS's system database, or no database yet (``TemporalRunNotFound`` and
    ``RecordRunNotFound`` are the other engines' answers)."""


def client(db):
    from dbos import DBOSClient

    if not db.exists():
        raise DbosRunNotFound(f"no DBOS system database at {db}: start a run first (python -m dbosflow start ...)")
    return DBOSClient(system_database_url=db_url(db))


def read(db, run_id: str) -> dict[str, Any]:
    """What DBOS holds for ``run_id``: ``{"workflow": WorkflowStatus, "steps": [StepInfo]}``."""
    c = client(db)
    try:
        found = c.list_workflows(workflow_ids=[run_id])
        if not found:
            raise DbosRunNotFound(f"no run {run_id!r} in {db}: check the id, or start it with python -m dbosflow start")
        return {"workflow": found[0], "steps": c.list_workflow_steps(run_id)}
    finally:
        c.destroy()


def _ms(value: int | None) -> str | None:
    return iso(value / 1000) if value is not None else None


def recorded_plan(wf: Any) -> list[str] | None:
    """The flow's signature the run's inputs recorded (``dbosflow.engine.new_inputs``); None for a run
    started before inputs recorded it, or a status read without its inputs."""
    inputs = getattr(wf, "input", None)
    args = inputs.get("args") if isinstance(inputs, dict) else None
    first = args[0] if args else None
    plan = first.get("plan") if isinstance(first, dict) else None
    return [str(entry) for entry in plan] if isinstance(plan, list) else None


def plan_mismatch(raw: dict[str, Any], flow: tuple[FlowStep, ...] | None = None) -> str | None:
    """Why a process of ``flow`` (this process's, by default) would mis-resume the run, or None: the flow its
    inputs recorded differs; or, for a run recorded before inputs held it, a step DBOS recorded is not the
    flow's step at that position (DBOS would end the run in ``DBOSUnexpectedStepError``)."""
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
    ``app_version``, ``current_flow``), which decide whether it is parked."""
    wf, rows = raw["workflow"], raw["steps"]
    run_id = wf.workflow_id
    flow = flow or current_flow()
    version = version or app_version(flow=flow)
    dispatches = wf.recovery_attempts or 1
    by_name = {r["function_name"]: r for r in rows}
    steps: list[StepEntry] = []
    previous = 1
    current = None
    run_steps = _steps_of(wf, flow)
    effect_steps = {name for name, effect in run_steps if effect}
    for name, effect in run_steps:
        row = by_name.get(name)
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
        return run_entry(run_id, "parked", steps, detail=f"{mismatch}: resume it with the code, or the LAB_FLOW, "
                                                         "that started it")
    active = next((s for s in steps if s["status"] == "running"), None)
    if active is not None:
        active["note"] = (f"dispatch {dispatches} of the run: DBOS records no attempt start and no owner, so a "
                          f"process may be running it, or none is: `python -m dbosflow resume {run_id}` recovers it "
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
    command = f"DBOSFLOW_APP_VERSION={wf.app_version} python -m dbosflow resume {wf.workflow_id}"
    mismatch = plan_mismatch(raw, flow)
    if mismatch is None:
        return f"{started}, and this code's flow is the run's: run `{command}`, or keep it parked"
    return (f"{started}, and a process of this code would mis-resume it ({mismatch}): resume it with the code, "
            f"or the LAB_FLOW, that started it (there: `{command}`), or keep it parked")


def _run_error(wf, current: str | None, dispatches: int, steps: list[StepEntry], effect_steps: set[str]) -> str:
    if wf.status == "MAX_RECOVERY_ATTEMPTS_EXCEEDED":
        step = current or "?"
        for s in steps:
            if s["name"] == step:
                s["status"] = "in_doubt" if step in effect_steps else "failed"
                s["last_error"] = "the process running it died"
        return (f"step {step} failed after {dispatches - 1} dispatch(es) died: worker died {dispatches - 1} times "
                f"(DBOS's own limit, {RECOVERY_BACKSTOP} recoveries per run, the backstop behind the run's "
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
    lines.append(f"  DBOS: workflow {wf.workflow_id} ({WORKFLOW_NAME}) {wf.status}, application version "
                 f"{wf.app_version}, executor {wf.executor_id}, dispatches (recovery_attempts) {wf.recovery_attempts}, "
                 f"{len(raw['steps'])} step row(s)")
    return "\n".join(lines)
