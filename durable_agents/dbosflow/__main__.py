"""``python -m durable_agents.dbosflow``: see ``durable_agents.dbosflow.cli``."""

import os
import sys

from durable_agents.dbosflow import engine as _engine  # noqa: F401 - DBOS installed, or the message that says how
from durable_agents.dbosflow.cli import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # DBOS's background threads (queue, notifications) are daemons; no teardown is owed to them.
    os._exit(code)
