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
    assert set(doc) == {"duration_seconds", "services", "double_counted_bytes", "workloads",
                        "usd_per_month_at_aws_price", "kubernetes", "workload_breakdown",
                        "client_kind_exported", "unattributed_bytes", "flows", "requests",
                        "zone_cidrs", "model_disagreements"}
    # the default cluster: ClusterIP calls only, no outside peer (no zone-CIDR file), and
    # every non-Service byte is a pod's link traffic with its own node (left out)
    assert {f["path"] for f in doc["flows"]} == {"clusterIP"} and doc["zone_cidrs"] is None
    assert doc["workload_breakdown"] == [] and doc["requests"]["failed"] == 0
    assert doc["kubernetes"]["mode"] == "emulated" and doc["kubernetes"]["hints"] in ("oracle", "model")
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


@pytest.mark.parametrize("trigger, delay", [
    ("building lab", 0.3),             # namespaces and links half built
    ("lab up in", 0.2),                # agents compiling
    ("warming up", 0.5),               # traffic running
])
def test_ctrl_c_at_any_phase_prints_one_line_and_leaves_nothing(trigger: str, delay: float,
                                                                tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) while the demo builds the lab, while the agents compile, and while
    traffic runs: exit 130, one ``interrupted`` line after the progress lines and no
    traceback, no namespace or agent of the run left."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "agent", "demo", "--workdir", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if trigger in line:
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(seen) + rest
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("zonemeter demo: interrupted: agents stopped, lab removed"), lines[-5:]
    assert all(ln.startswith(("zonemeter demo: ", "[")) for ln in lines), lines
    state = json.loads((tmp_path / "demo.json").read_text()) if (tmp_path / "demo.json").exists() else {}
    prefix = state.get("prefix") or next(ln.split("building lab ")[1].split()[0] for ln in lines
                                         if "building lab" in ln)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ln for ln in left.splitlines() if ln.startswith(prefix + "-")]
    for a in state.get("agents", []):
        assert not os.path.exists(f"/proc/{a['pid']}") or \
            b"agent" not in Path(f"/proc/{a['pid']}/cmdline").read_bytes()
