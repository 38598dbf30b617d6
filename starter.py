"""The lab's starter: ``durable_agents.starter``, run from the checkout.

    python starter.py start|loop|status|watch|retry|settle ... (python starter.py --help)

The commands are the adapter's (``python -m durable_agents.starter`` wherever the package is installed); its
docstring says what each does and its exit codes.
"""

from durable_agents.flowclient.connect import exit_now
from durable_agents.starter import main

if __name__ == "__main__":
    exit_now(main())
