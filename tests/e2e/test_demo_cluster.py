"""The demo lab as a cluster (docs/demo.md) (no agent involved).

The default demo cluster is built for real; the test checks that the EndpointSlices carry
the hints the controller model computes, that every node's kube-proxy emulation holds
exactly the endpoints the kube-proxy model selects there (c2, which ignores hints, every
ready endpoint), and that the ground truth turns into per-Service expectations that agree
with an independent reading of the raw counters.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.k8s.snapshot import load
from tests.fixtures.lab_hints import lab_hints
from tools.demo.cluster import DemoCluster
from tools.demo.topology import load_demo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoCluster]:
    work = tmp_path_factory.mktemp("demo")
    c = DemoCluster(load_demo(), work, hints=lab_hints("oracle"), state_dir=work / "state", server_max_seconds=600)
    c.up()
    try:
        yield c
    finally:
        c.down()


def _hints_by_pod(snapshot: dict) -> dict[str, dict | None]:  # type: ignore[type-arg]
    out = {}
    for o in snapshot["items"]:
        if o["kind"] == "EndpointSlice":
            for ep in o["endpoints"]:
                out[ep["targetRef"]["name"]] = ep.get("hints")
    return out


def test_snapshot_carries_controller_hints(cluster: DemoCluster) -> None:
    snap = load(cluster.snapshot_path)
    assert len(snap.nodes) == 6 and len(snap.services) == 5
    hints = _hints_by_pod({"items": snap.endpointslices})
    topo = cluster.topology
    for pod, h in hints.items():
        node = topo.pod(pod).node
        if pod.startswith("checkout-"):      # PreferSameZone: own zone
            assert h == {"forZones": [{"name": topo.zone_of(node)}]}
        elif pod.startswith("node-cache-"):  # PreferSameNode: own node and zone
            assert h == {"forZones": [{"name": topo.zone_of(node)}],
                         "forNodes": [{"name": node}]}
        else:                                # catalog: none; cart, payments: Auto refused
            assert h is None, pod


def test_model_reasons(cluster: DemoCluster) -> None:
    m = cluster.models
    assert (m["shop/catalog"].mode, m["shop/catalog"].reason) == ("none", "not-requested")
    assert m["shop/cart"].mode == "topology-mode"
    # 8 endpoints in three equal zones: Auto refuses (minimum 3 per zone > 8/3 * 1.2)
    assert m["shop/cart"].reason == "min-allocation-exceeds-overload-threshold"
    assert (m["shop/checkout"].mode, m["shop/checkout"].reason) == ("PreferSameZone", "none")
    assert (m["shop/node-cache"].mode, m["shop/node-cache"].reason) == ("PreferSameNode", "none")
    assert m["shop/payments"].mode == "topology-mode"
    assert "auto-shadows-traffic-distribution" in m["shop/payments"].warnings
    assert not any(m["shop/payments"].locality_in_effect.values())
    assert all(m["shop/checkout"].locality_in_effect.values())


def test_proxies_hold_model_selection_except_c2(cluster: DemoCluster) -> None:
    # the lab follows upstream (tools/oracle); the model the agents run agrees with it here
    assert cluster.hints.kind == "oracle" and cluster.disagreements == []
    topo = cluster.topology
    for svc in topo.services:
        model = cluster.models[svc.key]
        for node in topo.nodes:
            got = cluster.programmed(svc.key, node.name)
            if node.name == "c2":
                assert got == tuple(sorted(svc.endpoints))
            else:
                assert got == model.selection[node.name], (svc.key, node.name)
    assert cluster.programmed("shop/checkout", "b1") == ("checkout-b1", "checkout-b2")
    assert cluster.programmed("shop/node-cache", "a2") == ("node-cache-a2",)
    # the rules in the node namespace say the same (one DNAT per programmed endpoint)
    ns = cluster.lab.node_netns("a1")
    rules = subprocess.run(["ip", "netns", "exec", ns, "iptables-save", "-t", "nat"],
                           capture_output=True, text=True, check=True).stdout
    checkout = [ln for ln in rules.splitlines() if "shop/checkout:http ->" in ln]
    assert len(checkout) == 2  # one KUBE-SEP jump per selected endpoint
    dnat = [ln for ln in rules.splitlines() if "-j DNAT" in ln]
    # a1: catalog 6 + cart 8 + checkout 2 + node-cache 1 + payments 4
    assert len(dnat) == 21


def test_traffic_truth(cluster: DemoCluster) -> None:
    cluster.lab.reset_ground_truth()
    handles = cluster.start_traffic(duration_seconds=2.0, rate=10)
    results = [h.wait() for h in handles]
    assert sum(r.failed for r in results) == 0
    assert sum(r.ok for r in results) == 6 * 5 * 20
    gt = cluster.lab.ground_truth()
    truth = cluster.truth(gt)
    topo = cluster.topology
    # every byte lands in exactly one Service and crossing
    assert sum(sum(t.bytes.values()) for t in truth.values()) == sum(gt.values())
    assert "" not in truth
    # node-cache: every node but c2 stays on its node; c2 spreads (hints ignored)
    nc = truth["shop/node-cache"]
    own = sum(n for (c, s, _), n in gt.items() if s.startswith("node-cache-")
              and topo.pod(c).node == topo.pod(s).node)
    assert nc.bytes["same_node"] == own
    # checkout: only c2's clients cross zones
    co = truth["shop/checkout"]
    c2_cross = sum(n for (c, s, _), n in gt.items() if c == "frontend-c2"
                   and s.startswith("checkout-") and topo.zone_of(topo.pod(s).node) != "zone-c")
    assert co.cross_zone_bytes == c2_cross > 0
    # hint-ignored: computed independently from the raw counters
    assert co.hint_ignored_bytes == c2_cross
    c2_nc = sum(n for (c, s, _), n in gt.items() if c == "frontend-c2"
                and s.startswith("node-cache-") and s != "node-cache-c2")
    assert nc.hint_ignored_bytes == c2_nc > 0
    for key in ("shop/catalog", "shop/cart", "shop/payments"):
        assert truth[key].hint_ignored_bytes == 0  # no topology filtering anywhere
        assert truth[key].cross_zone_bytes > 0


def test_snapshot_file_is_rewritten_atomically(cluster: DemoCluster, tmp_path: Path) -> None:
    before = cluster.snapshot_path.stat().st_mtime_ns
    cluster.write_snapshot()
    assert cluster.snapshot_path.stat().st_mtime_ns >= before
    assert not cluster.snapshot_path.with_name("snapshot.json.tmp").exists()


def _eth0(cluster: DemoCluster, pod: str) -> dict[str, int]:
    ns = cluster.lab.pod_netns(pod)
    out = {}
    for name in ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets"):
        out[name] = int(subprocess.run(
            ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/eth0/statistics/{name}"],
            capture_output=True, text=True, check=True).stdout)
    return out


def test_ground_truth_survives_two_removals_during_traffic(cluster: DemoCluster) -> None:
    """Regression: a second removal folded the archive into itself, and counters zeroed
    after reading lost what arrived in between. Traffic keeps running across both removals
    and the ground truth must equal the server's own interface counters (L2 bytes minus
    14 per frame: the lab pins neighbours, so only the pods' IP packets cross eth0)."""
    lab = cluster.lab
    lab.reset_ground_truth()
    before = _eth0(cluster, "catalog-a2")
    handle = lab.start_flow("frontend-a1", lab.pod_ip("catalog-a2"), 8080, count=60, rate=20)
    time.sleep(0.7)
    lab.remove_pod("cart-7")
    lab.remove_pod("cart-8")
    assert handle.wait().ok == 60
    after = _eth0(cluster, "catalog-a2")
    gt = lab.ground_truth_counters()
    req_b, req_p = gt[("frontend-a1", "catalog-a2", "request")]
    resp_b, resp_p = gt[("frontend-a1", "catalog-a2", "response")]
    assert req_p == after["rx_packets"] - before["rx_packets"]
    assert req_b == after["rx_bytes"] - before["rx_bytes"] - 14 * req_p
    assert resp_p == after["tx_packets"] - before["tx_packets"]
    assert resp_b == after["tx_bytes"] - before["tx_bytes"] - 14 * resp_p
