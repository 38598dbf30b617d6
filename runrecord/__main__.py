"""``python -m runrecord``: see ``runrecord.cli``."""

import sys

from runrecord.cli import main

if __name__ == "__main__":
    sys.exit(main())
