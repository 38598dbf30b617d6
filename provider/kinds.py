"""The provider's effect kinds, written once: one row per kind of effect it
applies (an email, a ticket, a refund), and everything about the kind that
the store, the routes and the faults need.

Every other part reads this table:

- the server's routes (``provider.server``): ``POST path`` applies one,
  under an ``Idempotency-Key``; ``GET path`` lists them, as ``{table: [...]}``;
- the store (``provider.store``): the kind's own table, where an applied
  effect is a row (``effects_applied`` is counted from these tables); the
  bookkeeping's ``CHECK (kind IN (...))``; how a lookup by key rebuilds the
  applied request;
- the faults' ``kinds`` (``provider.faults``).

Adding a kind: a row here (its validator in ``provider.validation``, its
limits in docs/provider-contract.md), then ``SCHEMA_VERSION`` + 1 in
``provider.store`` with ``_kinds_schema`` as that version's upgrade: it
creates the kind's table and rebuilds the bookkeeping's ``CHECK``, keeping
every row. The client's side (``providerclient``, ``durable_agents.steps.ports``) gets a
method for it; a flow's step names the kind (``durable_agents.steps.plan.FlowStep.kind``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provider.validation import validate_email, validate_refund, validate_ticket


@dataclass(frozen=True)
class EffectKind:
    """One kind of effect.

    ``columns``: the request's fields as its table stores them, ``(field, column, SQL type)``, in order;
    ``answer``: the fields the answer repeats after the effect's id (then ``idempotency_key``,
    ``created_at``, ``replayed``); ``validate``: the request's body to its checked fields (an ``ApiError``
    otherwise), the optional ``metadata`` among them."""

    name: str  # the bookkeeping's `kind`, /v1/effects, lookups, the faults' `kinds`
    path: str  # POST: apply one; GET: list them
    table: str  # its store table, and the name of the list GET answers with
    id_field: str  # the id the provider gives the effect
    id_prefix: str
    columns: tuple[tuple[str, str, str], ...]
    answer: tuple[str, ...]
    validate: Callable[[dict[str, Any]], dict[str, Any]]

    @property
    def endpoint(self) -> str:
        """How a lookup names what applied it: ``POST /v1/emails``."""
        return f"POST {self.path}"

    def create_table(self) -> str:
        """Its table, as ``_kinds_schema`` creates it when missing (emails and tickets exist since schema 1)."""
        columns = "".join(f"    {column} {kind} NOT NULL,\n" for _, column, kind in self.columns)
        return (f"CREATE TABLE IF NOT EXISTS {self.table} (\n    {self.id_field} TEXT PRIMARY KEY,\n"
                f"    idempotency_key TEXT NOT NULL UNIQUE,\n{columns}    metadata TEXT,\n"
                f"    created_at TEXT NOT NULL\n);\n"
                f"CREATE INDEX IF NOT EXISTS {self.table}_run ON {self.table} (run_id)")


KINDS: tuple[EffectKind, ...] = (
    EffectKind("email", "/v1/emails", "emails", "message_id", "msg_",
               (("run_id", "run_id", "TEXT"), ("to", "to_address", "TEXT"), ("subject", "subject", "TEXT"),
                ("body", "body", "TEXT")),
               ("run_id", "to", "subject"), validate_email),
    EffectKind("ticket", "/v1/tickets", "tickets", "ticket_id", "tkt_",
               (("run_id", "run_id", "TEXT"), ("summary", "summary", "TEXT"),
                ("email_message_id", "email_message_id", "TEXT")),
               ("run_id", "summary", "email_message_id"), validate_ticket),
    EffectKind("refund", "/v1/refunds", "refunds", "refund_id", "rfd_",
               (("run_id", "run_id", "TEXT"), ("order_id", "order_id", "TEXT"), ("amount", "amount", "INTEGER")),
               ("run_id", "order_id", "amount"), validate_refund),
)

BY_NAME: dict[str, EffectKind] = {kind.name: kind for kind in KINDS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
