"""The README's main command keeps working: the demo runs end to end, kills
its worker, resumes, checks itself, and leaves no process behind."""

from __future__ import annotations

import subprocess
import sys

from lab.processes import REPO


def test_demo_kills_and_resumes_and_passes_its_checks(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "lab.demo", "--pace", "0.5", "--port", "0", "--state-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "SIGKILL worker 1" in out
    assert "current step record_outcome" in out
    assert "worker 2 started: record_outcome\n" in out
    assert out.count("PASS") == 4 and "FAIL" not in out
    assert (tmp_path / "temporal.db").exists() and (tmp_path / "provider.db").exists()
    # Everything the demo started is gone: nothing listens on its databases.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout == "", leftovers.stdout


def test_demo_with_encryption_points_the_ui_at_a_codec_server(tmp_path):
    """With LAB_CODEC_KEY set, every process the demo starts encrypts, and the UI it
    starts is given a codec server (stopped with the rest at the end)."""
    import base64
    import os

    key = base64.b64encode(bytes(range(90, 122))).decode()
    done = subprocess.run(
        [sys.executable, "-m", "lab.demo", "--pace", "0.5", "--port", "0", "--state-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240, env={**os.environ, "LAB_CODEC_KEY": key},
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "the UI decrypts them through the codec server at http://127.0.0.1:" in out
    assert out.count("PASS") == 4 and "FAIL" not in out
    leftovers = subprocess.run(["pgrep", "-f", "flowclient.codec_server"], capture_output=True, text=True)
    assert str(tmp_path) not in leftovers.stdout
