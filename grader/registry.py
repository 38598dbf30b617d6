"""Every check the grader has, by number: the ``CHECK`` of each ``grader/check_*.py`` module, one module per
check (exercise N's check is check N). A later exercise is one new folder under ``exercises/`` and one new check
module."""

from __future__ import annotations

import importlib
import pkgutil

import grader
from grader.check import Check


def all_checks() -> dict[int, Check]:
    found: dict[int, Check] = {}
    for module in pkgutil.iter_modules(grader.__path__):
        if module.name.startswith("check_"):
            check = importlib.import_module(f"grader.{module.name}").CHECK
            if check.number in found:
                raise RuntimeError(f"grader/{module.name}.py: check {check.number} is defined twice")
            found[check.number] = check
    return dict(sorted(found.items()))


CHECKS = all_checks()
