"""Local stand-in for the external email, ticket and refund APIs: a separate process
(``python -m provider``) that honours ``Idempotency-Key`` and counts effects,
the judge of "exactly once".

The contract both sides honour is docs/provider-contract.md; the server's
semantics (idempotency, counts, faults) are in ``provider.server``'s
docstring, what it accepts is ``provider.validation`` and its kinds of effect
are one table, ``provider.kinds``. This package imports
nothing from the rest of the project, only the standard library: a judge that
shared code with the defendant (the steps and their client, ``providerclient``)
could share its mistakes.
"""
