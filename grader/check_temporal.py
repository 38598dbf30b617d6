"""Check 6. **The flow on Temporal** (exercise 6): effects in activities, the worker killed mid-run, each effect
once; it stands alone (``grader.temporal`` drives it).
"""

from __future__ import annotations

from grader.check import Check
from grader.temporal import check_temporal

CHECK = Check(6, "the flow on Temporal: effects in activities, the worker killed mid-run, each effect once",
              check_temporal, seconds=180.0, main_file="worker.py",
              stands_alone="exercise 6 moves the flow onto Temporal: its check stands alone")
