"""Idempotency keys: how a retried, resumed or replayed step is recognised by
the service that applies its effect.

Derivation::

    key = "agentlab/" + run_id + "/" + step_name

``run_id`` is the lab's run id: the Temporal *workflow id* on the Temporal path
and the run record's primary key on the hand-rolled path. It is chosen by the
caller and is the only identity that survives everything a run goes through:

- activity retries and worker restarts (the same workflow run, same id);
- a resume after SIGKILL (the run id is what you resume by);
- a Temporal workflow *reset* or *continue-as-new*, which give the execution a
  new Temporal run id but keep the workflow id. Keys derived from Temporal's
  run id would change there and the email would go out twice; keys derived
  from the workflow id do not.

The step name makes keys unique per step within a run.

Caveats, on purpose and documented:

- A run id must never be reused for a different task. The starter never
  starts a second run under an id whose run already exists: Temporal refuses
  it atomically, by the REJECT_DUPLICATE reuse policy when that run has
  closed and the FAIL conflict policy when it is still open, and the starter
  takes either refusal to mean "attach": it says the run already exists, that
  the task and email given now were not used, and shows that run
  (``durable_agents.flowclient.runs.start_run``). FAIL rather than USE_EXISTING so that the
  conflict is reported: USE_EXISTING would hand back the running run as if
  this start had made it, and the starter could not tell the user that their
  new task went nowhere. The run record's primary key refuses a reused id
  the same way. If you reuse one anyway, the provider replays the old
  response (same request) or answers 409 (different request): loud, never a
  second email.
- The key does not cover the content. If a step is re-executed with different
  content (a reset to before ``draft`` with a non-deterministic model), the
  provider answers 409 idempotency_conflict and the run fails naming the step.
  That is the signal that you asked for a *different* effect under the same
  identity; start a new run id to send it.
- The provider remembers keys for ever here; a real API keeps them for a
  limited window (Stripe: 24 hours). A run resumed after that window could
  repeat an effect; keep resumes well inside it.
"""

from __future__ import annotations

KEY_PREFIX = "agentlab"


def idempotency_key(run_id: str, step: str) -> str:
    """The key every attempt of ``step`` in ``run_id`` sends, on either engine."""
    if not run_id or not step:
        raise ValueError("idempotency_key needs a run id and a step name")
    return f"{KEY_PREFIX}/{run_id}/{step}"
