"""The agent flow on DBOS Transact: the third durable engine of the lab,
beside Temporal's event history and the hand-rolled run record, driving THE
SAME step functions (``durable_agents.steps.flow``) with the same requests and idempotency
keys (``durable_agents.steps.plan``, ``durable_agents.steps.requests``, ``durable_agents.steps.keys``) against the same
provider and memory. An optional extra: ``pip install -e '.[dbos]'``.

``durable_agents.dbosflow.engine`` has the contract (what DBOS records and when, recovery,
the pinned application version, the retry options and where they differ from
``durable_agents.steps.retry``); ``durable_agents.dbosflow.loop`` runs the agent loop (``durable_agents.steps.loop``) on
the same machinery, each turn and each tool call a DBOS step, under a version
of its own; ``durable_agents.dbosflow.status`` maps DBOS's record onto the shared state
vocabulary; ``python -m durable_agents.dbosflow`` (``durable_agents.dbosflow.cli``) mirrors ``python -m
durable_agents.runrecord``; ``durable_agents.dbosflow.sysdb`` says where DBOS's system database is, a SQLite
file or a PostgreSQL database, and reads it directly on either.

Importing the package imports no DBOS: its registration in the lab's engine
registry (``durable_agents.dbosflow.registration``) and its side of the comparison
(``durable_agents.dbosflow.sides``) are read where the extra is not installed.
``durable_agents.dbosflow.engine``, where DBOS is first imported, says how to install it.
"""
