"""Adoption: what a step does when the provider already holds a *different*
request of the same run under its idempotency key.

Why it happens. An effect step's request is built from earlier results. If
an earlier step is run again inside the same run, its result can differ: a
real model never writes the same draft twice, and a Temporal reset to before
``draft`` re-runs it. The key (``durable_agents.steps.keys``) names the step of the run, not
the content, so the provider answers 409: the email under this key went out
already, with other words.

The rule. On a 409 the step asks the provider what it applied under the key
(``GET /v1/requests/<key>``) and **adopts** that effect, i.e. takes its ids
and its content as the step's result, only when all of these hold:

- something was applied under the key (a conflict with nothing applied is
  not adoption: the run fails, naming it);
- it was applied by the same endpoint (an email for an email step);
- it belongs to the same *start* of the run: the request's ``lab_start_id``
  metadata equals this run's ``start_id`` (Temporal: the original execution
  run id, which resets keep; run record: a token drawn at ``start``). A run id
  started again after retention has another start id: the conflict is real;
- for an email, it went to the same recipient.

Otherwise the conflict is permanent and the run fails saying which check
failed. A 409 is never retried: the same request would get the same answer.

The adopted result carries ``adopted``: a one-line reason with both request
digests (sha256 of the canonical JSON of each body, the same rule the
provider states) and the content that was really applied, which later steps
use (the ticket cites the adopted message id; memory remembers the adopted
reply). Nothing is sent twice: adoption only reads.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from durable_agents.steps.errors import IdempotencyConflict, PermanentError
from durable_agents.steps.ports import AppliedRequest

START_ID_METADATA = "lab_start_id"


def start_metadata(start_id: str) -> dict[str, str] | None:
    """The metadata an effect request carries: the run's start id, when it has one."""
    return {START_ID_METADATA: start_id} if start_id else None


def request_sha256(body: dict[str, Any]) -> str:
    """sha256 of a request body as canonical JSON (keys sorted, no whitespace, UTF-8)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def adopt(conflict: IdempotencyConflict, applied: AppliedRequest | None, *, kind: str, endpoint: str,
          ours: dict[str, Any], start_id: str, key: str) -> dict[str, Any]:
    """The result's ``adopted`` field (reason and both digests) if the rule
    above allows adopting ``applied``; else ``PermanentError`` saying why not."""
    refused = f"{conflict.message} Not adopted:"
    if applied is None or not applied.applied or not applied.request:
        raise PermanentError(
            f"{refused} the provider applied nothing under Idempotency-Key {key!r}, so there is no earlier "
            "effect of this run to take over. Look at the provider's log for that key."
        )
    if applied.endpoint != endpoint:
        raise PermanentError(f"{refused} the key was used for {applied.endpoint}, not {endpoint}.")
    theirs = (applied.request.get("metadata") or {}).get(START_ID_METADATA)
    if not start_id or theirs != start_id:
        raise PermanentError(
            f"{refused} the {kind} under this key belongs to another start of run id "
            f"{ours.get('run_id')!r} (start {theirs or 'unknown'}, this one {start_id or 'unknown'}): "
            "a run id is single-use; start a new run id to send this one."
        )
    if kind == "email" and applied.request.get("to") != ours.get("to"):
        raise PermanentError(
            f"{refused} the email under this key went to another recipient; this run would send to "
            f"{ours.get('to')!r}. Start a new run id to send it."
        )
    applied_digest = applied.request_sha256 or request_sha256(applied.request)
    attempted_digest = request_sha256(ours)
    reason = (
        f"adopted the {kind} this run applied earlier under its key (applied sha256 {applied_digest[:12]}, "
        f"this attempt's sha256 {attempted_digest[:12]}): a step before it was re-run and wrote differently"
    )
    return {"reason": reason, "applied_sha256": applied_digest, "attempted_sha256": attempted_digest}
