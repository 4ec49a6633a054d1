"""``zonemeter demo -o json`` as a user runs it: a short run, the summary JSON of docs/demo.md on stdout,
exit 0, and nothing left behind (no lab namespace, no agent process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_demo_json_run_and_cleanup(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "agent", "demo", "--duration", "3",
                           "--interval", "1", "-o", "json", "--workdir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert set(doc) == {"duration_seconds", "services", "double_counted_bytes"}
    assert doc["double_counted_bytes"] == 0 and doc["duration_seconds"] >= 3
    names = [s["name"] for s in doc["services"]]
    assert names == ["catalog", "cart", "checkout", "node-cache", "payments"]
    for s in doc["services"]:
        assert s["cross_zone_bytes"] == s["ground_truth_cross_zone_bytes"] > 0
        assert s["hint_ignored_bytes"] == s["ground_truth_hint_ignored_bytes"]
        assert set(s["locality_in_effect"]) == {"zone-a", "zone-b", "zone-c"}
    prefix = json.loads((tmp_path / "demo.json").read_text())["prefix"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ln for ln in left.splitlines() if ln.startswith(prefix + "-")]
    agents = json.loads((tmp_path / "demo.json").read_text())["agents"]
    assert len(agents) == 6
    for a in agents:
        assert not os.path.exists(f"/proc/{a['pid']}") or \
            b"agent" not in Path(f"/proc/{a['pid']}/cmdline").read_bytes()
