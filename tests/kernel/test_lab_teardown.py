"""Teardown leaves no namespace, link, rule or process behind, also after a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import RuntimeFailure
from tools.lab import Lab, Topology

pytestmark = [
    pytest.mark.kernel,
]

SMALL = """
options: {mode: vxlan, ipv6: true}
zones: [{name: z1}, {name: z2}]
nodes: [{name: n1, zone: z1}, {name: n2, zone: z2}]
pods:
  - {name: c, node: n1}
  - {name: s, node: n2, app: s, ports: [{port: 8080}]}
services:
  - {name: svc, selector: {app: s}, ports: [{port: 80, targetPort: 8080}]}
"""
ROOT = Path(__file__).resolve().parents[2]


def _netns(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix + "-")]


def _netns_pids(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _host_links(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if prefix in line]


def test_down_removes_everything_and_is_idempotent(tmp_path: Path) -> None:
    lab = Lab(Topology.from_yaml(SMALL), state_dir=tmp_path)
    lab.up()
    try:
        assert lab.run_flow("c", lab.cluster_ip("svc"), 80).ok == 1
        names = _netns(lab.prefix)
        assert sorted(names) == sorted(lab.all_netns())
        servers = _netns_pids(lab.pod_netns("s"))
        assert servers and all(_alive(p) for p in servers)
        assert lab.state_file.exists()
    finally:
        removed = lab.down()
    assert sorted(removed) == sorted(names)
    assert _netns(lab.prefix) == []
    assert not any(_alive(p) for p in servers)
    assert not lab.state_file.exists()
    assert _host_links(lab.prefix) == []
    assert lab.down() == []  # idempotent
    assert Lab.down_prefix(lab.prefix, tmp_path) == []


def test_failed_up_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = Lab(Topology.from_yaml(SMALL), state_dir=tmp_path)

    def boom(self: Lab) -> None:
        raise RuntimeFailure("injected failure after the data path was built")

    monkeypatch.setattr(Lab, "program_all_nodes", boom)
    with pytest.raises(RuntimeFailure, match="injected"):
        lab.up()
    assert _netns(lab.prefix) == []
    assert not lab.state_file.exists()


def test_down_prefix_cleans_a_crashed_lab(tmp_path: Path) -> None:
    prefix = "zmcrash" + os.urandom(1).hex()
    # a process that builds a lab and dies without tearing it down (SIGKILL-like exit)
    script = "\n".join([
        "import os",
        "from tools.lab import Lab, Topology",
        f"Lab(Topology.from_yaml({SMALL!r}), prefix={prefix!r}, state_dir={str(tmp_path)!r}).up()",
        "os._exit(3)",
    ])
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3, proc.stderr
    names = _netns(prefix)
    assert len(names) == 5
    servers = _netns_pids(f"{prefix}-pod-s")
    assert servers and all(_alive(p) for p in servers)
    # a new process that knows only the prefix cleans everything
    removed = Lab.down_prefix(prefix, tmp_path)
    assert sorted(removed) == sorted(names)
    assert _netns(prefix) == []
    assert not any(_alive(p) for p in servers)
    assert not (tmp_path / f"{prefix}.json").exists()
    assert _host_links(prefix) == []


def test_prefix_in_use_is_refused(tmp_path: Path) -> None:
    topo = Topology.from_yaml(SMALL)
    with Lab(topo, state_dir=tmp_path) as lab:
        with pytest.raises(RuntimeFailure, match="in use"):
            Lab(topo, prefix=lab.prefix, state_dir=tmp_path).up()
        assert sorted(_netns(lab.prefix)) == sorted(lab.all_netns())  # left intact
