"""The README's main command keeps working: the demo runs end to end, kills
its worker, resumes, checks itself, and leaves no process behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lab.processes import REPO

pytestmark = pytest.mark.process


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
    leftovers = subprocess.run(["pgrep", "-f", "durable_agents.payloadcodec.server"], capture_output=True, text=True)
    assert str(tmp_path) not in leftovers.stdout


NORMALISE = [
    (r"\d{2}:\d{2}:\d{2}", "HH:MM:SS"),
    (r"demo-\d{8}-\d{6}", "demo-RUN"),
    (r"pid \d+", "pid N"),
    (r"127\.0\.0\.1:\d+", "127.0.0.1:PORT"),
    (r"msg_[0-9a-f]{24}", "msg_ID"),
    (r"tkt_[0-9a-f]{24}", "tkt_ID"),
    (r"history in \S+temporal\.db\)", "history in STATE/temporal.db)"),
    (r"\d+(\.\d+)? s\b", "N s"),
    (r"[ ─━]+", " "),  # table widths follow the values' lengths
]


def normalise(text: str) -> list[str]:
    import re

    lines = []
    for line in text.splitlines():
        for pattern, replacement in NORMALISE:
            line = re.sub(pattern, replacement, line)
        if line.strip():
            lines.append(line.rstrip())
    return lines


def test_the_readmes_transcript_is_what_the_demo_prints(tmp_path):
    import re

    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- demo-transcript -->\n```\n(.*?)\n```", readme, re.S)
    assert block, "README.md has no demo transcript block"
    import shutil
    import tempfile

    state = tempfile.mkdtemp(prefix="demo-")  # a short path: the demo's lines wrap at 120 columns
    try:
        done = subprocess.run(
            [sys.executable, "-m", "lab.demo", "--port", "0", "--state-dir", state],
            cwd=REPO, capture_output=True, text=True, timeout=240,
        )
    finally:
        shutil.rmtree(state, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = normalise(done.stdout + done.stderr)
    shown = normalise(block.group(1))
    assert printed == shown, "\n".join(
        f"{'  ' if a == b else '≠ '}{b!r}\n   {a!r}" for a, b in zip(printed, shown, strict=False)
    ) + f"\n(demo printed {len(printed)} lines, README shows {len(shown)})"
