"""``python -m durable_agents.runrecord``: see ``durable_agents.runrecord.cli``."""

import sys

from durable_agents.runrecord.cli import main

if __name__ == "__main__":
    sys.exit(main())
