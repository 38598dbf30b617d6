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


@pytest.mark.parametrize("lock, extras", [("dev.lock", ["dev"]), ("deploy.lock", ["crypto", "otel"])])
def test_every_declared_dependency_is_pinned_with_hashes(lock, extras):
    declared = list(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        declared += PYPROJECT["project"]["optional-dependencies"][extra]
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
