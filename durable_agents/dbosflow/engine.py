"""The agent flow as a DBOS workflow: the same step functions, requests and
keys as the other engines, checkpointed by DBOS Transact in a SQLite system
database (no server).

What DBOS does here, and what the lab adds:

- **One workflow per run**, DBOS workflow id = RUN_ID (``SetWorkflowID``).
  Its inputs (task, email, conversation, start id, creation time, retry rule,
  the run's parameters, and the flow's signature: each step's name and kind,
  ``durable_agents.steps.plan.plan_signature``) are recorded by DBOS with the workflow, so
  every dispatch builds the same requests: the flow is a parameter of the
  process (``set_environment(flow=...)``, the lab's ``durable_agents.steps.plan.FLOW`` by
  default, ``LAB_FLOW`` on the command line), each step's function and
  request builder looked up in it, the builders (``durable_agents.steps.requests``) reading
  only the inputs and the recorded results of earlier steps. A dispatch of a
  run whose recorded signature is not the process's flow's fails before any
  step (``StepFailed``, naming both flows); the commands refuse to launch
  such a run first (``python -m durable_agents.dbosflow``: exit 6, nothing recovered).
- **Each step is ``DBOS.run_step_async``** under the step's own name. DBOS
  writes one row per step to ``operation_outputs`` *after* the step returns
  (output or error): nothing is written when a step starts. A process that
  dies mid-step leaves no trace of the attempt; the next dispatch runs the
  step again (at least once) and the provider's idempotency key keeps the
  effect to one.
- **Recovery is DBOS's**: ``DBOS.launch()`` re-dispatches every PENDING
  workflow of this executor and *this application version*; the workflow
  function runs again from the top, and each ``run_step_async`` whose row
  exists returns the recorded output without running the step, after checking
  that the recorded name at that position is the step's name (otherwise DBOS
  raises ``DBOSUnexpectedStepError`` and the run ends in ERROR).
- **Application version derived from the flow** (``app_version``:
  ``VERSION_LABEL`` + ``+`` + ``durable_agents.steps.plan.plan_digest`` of the flow, so
  ``APP_VERSION`` for the lab's; ``DBOSFLOW_APP_VERSION`` overrides): DBOS
  would otherwise derive it from a hash of the workflow code, so any edit
  would strand pending runs. Derived from the flow's step names and kinds, a
  change to the flow is a new version by itself, and the runs started by the
  old flow wait (status ``parked``) until a process of their version runs;
  any other edit keeps the version. Runs started before the version carried
  the digest are ``agentlab-flow-1``'s: the lab's flow of three steps, which
  this code resumes under that label (``DBOSFLOW_APP_VERSION=agentlab-flow-1``,
  as the refusal says).
- **Retries by DBOS's step options** (``step_options``): a transient error is
  retried in process ``max_attempts`` times with DBOS's backoff; a permanent
  one (``should_retry`` false) fails at once. The lab's rule is a time budget
  with jitter, a 30 s cap and Retry-After; DBOS's is an attempt count, no
  jitter, a 1 h cap, no Retry-After. ``dbos_max_attempts`` picks the count
  whose backoff fits the lab's budget.
- **Crashes**: DBOS counts dispatches per *workflow* (``recovery_attempts``),
  and its limit, ``max_recovery_attempts``, is an argument of the workflow's
  decorator: fixed when a process imports this module, the same for every run
  it recovers, so it cannot be a run's rule. The run's rule decides, as on the
  other engines: the worker-death limit recorded with the run's inputs
  (``LAB_MAX_WORKER_DEATHS`` at ``start``), per step. Every dispatch since the
  previous step's output was recorded died while the step was next; one death
  more than the run allows and the next dispatch fails the step before running
  it (``WorkerDeaths``, in ``durable_agents.steps.retry.StepLedger``'s words), whatever the
  recovering process's environment says. DBOS's own limit stays a backstop
  (``RECOVERY_BACKSTOP``) above any count a rule allows, for deaths no step
  sees (while DBOS replays, after the last step): past it DBOS moves the run to
  ``MAX_RECOVERY_ATTEMPTS_EXCEEDED``, its dead letter.
- What DBOS does not record, the lab puts in the step's output: the dispatch
  (``recovery_attempts`` when the step ran) and the attempt within it, so
  ``status`` can count attempts and crashes per step (``durable_agents.dbosflow.status``).

Crash points (``CRASH_AT``; the steps' own points work too): ``dbos:S:after_record``
for each step S: DBOS has recorded S's output, the next step has not started.

**Durability of the system database** (``sqlite_engine_kwargs``): DBOS sets only ``busy_timeout``,
``foreign_keys`` and ``IMMEDIATE`` transactions on its SQLite file, which commits through a rollback journal
at SQLite's default ``synchronous=FULL``: the journal's deletion (the commit) is never synced to its
directory, so a power cut can bring the journal back and undo an acknowledged start or step
(docs/powercut.md). The lab opens every connection at ``EXTRA`` (``DBOSFLOW_SYNCHRONOUS``, to measure
another level), which syncs the directory at each commit, through DBOS's ``db_engine_kwargs`` (a
``creator``), so DBOS's own connect listener still sets its three.

The agent loop (``durable_agents.dbosflow.loop``) runs its turns and tool calls through the
same attempt (``_attempt``), options (``step_options``) and failure words,
as a workflow and under an application version of its own.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

try:
    from dbos import DBOS, DBOSConfig, SetWorkflowID, StepOptions
    from dbos import error as dbos_errors  # DBOS's public name for its exceptions (``dbos.error`` in __all__)
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError(
        "dbosflow needs DBOS Transact, an optional extra of this project: pip install -e '.[dbos]' "
        "(make test installs it with the dev extra)"
    ) from err

from durable_agents.dbosflow import sysdb
from durable_agents.dbosflow.legacy import accept_pre_0_2_pickles
from durable_agents.dbosflow.registration import DEFAULT_SYNCHRONOUS, SYNCHRONOUS_ENV
from durable_agents.dbosflow.sysdb import SystemDb, system_db
from durable_agents.steps import flow as step_functions
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.errors import PermanentError, StepError
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.limits import InputError
from durable_agents.steps.loop import CALL_ATTEMPT
from durable_agents.steps.models import to_jsonable
from durable_agents.steps.params import ParamValue
from durable_agents.steps.plan import FLOW, FlowStep, check_flow_shape, plan_digest, plan_signature
from durable_agents.steps.requests import RunInputs, remember_request
from durable_agents.steps.retry import MOST_WORKER_DEATHS, RetryRule, StepLedger
from durable_agents.steps.startedline import started_line
from durable_agents.storage import sqlite

APP_NAME = "agentlab"
VERSION_LABEL = "agentlab-flow-1"
"""The application version's label: the digest of the flow follows it (``version_of``). Change it (or set
``DBOSFLOW_APP_VERSION``) only on purpose: DBOS recovers a pending run only in a process of the version that
started it. Runs started before the digest was added carry the label alone."""
WORKFLOW_NAME = "agent_flow"
DEFAULT_DB = ".state/dbosflow.db"
DB_ENV = "DBOSFLOW_DB"
VERSION_ENV = "DBOSFLOW_APP_VERSION"
RESULT_POLL_SECONDS = 0.05  # how often a waiting CLI reads the run's status (DBOS's default is 1 s)
DBOS_MAX_RETRY_INTERVAL = 3600.0  # DBOS caps one step-retry interval at an hour (dbos._core.invoke_step)
MOST_STEPS = 20
"""The longest flow this engine runs (``set_flow``): the backstop below stays behind every rule for it."""
RECOVERY_BACKSTOP = MOST_STEPS * MOST_WORKER_DEATHS + 1
"""DBOS's own ``max_recovery_attempts``, fixed per process whatever flow it runs. Above the most dispatches
any recorded rule lets a run of any flow reach (every step at its limit, then one death more): the run's rule
always decides first."""


class RuleStop(PermanentError):
    """The run's rule (``durable_agents.steps.retry.StepLedger``) stopped a step that DBOS would go on retrying.

    ``failure`` is the run's error, in the ledger's words. Pickled by DBOS into
    the step's row: the message is the only positional argument, the rest comes
    back as attributes."""

    def __init__(self, message: str, failure: str = "", *, in_doubt: bool = False) -> None:
        super().__init__(message, in_doubt=in_doubt)
        self.failure = failure


class WorkerDeaths(RuleStop):
    """A step whose dispatches died more often than the run's recorded rule allows: a poison pill."""


class SameError(RuleStop):
    """A loop's turn whose model answered the same error to the same window ``SAME_ERROR_LIMIT`` attempts in
    a row (``durable_agents.steps.loop.same_error_limit``): its answer to that window, not an outage."""


class StepFailed(Exception):
    """A step ended the run: the lab's words, as the workflow's recorded error.

    Single positional argument so DBOS's serializer (pickle) round-trips it;
    the fields are parsed back by ``fields``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------ configuration


def db_path_from(value: str | None = None, env: Mapping[str, str] | None = None) -> SystemDb:
    """DBOS's system database: ``value`` (``--db``), else ``DBOSFLOW_DB``, else ``DEFAULT_DB``; a path is
    SQLite, a ``postgresql://`` URL PostgreSQL (``durable_agents.dbosflow.sysdb``). ``InputError`` for anything else."""
    env = os.environ if env is None else env
    try:
        return system_db(value or env.get(DB_ENV) or DEFAULT_DB)
    except ValueError as err:
        raise InputError(str(err)) from None


def db_url(db: Path | SystemDb) -> str:
    return system_db(db).url


def synchronous_from(env: Mapping[str, str] | None = None) -> str:
    """The system database's ``synchronous`` level: ``DBOSFLOW_SYNCHRONOUS``, EXTRA when unset."""
    try:
        return sqlite.synchronous_setting(os.environ if env is None else env, SYNCHRONOUS_ENV, DEFAULT_SYNCHRONOUS)
    except ValueError as err:
        raise InputError(str(err)) from None


def sqlite_engine_kwargs(path: Path, synchronous: str) -> dict[str, Any]:
    """DBOS's ``db_engine_kwargs`` for the SQLite file ``path``: a ``creator`` whose connections run at
    ``synchronous``. The pragma is per connection, so every connection of DBOS's pool gets it here; DBOS's
    connect listener then adds its ``busy_timeout``, ``foreign_keys`` and ``IMMEDIATE`` as before.
    ``check_same_thread=False`` as SQLAlchemy gives a file database: the pool hands connections across threads."""
    level = sqlite.check_synchronous(synchronous)
    file = str(path.resolve())

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(file, check_same_thread=False)
        conn.execute(f"PRAGMA synchronous={level}")
        return conn

    return {"creator": connect}


def version_of(flow: tuple[FlowStep, ...]) -> str:
    """The application version of ``flow``: the label and the digest of its step names and kinds."""
    return f"{VERSION_LABEL}+{plan_digest(flow)}"


APP_VERSION = version_of(FLOW)
"""The lab's flow's application version (``version_of(FLOW)``)."""


def app_version(env: Mapping[str, str] | None = None, flow: tuple[FlowStep, ...] | None = None) -> str:
    """This process's application version: ``DBOSFLOW_APP_VERSION`` if set, else ``version_of`` its flow
    (``flow``, or the one ``set_flow`` gave)."""
    env = os.environ if env is None else env
    return (env.get(VERSION_ENV) or "").strip() or version_of(flow or current_flow())


def dbos_max_attempts(rule: RetryRule) -> int:
    """DBOS's attempt count closest to the lab's time budget: the most attempts
    whose backoff (DBOS's: ``initial * coefficient ** n``, capped at an hour,
    no jitter) fits in ``budget_seconds``. 900 s at 0.2 s doubling: 13. Never
    more than the rule's ``attempts_per_step`` (``durable_agents.steps.retry``)."""
    attempts, waited = 1, 0.0
    while attempts < (rule.attempts_per_step or 100):
        delay = min(rule.initial_interval * rule.backoff_coefficient ** (attempts - 1), DBOS_MAX_RETRY_INTERVAL)
        if waited + delay > rule.budget_seconds:
            break
        waited += delay
        attempts += 1
    return attempts


def _should_retry(err: BaseException) -> bool:
    """Transient errors, timeouts and anything unexpected: retried; the lab's
    permanent ones (a 4xx, bad input, a 409 that could not be adopted): not."""
    return not isinstance(err, (PermanentError, InputError))


def step_options(step: str, rule: RetryRule, *, timeout_of: str | None = None) -> StepOptions:
    """DBOS's step options for ``step`` under the run's recorded ``rule``; an attempt may take the rule's
    timeout of ``timeout_of`` (a step of the flow whose timeout it shares), by default of ``step`` itself."""
    return {
        "name": step,
        "retries_allowed": True,
        "max_attempts": dbos_max_attempts(rule),
        "interval_seconds": rule.initial_interval,
        "backoff_rate": rule.backoff_coefficient,
        "should_retry": _should_retry,
        "timeout_seconds": rule.attempt_timeout_for(timeout_of or step),
    }


def configure(db: Path | SystemDb, *, version: str | None = None, synchronous: str | None = None) -> DBOS:
    """The process's DBOS instance on ``db`` (a SQLite file or a PostgreSQL database, created on launch;
    ``synchronous`` applies to SQLite only), under ``version`` or this
    process's (``app_version``: of the flow ``set_environment`` gave, so give the flow first), its connections
    at ``synchronous`` (None: ``synchronous_from`` the environment, EXTRA by default)."""
    where = system_db(db)
    where.prepare()
    accept_pre_0_2_pickles()  # what 0.1.0 pickled names its modules by their old names
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": where.url,
        "application_version": version or app_version(),
        # DBOS's own lines at WARNING and above (a step retry, a version that is not the latest);
        # the run's progress is printed by the lab in the same words as the other engines.
        "log_level": os.environ.get("DBOSFLOW_LOG_LEVEL", "WARNING"),
    }
    if where.path is not None:
        config["db_engine_kwargs"] = sqlite_engine_kwargs(where.path, synchronous or synchronous_from())
    return DBOS(config=config)


# ------------------------------------------------------------------ the steps' world

_DEPS: dict[int, StepDeps] = {}  # per event loop: an httpx client belongs to the loop that first used it
_MAKE_DEPS: list[Callable[[], StepDeps]] = []
_SAY = [lambda line: print(line, flush=True)]
_DB: list[SystemDb] = []
_FLOW: list[tuple[FlowStep, ...]] = [FLOW]


def set_environment(make_deps: Callable[[], StepDeps], db: Path | SystemDb, say=None, *,
                    flow: tuple[FlowStep, ...] = FLOW) -> None:
    """What the steps use in this process: ``make_deps()`` builds their provider,
    model and memory (the caller's choice, e.g. ``durable_agents.wiring.deps_from_env``), once
    per event loop; ``db`` is DBOS's system database; ``flow`` the steps the
    workflow walks (``set_flow``)."""
    _MAKE_DEPS[:] = [make_deps]
    _DB[:] = [system_db(db)]
    set_flow(flow)
    if say is not None:
        _SAY[0] = say


def set_flow(flow: tuple[FlowStep, ...]) -> None:
    """The flow this process's workflow walks, and whose version it runs under (``app_version``): set it
    before ``configure``. ``ValueError`` for a flow no engine can walk, or one longer than ``MOST_STEPS``."""
    steps = check_flow_shape(flow)
    if len(steps) > MOST_STEPS:
        raise ValueError(f"the flow has {len(steps)} steps; DBOS's backstop (RECOVERY_BACKSTOP) is set for at "
                         f"most {MOST_STEPS}: raise MOST_STEPS in durable_agents/dbosflow/engine.py")
    _FLOW[0] = steps


def current_flow() -> tuple[FlowStep, ...]:
    return _FLOW[0]


def _deps() -> StepDeps:
    if not _MAKE_DEPS:
        raise RuntimeError("durable_agents.dbosflow.engine.set_environment(make_deps, db) was not called: "
                           "the process that "
                           "launches DBOS says how the steps reach the provider, model and memory")
    loop = asyncio.get_running_loop()
    deps = _DEPS.get(id(loop))
    if deps is None:
        deps = _DEPS[id(loop)] = _MAKE_DEPS[0]()
    return deps


async def close_deps() -> None:
    for deps in list(_DEPS.values()):
        try:
            await deps.provider.aclose()
        except Exception:  # noqa: BLE001 - a client of another (stopped) loop
            pass
        # Memory's writer keeps its connection open between exchanges (``durable_agents.wiring.memory``): closed here,
        # not left to the interpreter's exit. Found by its ``close``: the engine does not import the wiring.
        close = getattr(deps.remember, "close", None)
        if callable(close):
            close()
    _DEPS.clear()


def dispatch_of(run_id: str) -> int:
    """Which dispatch of the run this is: DBOS's ``recovery_attempts`` (1 for
    the first, one more for every recovery). Read with a plain query, not a
    DBOS call: inside a workflow DBOS would checkpoint the answer and replay
    the first dispatch's value."""
    with sysdb.connect(_DB[0]) as con:
        rows = con.rows("SELECT recovery_attempts FROM workflow_status WHERE workflow_uuid = ?", (run_id,))
    found = rows[0][0] if rows else None
    return int(str(found)) if found else 1


def _inputs(raw: Mapping[str, Any]) -> RunInputs:
    return RunInputs(raw["run_id"], raw["task"], raw["email"], raw["conversation_id"],
                     start_id=raw.get("start_id", ""), created_at=raw.get("created_at"),
                     params=raw.get("params") or {})


def flow_changed(recorded: Any, flow: tuple[FlowStep, ...]) -> str | None:
    """Why ``flow`` cannot run a run whose inputs recorded the signature ``recorded``, or None (also for a run
    recorded before signatures: DBOS checks its recorded step names itself,
    ``durable_agents.dbosflow.status.plan_mismatch``)."""
    if recorded is None or list(recorded) == list(plan_signature(flow)):
        return None
    return (f"the run was started by a flow with steps {list(recorded)}, and this process's flow is "
            f"{list(plan_signature(flow))}")


def _reason(err: BaseException) -> str:
    return err.message if isinstance(err, StepError) else f"{type(err).__name__}: {err}"


# ------------------------------------------------------------------ the workflow


@DBOS.workflow(name=WORKFLOW_NAME, max_recovery_attempts=RECOVERY_BACKSTOP)
async def agent_flow(raw: dict[str, Any]) -> dict[str, Any]:
    """Run the flow's steps; returns ``{step: result}``. See the module docstring."""
    run_id = raw["run_id"]
    flow = current_flow()
    changed = flow_changed(raw.get("plan"), flow)
    if changed is not None:
        # Before any step: running another flow's steps against this run's record would mis-resume it.
        raise StepFailed(f"run {run_id} was not resumed: {changed}. Resume it with the flow that started it")
    inputs = _inputs(raw)
    rule = RetryRule.from_dict(raw.get("retry_rule"))
    dispatch = await asyncio.to_thread(dispatch_of, run_id)
    results: dict[str, Any] = {}
    previous_dispatch = 1
    for step in flow:
        request = step.request(inputs, results)
        ran = {"attempts": 0}
        try:
            recorded = await DBOS.run_step_async(step_options(step.name, rule), _attempt, step, request, run_id,
                                                 rule, dispatch, previous_dispatch, ran)
        except (PermanentError, InputError, dbos_errors.DBOSMaxStepRetriesExceeded) as err:
            # The step's own failure, recorded by DBOS in the step's row. DBOS's errors about the
            # workflow itself (a step name that differs from the recorded one, a cancellation) pass.
            raise StepFailed(_failure(step.name, err, ran["attempts"] + dispatch - previous_dispatch)) from None
        results[step.name] = recorded["result"]
        previous_dispatch = recorded["dispatch"]
        if ran["attempts"]:  # executed in this dispatch, not read back from DBOS's record
            result = recorded["result"]
            if isinstance(result, dict) and result.get("adopted"):
                _SAY[0](f"  {time.strftime('%H:%M:%S')} {step.name}: adopted (attempt {recorded['attempt']}): "
                        f"{result['adopted']['reason']}")
            else:
                _SAY[0](f"  {time.strftime('%H:%M:%S')} {step.name}: completed (attempt {recorded['attempt']})")
            crash_point(f"dbos:{step.name}:after_record")
    # Best effort, idempotent by message id, outside any step (as on the run record):
    # memory is context for later prompts, never read to decide what was done.
    await step_functions.remember_exchange(remember_request(inputs, results), _deps())
    return results


class AttemptedStep(Protocol):
    """What an attempt needs of a step: a flow's ``FlowStep``, or a step of the agent loop
    (``durable_agents.dbosflow.loop``)."""

    @property
    def name(self) -> str: ...

    @property
    def effect(self) -> bool: ...

    @property
    def run(self) -> Callable[[Any, Any], Awaitable[Any]]: ...


async def _attempt(step: AttemptedStep, request: Any, run_id: str, rule: RetryRule, dispatch: int,
                   previous_dispatch: int, ran: dict[str, int], repeats: StepLedger | None = None) -> dict[str, Any]:
    """One attempt of a step, as DBOS runs it (again on each of its retries).

    The number printed counts the dispatches since the previous step's output
    was recorded (each of them reached this step, or died before it) and the
    attempts of this dispatch. The first attempt of a dispatch is refused when
    those dispatches are more deaths than the run's rule allows.

    ``repeats``: a loop turn's ledger with its ``same_error_limit`` (``durable_agents.dbosflow.loop``), kept across
    DBOS's retries of this dispatch: the same error on that many attempts in a row stops the step (``SameError``)."""
    if not ran["attempts"]:
        _refuse_a_death_too_many(step, rule, dispatch, previous_dispatch)
    ran["attempts"] += 1
    attempt = dispatch - previous_dispatch + ran["attempts"]
    _SAY[0](started_line(step.name, run_id, attempt))
    CALL_ATTEMPT.set(attempt)  # a loop call's retry asks its tool's lookup first
    try:
        result = await step.run(request, _deps())
    except (PermanentError, InputError):
        raise
    except Exception as err:  # what DBOS retries (``_should_retry``): the rule may stop it first
        if repeats is not None:
            _stop_on_the_same_error(repeats, attempt, err)
        raise
    return {"result": to_jsonable(result), "dispatch": dispatch, "attempt": attempt}


def _stop_on_the_same_error(repeats: StepLedger, attempt: int, err: Exception) -> None:
    """Raise ``SameError`` when the ledger's row of the same error reaches its limit with ``err``. Only that
    verdict is the ledger's here: DBOS's attempt count stands for the budget (``dbos_max_attempts``)."""
    repeats.attempts = attempt
    repeats.after_error(_reason(err), 0.0, retry_after=getattr(err, "retry_after", None),
                        outage=getattr(err, "outage", False))
    if repeats.same_error_limit is not None and repeats.same_errors >= repeats.same_error_limit:
        raise SameError(_reason(err), repeats.failure or "") from None


def _refuse_a_death_too_many(step: AttemptedStep, rule: RetryRule, dispatch: int, previous_dispatch: int) -> None:
    """Raise ``WorkerDeaths`` when the dispatches that died while ``step`` was next
    exceed the run's recorded limit; the ledger words it as on the other engines."""
    deaths = dispatch - previous_dispatch
    if deaths <= rule.max_worker_deaths:
        return
    ledger = StepLedger(step.name, rule, effect=step.effect, attempts=deaths, crashes=deaths - 1)
    ledger.after_crash(f"the process of dispatch {dispatch - 1} died before DBOS recorded {step.name}'s output")
    raise WorkerDeaths(ledger.last_error or "", ledger.failure or "", in_doubt=ledger.in_doubt)


def _failure(step: str, err: BaseException, attempts: int) -> str:
    """The run's error in the other engines' words, with DBOS's reason."""
    if isinstance(err, RuleStop):
        return err.failure
    if isinstance(err, dbos_errors.DBOSMaxStepRetriesExceeded):
        last = err.errors[-1] if err.errors else err
        return (f"step {step} failed after {attempts} attempt(s): DBOS's step retries spent ({err.max_retries} "
                f"attempts: the count whose backoff fits the retry budget); last error: {_reason(last)}")
    return f"step {step} failed after {attempts} attempt(s): {_reason(err)}"


async def start_run(run_id: str, raw: dict[str, Any]):
    """Start the workflow under ``run_id`` (DBOS's workflow id); a handle."""
    with SetWorkflowID(run_id):
        return await DBOS.start_workflow_async(agent_flow, raw)


def new_inputs(run_id: str, task: str, email: str, conversation_id: str, start_id: str, rule: RetryRule,
               created_at: float | None = None, *, params: Mapping[str, ParamValue] | None = None,
               flow: tuple[FlowStep, ...] | None = None) -> dict[str, Any]:
    """A new run's inputs, as DBOS records them: ``params`` the run's parameters (``durable_agents.steps.params``,
    checked by the caller), ``plan`` the signature of the flow that starts it (``flow``, or ``current_flow()``)."""
    return {"run_id": run_id, "task": task, "email": email, "conversation_id": conversation_id,
            "start_id": start_id, "created_at": time.time() if created_at is None else created_at,
            "retry_rule": rule.to_dict(), "params": dict(params or {}),
            "plan": list(plan_signature(flow or current_flow()))}
