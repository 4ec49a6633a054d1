"""zonemeter agent end to end on the lab: real processes, real datapath, exported == ground truth.

A lab (tools/lab) with three nodes in two zones: web endpoints on a1 (zone-a) and b1
(zone-b), clients on a1, a2 and b1. One real ``python -m agent agent --snapshot ...
--netns ...`` process runs for each node that hosts an endpoint (a1, b1): Service bytes
are counted only at the endpoint's node, so these two agents see every Service byte.
Traffic goes through the ClusterIP (TCP 80 and UDP 53, kube-proxy picks an endpoint per
connection, so same-node, same-zone and cross-zone) and straight to a pod IP. The sum of
``zonemeter_service_bytes_total`` over both agents, per (client zone, server zone,
crossing, direction), equals the lab's nftables ground truth exactly; nothing lands in
workload or unattributed series (nothing double counted); the client-side copies show up
only as skipped bytes. Then more traffic, SIGTERM at once: the final export (scraped
during ``--final-linger-seconds``) still equals ground truth, the agents exit 0 and leave
no filter behind.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.datapath import tcx
from tests.fixtures.hooks import zonemeter_hooks
from tests.fixtures.topologies import AGENT_LAB_TOPOLOGY
from tests.kernel._dp_fixtures import Foreign

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]

TOPOLOGY = AGENT_LAB_TOPOLOGY

AGENT_NODES = ("a1", "b1")
#: ``--attach`` per agent node: one legacy clsact agent beside one TCX agent, both exact
ATTACH = {"a1": "clsact", "b1": "auto"}
INTERVAL = 2.0
LINGER = 4.0

Key = tuple[str, str, str, str]  # client_zone, server_zone, crossing, direction


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


class Agents:
    def __init__(self, lab, snapshot: Path, logdir: Path,  # type: ignore[no-untyped-def]
                 attach: dict[str, str] | None = None,
                 extra: dict[str, list[str]] | None = None) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self.logs: dict[str, Path] = {}
        for node in AGENT_NODES:
            port = _free_port()
            self.urls[node] = f"http://127.0.0.1:{port}"
            self.logs[node] = logdir / f"agent-{node}.log"
            argv = [sys.executable, "-m", "agent", "agent", "--node-name", node,
                    "--snapshot", str(snapshot), "--netns", lab.node_netns(node),
                    "--metrics-address", f"127.0.0.1:{port}", "--interval", f"{INTERVAL:g}",
                    "--exclude-interfaces", f"{lab.prefix}u*",
                    "--final-linger-seconds", f"{LINGER:g}",
                    "--attach", (attach or ATTACH)[node], *(extra or {}).get(node, [])]
            with open(self.logs[node], "wb") as log:
                self.procs[node] = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log,
                                                    stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        pending = set(AGENT_NODES)
        while pending and time.monotonic() < deadline:
            for node in sorted(pending):
                if self.procs[node].poll() is not None:
                    raise AssertionError(f"agent {node} exited: {self.logs[node].read_text()[-2000:]}")
                try:
                    if _get(self.urls[node] + "/readyz")[0] == 200:
                        pending.discard(node)
                except OSError:
                    pass
            time.sleep(0.2)
        assert not pending, f"agents not ready: {pending}"

    def scrape(self, node: str) -> str:
        status, text = _get(self.urls[node] + "/metrics")
        assert status == 200
        return text

    def stop(self, timeout: float = 30.0) -> dict[str, int]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        return {n: p.wait(timeout) for n, p in self.procs.items()}

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)


def service_bytes(texts: list[str]) -> tuple[dict[Key, int], dict[str, int]]:
    """Sum over agents: web's service bytes per Key (ports summed), and other byte families."""
    per: dict[Key, int] = defaultdict(int)
    other: dict[str, int] = defaultdict(int)
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "zonemeter_service_bytes_total":
                    assert (s.labels["namespace"], s.labels["service"]) == ("shop", "web"), s
                    k = (s.labels["client_zone"], s.labels["server_zone"], s.labels["crossing"],
                         s.labels["direction"])
                    per[k] += int(s.value)
                elif s.name in ("zonemeter_workload_bytes_total", "zonemeter_unattributed_bytes_total",
                                "zonemeter_skipped_bytes_total", "zonemeter_unknown_crossing_bytes_total"):
                    key = s.name + ("" if "reason" not in s.labels else "/" + s.labels["reason"])
                    other[key] += int(s.value)
    return dict(per), dict(other)


def expected(lab) -> dict[Key, int]:  # type: ignore[no-untyped-def]
    topo = lab.topology
    out: dict[Key, int] = defaultdict(int)
    for (client, server, direction), nbytes in lab.ground_truth().items():
        if not nbytes:
            continue
        c, s = topo.pod(client), topo.pod(server)
        cz, sz = topo.zone_of(c.node), topo.zone_of(s.node)
        crossing = "same_node" if c.node == s.node else "same_zone" if cz == sz else "cross_zone"
        out[(cz, sz, crossing, direction)] += nbytes
    return dict(out)


def traffic(lab, rounds: int = 1) -> None:  # type: ignore[no-untyped-def]
    cip = lab.cluster_ip("shop/web")
    for _ in range(rounds):
        for client in ("client-a1", "client-a2", "client-b1"):
            lab.run_flow(client, cip, 80, "tcp", 1200, 9000, count=6)
            lab.run_flow(client, cip, 53, "udp", 200, 700, count=4)
        lab.run_flow("client-a2", lab.pod_ip("web-b1"), 8080, "tcp", 500, 3000, count=2)


def _filters_left(lab) -> list[str]:  # type: ignore[no-untyped-def]
    """``node/dev/hook`` of every zonemeter hook left on the agent nodes."""
    return [f"{node}/{hook}" for node in AGENT_NODES for hook in zonemeter_hooks(lab.node_netns(node))]


@pytest.fixture(scope="module")
def lab() -> Iterator[object]:
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(TOPOLOGY)) as the_lab:
        yield the_lab


def test_agents_export_ground_truth_and_stop_cleanly(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    agents = Agents(lab, snapshot, tmp_path)
    try:
        agents.wait_ready()
        lab.reset_ground_truth()
        traffic(lab)
        time.sleep(INTERVAL * 1.5)  # a normal interval tick exports everything drained
        got, other = service_bytes([agents.scrape(n) for n in AGENT_NODES])
        want = expected(lab)
        assert got == want
        assert {k[2] for k in want} == {"same_node", "same_zone", "cross_zone"}
        assert {k[3] for k in want} == {"request", "response"}
        # nothing double counted: no workload or unattributed bytes, copies only skipped
        assert {k: v for k, v in other.items() if v and "skipped" not in k} == {}
        assert other.get("zonemeter_skipped_bytes_total/clusterip_client_copy", 0) > 0
        text = agents.scrape("a1")
        assert ('zonemeter_service_locality_info{mode="none",namespace="shop",reason="not-requested",service="web"} 1.0'
                in text)
        assert "zonemeter_attached_interfaces 2.0" in text  # client-a1 and web-a1
        # --attach reached the datapath: a1's hooks are tc filters, b1's TCX links (kernel 6.6+)
        hooks = {n: {h.split("/")[1] for h in zonemeter_hooks(lab.node_netns(n))} for n in AGENT_NODES}
        assert hooks == {"a1": {"ingress", "egress"}, "b1": {"tcx-ingress", "tcx-egress"}}, hooks

        # more traffic, then SIGTERM at once: the final export carries it
        traffic(lab)
        for p in agents.procs.values():
            p.send_signal(signal.SIGTERM)
        time.sleep(LINGER / 2)
        got, _ = service_bytes([agents.scrape(n) for n in AGENT_NODES])
        assert got == expected(lab)
        rcs = agents.stop()
        assert rcs == {"a1": 0, "b1": 0}, {n: agents.logs[n].read_text()[-2000:] for n in AGENT_NODES}
        assert _filters_left(lab) == []
    finally:
        agents.kill()


def coverage(text: str) -> dict[str, float]:
    """The hook coverage samples of one agent's exposition."""
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith(("zonemeter_hook_", "zonemeter_interface_bytes"))}


def test_a_starved_hook_is_alarmed_and_a_tcx_hook_is_not_starved(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A foreign TCX program (a CNI's, as Cilium's) in front of a1's pod veths ends the
    chain for IPv4 UDP: the clsact agent's programs never see it while the veths carry it,
    and the agent says so (ratio, unseen bytes, one log line). An agent attached with TCX
    puts its links first, before the foreign ones, and counts everything."""
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    foreign = []
    for pod in ("client-a1", "web-a1"):
        ns, host = lab.host_veth(pod)
        foreign += [Foreign(ns, host, side, tcx.BPF_F_BEFORE, tcx.TCX_PASS) for side, _ in tcx.SIDES]
    try:
        for mode in ("clsact", "tcx"):
            logdir = tmp_path / mode
            logdir.mkdir()
            agents = Agents(lab, snapshot, logdir, attach={"a1": mode, "b1": "auto"})
            try:
                agents.wait_ready()
                before = sum(f.seen() for f in foreign)
                # 200 exchanges of 1,200 + 1,400 UDP bytes between two pods of a1: ~1 MB
                # over each of the two veths, in both directions
                lab.run_flow("client-a1", lab.pod_ip("web-a1"), 5353, "udp", 1200, 1400, count=200)
                time.sleep(INTERVAL * 2.5)
                got = coverage(agents.scrape("a1"))
                assert sum(f.seen() for f in foreign) - before >= 4 * 200  # the foreign programs ran
                log = agents.logs["a1"]
                if mode == "clsact":
                    assert got["zonemeter_hook_coverage_ratio"] < 0.1, got
                    assert got["zonemeter_hook_unseen_bytes_total"] > 4 * 200 * 1200, got
                    assert log.read_text().count("hook coverage low") == 1
                else:
                    assert 0.98 < got["zonemeter_hook_coverage_ratio"] <= 1.05, got
                    # the odd ARP frame, nothing more
                    assert got["zonemeter_hook_unseen_bytes_total"] < 50 * 28, got
                    assert "hook coverage low" not in log.read_text()
                assert agents.stop() == {"a1": 0, "b1": 0}
            finally:
                agents.kill()
    finally:
        for f in foreign:
            f.close()


HINTED = (TOPOLOGY
          .replace("  - {name: a2, zone: zone-a, cpu: 4}", "  - {name: a2, zone: zone-a, cpu: 4, ignoreHints: true}")
          .replace("    selector: {app: web}\n", "    selector: {app: web}\n    trafficDistribution: PreferSameZone\n"))


def hint_series(texts: list[str]) -> tuple[dict[tuple[str, str], int], dict[str, float], set[tuple[str, str]]]:
    """(hint-ignored bytes by (client_zone, server_zone), in_effect by zone, (mode, reason))."""
    ignored: dict[tuple[str, str], int] = defaultdict(int)
    in_effect: dict[str, float] = {}
    info: set[tuple[str, str]] = set()
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "zonemeter_service_hint_ignored_bytes_total":
                    ignored[(s.labels["client_zone"], s.labels["server_zone"])] += int(s.value)
                elif s.name == "zonemeter_service_locality_in_effect":
                    in_effect[s.labels["client_zone"]] = s.value
                elif s.name == "zonemeter_service_locality_info":
                    info.add((s.labels["mode"], s.labels["reason"]))
    return dict(ignored), in_effect, info


def cause_series(texts: list[str]) -> tuple[dict[tuple[str, str, str, str], int],
                                            dict[tuple[str, str, str, str], int]]:
    """(hint-ignored bytes by (namespace, service, client_node, client_kind), client path
    bytes by (namespace, service, client_node, path)), summed over the agents' texts."""
    by_node: dict[tuple[str, str, str, str], int] = defaultdict(int)
    paths: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                lb = s.labels
                if s.name == "zonemeter_service_hint_ignored_bytes_total":
                    by_node[(lb["namespace"], lb["service"], lb["client_node"], lb["client_kind"])] += int(s.value)
                elif s.name == "zonemeter_service_client_path_bytes_total":
                    paths[(lb["namespace"], lb["service"], lb["client_node"], lb["path"])] += int(s.value)
    return dict(by_node), dict(paths)


def test_hint_ignored_bytes_equal_the_ignoring_nodes_cross_zone_bytes(tmp_path: Path) -> None:
    """Hints per zone are in effect (the model says so), but node a2's data plane ignores
    them: every byte between client-a2 and web-b1 (zone-b), through the ClusterIP or
    dialled directly, is hint-ignored; the other clients' kube-proxies honour the hints."""
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(HINTED)) as hl:
        own_zone = {"web-a1": {"forZones": ["zone-a"]}, "web-b1": {"forZones": ["zone-b"]}}
        snapshot = hl.write_snapshot(tmp_path / "lab.json", hints=lambda svc: own_zone)
        zone_pod = {"zone-a": "web-a1", "zone-b": "web-b1"}
        hl.program_proxies(lambda svc, node: [zone_pod[node.zone]])
        agents = Agents(hl, snapshot, tmp_path)
        try:
            agents.wait_ready()
            hl.reset_ground_truth()
            traffic(hl)
            time.sleep(INTERVAL * 1.5)
            texts = [agents.scrape(n) for n in AGENT_NODES]
            got, other = service_bytes(texts)
            assert got == expected(hl)
            ignored, in_effect, info = hint_series(texts)
            truth = hl.ground_truth()
            a2_to_b1 = sum(v for (c, s, _), v in truth.items() if (c, s) == ("client-a2", "web-b1"))
            assert a2_to_b1 > 0
            assert ignored == {("zone-a", "zone-b"): a2_to_b1}
            # all of it is a2's, and a2 runs no agent here: nobody saw whether its client
            # used the ClusterIP or dialled web-b1, so the cause is unknown; a1's agent saw
            # its own client's ClusterIP calls (evidence for a1, which ignored nothing)
            from agent.attribution.verdict import hint_verdicts

            by_node, paths = cause_series(texts)
            assert by_node == {("shop", "web", "a2", "pod"): a2_to_b1}
            assert paths.get(("shop", "web", "a1", "clusterip"), 0) > 0
            assert not any(k[2] == "a2" for k in paths)
            assert [(v.client_node, v.cause, v.bytes) for v in hint_verdicts(by_node, paths)] == [
                ("a2", "unknown", a2_to_b1)]
            # honouring nodes never crossed zones
            assert all(v == 0 for (c, s, _), v in truth.items()
                       if c in ("client-a1", "client-b1") and s != c.replace("client", "web"))
            assert in_effect == {"zone-a": 1.0, "zone-b": 1.0}
            assert info == {("PreferSameZone", "none")}
            assert agents.stop() == {"a1": 0, "b1": 0}
        finally:
            agents.kill()
