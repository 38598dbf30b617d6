"""``python -m runrecord``: see ``runrecord.cli``."""

from flowclient.connect import exit_now
from runrecord.cli import main

if __name__ == "__main__":
    exit_now(main())
