"""The lab's Temporal worker: ``durable_agents.worker``, run from the checkout.

    python worker.py [--task-queue Q] [--agent package.module:attribute ...] [--cache N] [--identity NAME] [--verbose]

The worker is the adapter's (the same command is ``python -m durable_agents.worker`` wherever the package is
installed); its docstring says what it serves and what it reads from the environment.
"""

from durable_agents.flowclient.connect import exit_now
from durable_agents.worker import main

if __name__ == "__main__":
    exit_now(main())
