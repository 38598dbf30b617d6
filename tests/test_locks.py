"""The locks (requirements/*.lock) match pyproject.toml: every dependency it
declares is pinned there, at a version its specifier allows, with hashes, so
`make` and the Dockerfile install what the tests ran against. `make lock`
regenerates them; this test says when someone forgot."""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lab.processes import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", re.M)


def pins(lock: str) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in PIN.findall((REPO / "requirements" / lock).read_text())}


@pytest.mark.parametrize("lock, extras, build", [("dev.lock", ["dev"], True), ("deploy.lock", ["crypto", "otel"], True),
                                                 ("adapter.lock", [], False)])
def test_every_declared_dependency_is_pinned_with_hashes(lock, extras, build):
    declared = list(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        declared += PYPROJECT["project"]["optional-dependencies"][extra]
    if build:
        declared += PYPROJECT["build-system"]["requires"]
    pinned = pins(lock)
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{lock} does not pin {name}: run `make lock`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"{lock} pins {name}=={pinned[name]}, outside {requirement.specifier}: run `make lock`"
    body = (REPO / "requirements" / lock).read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", body)
    assert all("--hash=sha256:" in b for b in blocks if PIN.match(b)), f"{lock} has a pin without a hash"


def test_the_makefile_installs_from_the_lock():
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet --require-hashes -r requirements/dev.lock" in makefile
    assert "pip install --quiet --no-deps --no-build-isolation -e ." in makefile


def test_the_adapters_wheelhouse_lock_pins_what_the_lab_runs():
    """``adapter.lock`` (the wheels a fresh environment installs the built wheel from: tests/test_wheel.py) pins
    every package at the version ``dev.lock`` pins, so the wheel is tested with what the suite ran against."""
    adapter, dev = pins("adapter.lock"), pins("dev.lock")
    assert adapter and {name: dev.get(name) for name in adapter} == adapter, "run `make lock`"
