"""What DBOS pickled before the adapter was one package (0.1.0), read by this code.

DBOS stores a run's recorded values and errors with ``pickle``, and a pickled exception names its class by
module: a run the 0.1.0 code failed holds ``dbosflow.engine.StepFailed``, a step's spent retries hold
``steps.errors.StepError``. Those modules are ``durable_agents.dbosflow.engine`` and
``durable_agents.steps.errors`` now (CHANGELOG.md, 0.2.0), and without help ``pickle`` cannot find them: DBOS
then hands the error back as the stored text, and the run's status would show base64 where the reason was.

``accept_pre_0_2_pickles()`` installs an import finder that answers each old name (``dbosflow.engine``,
``steps.errors``, any module of the packages that moved) with the module it is now: the same module object,
nothing executed twice. It never shadows a module that exists under the old name (a user's own ``steps``,
the lab's re-exporting ``workflows``): a top-level name is answered only when no module of that name is on the
path, a submodule only under an old name answered here, and only for the packages that moved. The DBOS
engine's processes (``configure``) and readers (``status.client``) install it. Remove it, and its callers,
once no DBOS system database written by 0.1.0 is read (a run of 0.1.0 that is still pending is finished by
0.2.0 without it: its inputs and outputs are plain data; tests/test_package_move.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence

MOVED = ("steps", "workflows", "activities", "flowclient", "wiring", "storage", "memory", "drafting",
         "payloadcodec", "providerclient", "runrecord", "dbosflow")
"""The top-level packages of 0.1.0 that are ``durable_agents.<name>`` since 0.2.0."""


class _Existing(importlib.abc.Loader):
    """Loads an old name as the module the new name already is (imported once, under its new name)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing: the module ran when it was imported under its new name."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        parent, _, _ = fullname.rpartition(".")
        if fullname.partition(".")[0] not in MOVED:
            return None
        if parent:  # under an old name only if the parent was answered here (else it is a module of its own)
            if getattr(sys.modules.get(parent), "__name__", None) != f"durable_agents.{parent}":
                return None
        elif importlib.machinery.PathFinder.find_spec(fullname) is not None:
            return None  # a module of that name exists (a user's own ``steps``): never shadowed
        new = f"durable_agents.{fullname}"
        if importlib.util.find_spec(new) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Existing(new))


_FINDER = _MovedFinder()


def accept_pre_0_2_pickles() -> None:
    """Install the finder (once). First in line, so that a submodule of an old name is never found again by
    the path finder under that name and run twice; it declines every name it does not own (the module
    docstring)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
