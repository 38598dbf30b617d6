"""The agent flow on DBOS Transact: the third durable engine of the lab,
beside Temporal's event history and the hand-rolled run record, driving THE
SAME step functions (``steps.flow``) with the same requests and idempotency
keys (``steps.plan``, ``steps.requests``, ``steps.keys``) against the same provider and
memory. An optional extra: ``pip install -e '.[dbos]'``.

``dbosflow.engine`` has the contract (what DBOS records and when, recovery,
the pinned application version, the retry options and where they differ from
``steps.retry``); ``dbosflow.loop`` runs the agent loop (``steps.loop``) on
the same machinery, each turn and each tool call a DBOS step, under a version
of its own; ``dbosflow.status`` maps DBOS's record onto the shared state
vocabulary; ``python -m dbosflow`` (``dbosflow.cli``) mirrors ``python -m
runrecord``; ``dbosflow.sysdb`` says where DBOS's system database is, a SQLite
file or a PostgreSQL database, and reads it directly on either.

Importing the package imports no DBOS: its registration in the lab's engine
registry (``dbosflow.registration``) and its side of the comparison
(``dbosflow.sides``) are read where the extra is not installed.
``dbosflow.engine``, where DBOS is first imported, says how to install it.
"""
