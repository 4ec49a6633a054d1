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


# -- exactly once across kill -9, with a checkpoint ---------------------------------------

#: attribution counters the checkpoint carries: none of their series may ever go down
CHECKPOINTED = ("zonemeter_service_bytes_total", "zonemeter_service_hint_ignored_bytes_total",
                "zonemeter_workload_bytes_total", "zonemeter_unattributed_bytes_total",
                "zonemeter_unknown_crossing_bytes_total", "zonemeter_skipped_bytes_total",
                "zonemeter_diagnostic_bytes_total", "zonemeter_series_expired_total",
                "zonemeter_checkpoint_discarded_total")
KILLS_PER_AGENT = 10  # two agents: 20 kill -9 per attach mode
FAST = 0.4  # --interval of the crash test, seconds: many drains per agent life
TRAFFIC_COUNT = 400  # requests per client at 12/s: traffic lasts about as long as the kills


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if _get(url + "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"agent not ready: {log.read_text()[-2000:]}")


class Watcher:
    """Scrapes every agent's /metrics in a thread and records each checkpointed series'
    last value per node; ``decreases`` lists every series that ever went down."""

    def __init__(self, urls: dict[str, str]) -> None:
        import threading

        self.urls = urls
        self.last: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        self.decreases: list[str] = []
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        while not self._stop.is_set():
            for node, url in self.urls.items():
                try:
                    status, text = _get(url + "/metrics")
                    if status != 200:
                        continue
                    samples = [s for fam in text_string_to_metric_families(text)
                               for s in fam.samples]
                except Exception:  # noqa: BLE001 - no agent there now, or killed mid-answer
                    continue
                self.scrapes += 1
                for s in samples:
                    if s.name not in CHECKPOINTED:
                        continue
                    key = (node, s.name, tuple(sorted(s.labels.items())))
                    old = self.last.get(key)
                    if old is not None and s.value < old:
                        self.decreases.append(f"{key}: {old} -> {s.value}")
                    self.last[key] = s.value
            self._stop.wait(0.05)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _crash_plan(rng) -> list[str | None]:  # type: ignore[no-untyped-def]
    """One agent's kills: every named crash point at a random drain, and the rest as an
    outside ``kill -9`` at a random moment (None)."""
    from agent.checkpoint import CRASH_POINTS

    plan: list[str | None] = [f"{p}:{rng.randint(1, 3)}" for p in CRASH_POINTS]
    plan += [None] * (KILLS_PER_AGENT - 1 - len(plan))
    rng.shuffle(plan)
    return [None, *plan]  # the first agent, attached before the traffic, dies from outside


@pytest.mark.parametrize("attach", ["clsact", "tcx"])
def test_kill_9_at_any_point_neither_loses_nor_doubles_nor_resets(  # type: ignore[no-untyped-def]
        lab, bpffs: Path, tmp_path: Path, attach: str) -> None:
    """20 kill -9 per attach mode while traffic flows: each agent life ends at a named
    point of the drain/checkpoint/clear sequence (``ZONEMETER_TEST_CRASH_AT``) or at a
    random moment; the next agent resumes from the checkpoint and the pinned tables'
    markers. The last agents' counters alone equal the ground truth exactly (no reset:
    nothing to add from earlier lives), and no checkpointed series ever went down."""
    import random
    import threading

    from tests.kernel.test_agent_lab import service_bytes as sums

    seed = secrets.randbits(32)
    rng = random.Random(seed)
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    ports = {n: _free_port() for n in NODES}
    urls = {n: f"http://127.0.0.1:{ports[n]}" for n in NODES}

    def argv(node: str) -> list[str]:
        out = _argv(lab, node, snapshot, bpffs, ports[node])
        out[out.index("--interval") + 1] = f"{FAST:g}"
        return [*out, "--attach", attach, "--checkpoint-path", str(tmp_path / f"cp-{node}")]

    def start(node: str, crash: str | None) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop("ZONEMETER_TEST_CRASH_AT", None)
        if crash is not None:
            env["ZONEMETER_TEST_CRASH_AT"] = crash
        with open(tmp_path / f"agent-{node}.log", "ab") as fh:
            fh.write(f"--- start, crash at {crash}\n".encode())
            fh.flush()
            return subprocess.Popen(argv(node), cwd=ROOT, stdout=fh, stderr=fh,
                                    stdin=subprocess.DEVNULL, env=env)

    failures: list[str] = []
    procs: dict[str, subprocess.Popen[bytes]] = {}
    plans = {n: _crash_plan(rng) for n in NODES}

    def lives(node: str) -> None:
        for i, crash in enumerate(plans[node]):
            p = procs[node] = procs[node] if i == 0 else start(node, crash)
            if crash is None:  # an outside kill -9 at a random moment of a running agent
                time.sleep(rng.uniform(0.0, 1.5))
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and p.poll() is None:
                    try:
                        if _get(urls[node] + "/readyz")[0] == 200:
                            break
                    except OSError:
                        pass
                    time.sleep(0.1)
                time.sleep(rng.uniform(0.0, 2 * FAST))
                p.kill()
            rc = p.wait(60)
            if rc != -signal.SIGKILL:
                failures.append(f"{node} crash at {crash}: exit {rc}")
                return

    watcher = Watcher(urls)
    flows = []
    finals: dict[str, Agent] = {}
    try:
        for n in NODES:
            procs[n] = start(n, None)
        for n in NODES:
            _wait_ready(urls[n], procs[n], tmp_path / f"agent-{n}.log")
        lab.reset_ground_truth()  # every byte from here on is under the attached programs
        cip = lab.cluster_ip("shop/web")
        flows = [lab.start_flow(c, cip, 80, "tcp", 1200, 9000, count=TRAFFIC_COUNT, rate=12)
                 for c in ("client-a1", "client-a2", "client-b1")]
        began = time.monotonic()
        threads = [threading.Thread(target=lives, args=(n,)) for n in NODES]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert failures == [], (seed, failures)
        print(f"seed {seed}: {2 * KILLS_PER_AGENT} kills in {time.monotonic() - began:.1f} s")
        finals = {n: Agent(argv(n), urls[n], tmp_path / f"agent-{n}.log") for n in NODES}
        for a in finals.values():
            a.wait_ready()
        results = [f.wait() for f in flows]
        assert sum(r.failed for r in results) == 0
        assert sum(r.ok for r in results) == 3 * TRAFFIC_COUNT
        want = expected(lab)
        deadline = time.monotonic() + 30
        while True:  # the first drain of an agent counts the idle table, the next the active one
            texts = [_get(urls[n] + "/metrics")[1] for n in NODES]
            got, other = sums(texts)
            if {k: v for k, v in got.items() if v} == want or time.monotonic() > deadline:
                break
            time.sleep(FAST)
        assert watcher.alive()  # it watched until the end
        watcher.stop()
        logs = {n: (tmp_path / f"agent-{n}.log").read_text() for n in NODES}
        assert {k: v for k, v in got.items() if v} == want, (seed, plans)
        assert {k: v for k, v in other.items() if v and "skipped" not in k} == {}, seed
        assert watcher.decreases == [], (seed, watcher.decreases[:5])
        assert watcher.scrapes > 50
        for n in NODES:
            assert logs[n].count("crash at") == KILLS_PER_AGENT
            assert "checkpoint" in logs[n] and "discarded" not in logs[n]
            assert "reusing pinned maps" in logs[n]
        for a in finals.values():
            a.proc.send_signal(signal.SIGTERM)
        assert [a.proc.wait(30) for a in finals.values()] == [0, 0]
    finally:
        watcher.stop()
        for f in flows:
            f.stop()
        for p in [*procs.values(), *(a.proc for a in finals.values())]:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for n in NODES:  # nothing of ours stays attached, whatever failed
            subprocess.run([sys.executable, "-m", "agent", "agent", "--node-name", n,
                            "--netns", lab.node_netns(n), "--pin-path", str(bpffs / n),
                            "--cleanup"], cwd=ROOT, capture_output=True, timeout=60)
