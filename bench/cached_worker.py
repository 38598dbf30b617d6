"""worker.py with a workflow cache and a chosen sticky schedule-to-start timeout,
for bench/bench_worker_cache.py: ``python bench/cached_worker.py --sticky-ms 200``.

It runs worker.py's own ``main`` with ``--cache 1000``; only the module's
``CACHED_STICKY_TIMEOUT`` (1 s) is replaced, so every other option is the
shipped one."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import worker  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--sticky-ms":
        print("usage: python bench/cached_worker.py --sticky-ms MS [worker.py options]", file=sys.stderr)
        return 2
    worker.CACHED_STICKY_TIMEOUT = timedelta(milliseconds=float(argv[1]))
    return worker.main(["--cache", "1000", *argv[2:]])


if __name__ == "__main__":
    worker.exit_now(main())
