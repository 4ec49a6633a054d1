"""Restart without loss at agent level: ``zonemeter agent --pin-path`` survives ``kill -9``.

Two real agents (lab nodes a1 and b1, the endpoints' nodes) with pinned flow tables count
traffic that keeps flowing through the ClusterIP. Each is killed with SIGKILL right after a
scrape of its latest export (as Prometheus would have it); the traffic goes on while no
agent runs; new agents on the same pin paths reuse the tables (the kernel kept counting)
and replace the filters. What the killed agents had exported plus what the new agents
export equals the lab's nftables ground truth exactly, per (client zone, server zone,
crossing, direction): one counter reset, nothing lost, nothing twice. Then SIGTERM (the
agents release: filters and pins stay) and ``zonemeter agent --cleanup`` removes both.

Pins live on a private bpffs mounted in a temporary directory (unmounted after).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.test_agent_lab import (
    TOPOLOGY,
    _filters_left,
    _free_port,
    _get,
    expected,
    service_bytes,
)

pytestmark = pytest.mark.kernel
ROOT = Path(__file__).resolve().parents[2]
NODES = ("a1", "b1")
INTERVAL = 2.0


@pytest.fixture()
def bpffs() -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="zm" + secrets.token_hex(2)))
    subprocess.run(["mount", "-t", "bpf", "bpf", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        os.rmdir(mnt)


@pytest.fixture()
def lab() -> Iterator[object]:
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(TOPOLOGY)) as the_lab:
        yield the_lab


def _argv(lab, node: str, snapshot: Path, pins: Path, port: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [sys.executable, "-m", "agent", "agent", "--node-name", node, "--snapshot",
            str(snapshot), "--netns", lab.node_netns(node), "--metrics-address",
            f"127.0.0.1:{port}", "--interval", f"{INTERVAL:g}", "--exclude-interfaces",
            f"{lab.prefix}u*", "--pin-path", str(pins / node)]


class Agent:
    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.url = url
        self.log = log
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=fh, stderr=fh,
                                         stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                if _get(self.url + "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"agent not ready: {self.log.read_text()[-2000:]}")

    def generated_at(self) -> float:
        return float(json.loads(_get(self.url + "/flows?top=1")[1])["generated_at"])

    def scrape_then_kill(self) -> str:
        """Wait for a fresh export, scrape it, SIGKILL at once (the next drain is an
        interval away): what Prometheus last saw of this agent is all it drained."""
        last = self.generated_at()
        while self.generated_at() == last:
            time.sleep(0.05)
        status, text = _get(self.url + "/metrics")
        self.proc.kill()
        self.proc.wait(10)
        assert status == 200
        return text


def test_kill_9_and_restart_lose_nothing(lab, bpffs: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    ports = {n: _free_port() for n in NODES}
    urls = {n: f"http://127.0.0.1:{ports[n]}" for n in NODES}
    agents = {n: Agent(_argv(lab, n, snapshot, bpffs, ports[n]), urls[n],
                       tmp_path / f"agent-{n}.log") for n in NODES}
    flows = []
    try:
        for a in agents.values():
            a.wait_ready()
        lab.reset_ground_truth()
        cip = lab.cluster_ip("shop/web")
        flows = [lab.start_flow(c, cip, 80, "tcp", 1200, 9000, count=60, rate=6)
                 for c in ("client-a1", "client-a2", "client-b1")]
        time.sleep(3)
        before = [agents[n].scrape_then_kill() for n in NODES]
        time.sleep(2)  # no agent runs; the pinned tables keep counting
        agents = {n: Agent(_argv(lab, n, snapshot, bpffs, ports[n]), urls[n],
                           tmp_path / f"agent-{n}.log") for n in NODES}
        for a in agents.values():
            a.wait_ready()
        results = [f.wait() for f in flows]
        assert sum(r.failed for r in results) == 0 and sum(r.ok for r in results) == 180
        time.sleep(INTERVAL * 1.5)
        after = [_get(agents[n].url + "/metrics")[1] for n in NODES]
        got_before, _ = service_bytes(before)
        got_after, other = service_bytes(after)
        assert sum(got_before.values()) > 0 and sum(got_after.values()) > 0
        total = {k: got_before.get(k, 0) + got_after.get(k, 0)
                 for k in set(got_before) | set(got_after)}
        assert {k: v for k, v in total.items() if v} == expected(lab)
        assert {k: v for k, v in other.items() if v and "skipped" not in k} == {}
        for n in NODES:
            assert "reusing pinned maps" in agents[n].log.read_text()

        # SIGTERM with pinning: final export, then the filters and pins stay ...
        for a in agents.values():
            a.proc.send_signal(signal.SIGTERM)
        assert [a.proc.wait(30) for a in agents.values()] == [0, 0]
        assert len(_filters_left(lab)) > 0
        # ... until --cleanup removes both
        for n in NODES:
            out = subprocess.run([sys.executable, "-m", "agent", "agent", "--node-name", n,
                                  "--netns", lab.node_netns(n), "--pin-path", str(bpffs / n),
                                  "--cleanup"], cwd=ROOT, capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout.strip().splitlines()[-1])["pins_removed"]
        assert _filters_left(lab) == []
        assert not any((bpffs / n).exists() for n in NODES)
    finally:
        for f in flows:
            f.stop()
        for a in agents.values():
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait(10)
        for n in NODES:  # nothing of ours stays attached, whatever failed
            subprocess.run([sys.executable, "-m", "agent", "agent", "--node-name", n,
                            "--netns", lab.node_netns(n), "--pin-path", str(bpffs / n),
                            "--cleanup"], cwd=ROOT, capture_output=True, timeout=60)
