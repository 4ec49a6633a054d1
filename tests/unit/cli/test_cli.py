"""The CLI when its reader goes away early (``zonemeter ... | head``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_closed_stdout_ends_quietly_with_141() -> None:
    # 700 replica counts as JSON are about 170 kB, more than a pipe buffer (64 kB) holds,
    # so writing fails once the reader has closed its end after the first line
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "what-if", "--zone", "a=4", "--zone", "b=4",
         "--zone", "c=4", "--replicas", "1-700", "-o", "json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert first.startswith(b"{")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err == ""
    assert code == 141
