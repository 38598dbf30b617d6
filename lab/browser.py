"""Headless Chromium, for the checks and pictures that need a real browser
(the Temporal UI through the codec server, the scenario's page, the
provider's inbox): its rendered DOM, or a screenshot.

Debian's ``chromium`` (``make test`` and ``make pictures`` install it when
missing), or the binary ``LAB_CHROMIUM`` names. Each load gets a fresh
profile, which is removed after; Chromium runs in a session of its own, and
the whole session (zygote and renderers included) is SIGKILLed when the load
ends, so nothing outlives it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]


class NoChromium(RuntimeError):
    pass


def chromium() -> str:
    """The browser binary, or NoChromium saying how to get one."""
    for candidate in (os.environ.get("LAB_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    raise NoChromium("Chromium is not installed, and this needs a real browser. `make test` installs Debian's "
                     "chromium; by hand: apt-get install --no-install-recommends chromium (or set LAB_CHROMIUM "
                     "to a Chromium or Chrome binary)")


def load(url: str, *extra: str, budget_ms: int = 10000, timeout: float = 90.0) -> str:
    """Load ``url`` once with ``extra`` flags (``--dump-dom``, ``--screenshot=...``); Chromium's stdout."""
    binary = chromium()
    profile = Path(tempfile.mkdtemp(prefix="lab-chromium-"))
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *extra, url],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:  # its zygote and renderers share the session: none may outlive the load
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    return out


def dom(url: str) -> str:
    """The page's DOM after it rendered (scripts, if any were allowed, run first)."""
    return load(url, "--dump-dom")


def screenshot(url: str, path: Path, width: int, height: int) -> Path:
    """A PNG of the page's first ``width`` x ``height`` pixels; fails if none was written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    load(url, f"--screenshot={path.resolve()}", f"--window-size={width},{height}")
    if not path.exists():
        raise RuntimeError(f"Chromium wrote no screenshot of {url} to {path}")
    return path
