"""Scaling, host-network clients and NodePorts on real Kubernetes (``Lab(kubernetes="real")``).

One lab of three zones with equal allocatable CPU (:func:`three_zone_scaling_topology`), the
real control plane, the real kube-proxy (iptables mode) on every node and one real
``zonemeter agent`` per node on the apiserver with the agents' ServiceAccount token:

1. **Scaling ``shop/web`` (``topology-mode: Auto``) 9 -> 11 -> 12** (kubernetes#122437): with
   each zone 1/3 of the CPU the EndpointSlice controller needs ``ceil(n/3 / 1.2)`` endpoints
   per zone (``TopologyCache.getAllocations``, overload threshold 0.2): 3 each of 9 and 4 each
   of 12 fit, 4 each of 11 do not, so the hints the real controller wrote vanish at 11 (event
   ``TopologyAwareHintsDisabled``, "... overload threshold (11 endpoints, 3 zones)") and come
   back at 12. At every step: the hints on the real slices equal what ``zonemeter explain``
   says about the same apiserver, every agent's ``zonemeter_service_locality_in_effect`` and
   ``zonemeter_service_locality_info`` reason follow the real slices within two agent
   intervals, every real kube-proxy's endpoints equal the hinted set of its zone (or all),
   and the agents' bytes of a traffic phase equal the nftables ground truth.
2. **A host-network client** (``hostnet-a1``) calling ``shop/api``'s ClusterIP: the real
   kube-proxy marks it for masquerade (``! -s <cluster CIDR>``; its ``KUBE-POSTROUTING``
   MASQUERADE rule counts every connection), the servers see a1's address, and the agents
   bill the bytes once, to client zone-a, as the ground truth has them.
3. **A NodePort call from outside the cluster** (a peer on the lab's fabric, not a node) to
   b1's address: b1's kube-proxy forwards it to any endpoint and masquerades it to b1's
   address (externalTrafficPolicy Cluster), so the second hop is billed to b1's zone,
   zone-b, once, as the ground truth has it; the first hop (outside -> b1) passes no pod and
   is no Service byte.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.hints import MSG_MIN_ALLOCATION
from tests.fixtures.reallab import Key, running_fleet, wait_for
from tests.fixtures.topologies import three_zone_scaling_topology
from tools.demo.agents import AgentFleet, AgentMetrics
from tools.lab import Lab
from tools.lab.flows import OUTSIDE
from tools.lab.topology import Topology

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
#: agent interval (seconds); locality must follow the real slices within two of them
INTERVAL = 1.5
COUNT = 8
ZONES = ("zone-a", "zone-b", "zone-c")


@pytest.fixture(scope="class")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The lab of the test class: ``MODE`` (flat | vxlan), ``WEB_PER_ZONE`` web pods per zone;
    class-scoped, so one lab runs at a time."""
    data = yaml.safe_load(three_zone_scaling_topology(request.cls.WEB_PER_ZONE))
    data["options"]["mode"] = request.cls.MODE
    topo = Topology.from_dict(data, source="three-zone scaling topology")
    with Lab(topo, state_dir=tmp_path_factory.mktemp("realscale") / "state", kubernetes="real",
             proxy_mode="iptables", server_max_seconds=600) as lab:
        yield lab


@pytest.fixture(scope="class")
def fleet(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    yield from running_fleet(lab, tmp_path_factory.mktemp("logs"), INTERVAL)


# ------------------------------------------------------------------ ground truth and series


def _client_node(lab: Lab, client: str) -> str:
    """The node of a ground-truth client name: a pod's node, or ``node/<n>``'s ``n``."""
    return client.removeprefix("node/") if client.startswith("node/") else lab.topology.pod(client).node


def _truth_delta(lab: Lab, before: dict[tuple[str, str, str], int], service: str) -> dict[Key, int]:
    """Ground-truth bytes since ``before`` to ``service``'s endpoints, by series Key."""
    topo = lab.topology
    eps = set(topo.service(service).endpoints)
    out: dict[Key, int] = {}
    for (c, s, d), b in lab.ground_truth().items():
        delta = b - before.get((c, s, d), 0)
        if not delta or s not in eps:
            continue
        cn, sn = _client_node(lab, c), topo.pod(s).node
        cz, sz = topo.zone_of(cn), topo.zone_of(sn)
        x = "same_node" if cn == sn else "same_zone" if cz == sz else "cross_zone"
        out[(cz, sz, x, d)] = out.get((cz, sz, x, d), 0) + delta
    return out


def _series(m: AgentMetrics, service: str) -> dict[Key, int]:
    ns, name = service.split("/")
    return {(cz, sz, x, d): b for (n, s, cz, sz, x, d), b in m.service_bytes.items() if (n, s) == (ns, name) and b}


def _delta(after: dict[Key, int], before: dict[Key, int]) -> dict[Key, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _counted(lab: Lab, fleet: AgentFleet, service: str, traffic: Any) -> tuple[dict[Key, int], dict[Key, int],
                                                                                  AgentMetrics, AgentMetrics]:
    """Run ``traffic()``; return (ground truth, agents' series) deltas for ``service`` and the
    agents' settled metrics before and after."""
    m0 = fleet.scrape_settled()
    before = lab.ground_truth()
    traffic()
    m1 = fleet.scrape_settled(after=time.time())
    return _truth_delta(lab, before, service), _delta(_series(m1, service), _series(m0, service)), m0, m1


def _nothing_else(m0: AgentMetrics, m1: AgentMetrics) -> None:
    """No byte went anywhere but a Service series: no unattributed, hint-ignored or workload bytes."""
    assert _delta(dict(m1.unattributed), dict(m0.unattributed)) == {}  # type: ignore[arg-type]
    assert sum(m1.hint_ignored.values()) == sum(m0.hint_ignored.values())
    assert m1.workload_bytes == m0.workload_bytes


# ------------------------------------------------------------------ the real components' view


def _real_hints(lab: Lab, service: str) -> dict[str, list[str] | None]:
    """Endpoint address -> zones of its forZones hint (None: no hints) on the real slices."""
    ns, name = service.split("/")
    out: dict[str, list[str] | None] = {}
    for s in lab.real_slices():
        if s["metadata"]["namespace"] == ns and s["metadata"]["labels"].get("kubernetes.io/service-name") == name:
            for e in s.get("endpoints") or []:
                h = (e.get("hints") or {}).get("forZones")
                out[e["addresses"][0]] = sorted(z["name"] for z in h) if h else None
    return out


def _explain(lab: Lab, service: str) -> dict[str, Any]:
    """``zonemeter explain`` of ``service`` (IPv4) against the lab's apiserver."""
    p = subprocess.run([sys.executable, "-m", "agent", "explain", "--kubeconfig", str(lab.admin_kubeconfig),
                        "--service", service, "-o", "json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    (entry,) = [e for e in json.loads(p.stdout)["services"] if e["address_type"] == "IPv4"]
    return entry  # type: ignore[no-any-return]


def _last_hint_event(lab: Lab, name: str) -> tuple[str, str]:
    """(reason, message) of the newest TopologyAwareHints* event of Service shop/``name``."""
    items = json.loads(lab.kubectl("get", "events", "-n", "shop", "-o", "json").stdout)["items"]
    ev = [e for e in items if e["involvedObject"]["name"] == name and e["reason"].startswith("TopologyAwareHints")]
    last = max(ev, key=lambda e: (e.get("lastTimestamp") or "", int(e["metadata"]["resourceVersion"])))
    return last["reason"], last["message"]


def _web_ip_endpoints(lab: Lab) -> list[str]:
    return sorted(f"{lab.topology.pod(p).ip}:8080" for p in lab.topology.service("shop/web").endpoints)


def _locality(fleet: AgentFleet) -> dict[str, tuple[dict[str, bool] | None, str | None]]:
    """Per agent (node): shop/web's locality_in_effect by client zone and its info reason."""
    out = {}
    for node, m in fleet.scrape_nodes().items():
        info = m.info.get(("shop", "web"))
        out[node] = (m.in_effect.get(("shop", "web")), info[1] if info else None)
    return out


def _follow(lab: Lab, fleet: AgentFleet, n: int, hinted: bool) -> None:
    """After shop/web went to ``n`` endpoints: wait for the real controller's slices, then
    require every agent's locality and reason to follow within two intervals, and the model,
    the real kube-proxies and the controller's event to agree with the real slices."""
    ips = {str(lab.topology.pod(p).ip) for p in lab.topology.service("shop/web").endpoints}
    wait_for(f"the real slices at {n} endpoints", lambda: set(h := _real_hints(lab, "shop/web")) == ips
             and all((v is not None) == hinted for v in h.values()), timeout_s=60)
    seen = time.monotonic()
    hints = _real_hints(lab, "shop/web")
    reason = "none" if hinted else "min-allocation-exceeds-overload-threshold"
    want = {n.name: ({z: hinted for z in ZONES}, reason) for n in lab.topology.nodes}
    got: dict[str, Any] = {}

    def agents_follow() -> bool:
        got.update(_locality(fleet))
        return got == want

    while not agents_follow():
        assert time.monotonic() - seen < 2 * INTERVAL, \
            f"{n} endpoints: agents' locality {got} did not follow the real slices ({want}) within 2 intervals"
        time.sleep(0.1)
    # the hint model on the same objects says what the real controller wrote
    ex = _explain(lab, "shop/web")
    model = {a: (sorted(h["forZones"]) if h else None) for a, h in ex["controller"]["hints"].items()}
    assert model == hints, f"{n} endpoints: model hints {model} != real controller's {hints}"
    assert ex["locality_in_effect"] == {z: hinted for z in ZONES}
    real_reason, message = _last_hint_event(lab, "web")
    if hinted:
        assert real_reason == "TopologyAwareHintsEnabled", (real_reason, message)
        # enough endpoints in every zone: each is hinted for its own zone
        topo = lab.topology
        assert all(h == [topo.zone_of(topo.pod(lab.client_name(ipaddress.ip_address(a))).node)]
                   for a, h in hints.items()), hints
    else:
        assert (real_reason, message) == ("TopologyAwareHintsDisabled",
                                          f"{MSG_MIN_ALLOCATION} ({n} endpoints, 3 zones), addressType: IPv4")
        # the model, judging the current objects, emits the warning the real controller did
        # (the Enabled event marks a transition, which the current objects no longer show)
        assert (real_reason, message) in [(e["reason"], e["message"]) for e in ex["controller"]["events"]]
    # every real kube-proxy: its zone's hinted endpoints, or all of them
    cip = (str(lab.cluster_ip("shop/web")), "TCP", 80)

    def proxies_follow() -> bool:
        for node in lab.topology.nodes:
            zone_eps = sorted(f"{a}:8080" for a, h in hints.items() if h and node.zone in h) if hinted \
                else _web_ip_endpoints(lab)
            if lab.programmed_endpoints(node.name).get(cip) != zone_eps:
                return False
        return True

    wait_for(f"{n} endpoints: kube-proxies following the real slices", proxies_follow)


def _web_traffic(lab: Lab) -> None:
    cip = lab.cluster_ip("shop/web")
    for client in ("client-a1", "client-b1", "client-c1"):
        for port, proto in ((80, "tcp"), (53, "udp")):
            r = lab.run_flow(client, cip, port, proto, 100, 1000, COUNT, None)
            assert r.failed == 0, (client, proto, r.errors)


def _add_web(lab: Lab, *names: str) -> None:
    for name in names:
        lab.add_pod({"name": name, "namespace": "shop", "node": f"{name[4]}1", "app": "web",
                     "ports": [{"port": 8080, "name": "http"}, {"port": 5353, "protocol": "UDP", "name": "dns"}]})


# ------------------------------------------------------------------ tests


def _masquerades(lab: Lab, node: str) -> int:
    """Packets of the real kube-proxy's ``KUBE-POSTROUTING`` MASQUERADE rule on ``node``: NAT
    rules see a connection's first packet only, so one per masqueraded connection."""
    text = subprocess.run(["ip", "netns", "exec", lab.node_netns(node), "iptables-save", "-c", "-t", "nat"],
                          capture_output=True, text=True, check=True).stdout
    total = 0
    for line in text.splitlines():
        m = re.match(r"^\[(\d+):\d+\] -A KUBE-POSTROUTING .*-j MASQUERADE", line)
        if m:
            total += int(m.group(1))
    return total


def _host_network_call(lab: Lab, fleet: AgentFleet) -> tuple[dict[Key, int], dict[Key, int]]:
    """``hostnet-a1`` calls shop/api's ClusterIP; checks kube-proxy's masquerade rule and that it
    fired for every connection; returns (ground truth, agents' series) of the calls."""
    cip = lab.cluster_ip("shop/api")
    rules = subprocess.run(["ip", "netns", "exec", lab.node_netns("a1"), "iptables-save", "-t", "nat"],
                           capture_output=True, text=True, check=True).stdout
    # kube-proxy's rule for a ClusterIP reached from outside the cluster CIDR (a host-network client)
    assert re.search(rf"-A KUBE-SVC-\w+ ! -s {re.escape(str(lab.topology.options.pod_cidr))} -d {cip}/32 .*"
                     r"-j KUBE-MARK-MASQ", rules), rules
    masq0 = _masquerades(lab, "a1")
    count = 3 * COUNT

    def traffic() -> None:
        r = lab.run_flow("hostnet-a1", cip, 80, "tcp", 100, 1000, count, None)
        assert r.failed == 0, r.errors

    truth, agents, m0, m1 = _counted(lab, fleet, "shop/api", traffic)
    assert _masquerades(lab, "a1") - masq0 >= count
    assert truth and {k[0] for k in truth} == {"zone-a"}, truth  # the servers saw one of a1's addresses
    assert {k[1] for k in truth} == set(ZONES), truth  # no topology: every zone's endpoint served
    _nothing_else(m0, m1)
    return truth, agents


def _nodeport_call(lab: Lab, fleet: AgentFleet) -> tuple[dict[Key, int], dict[Key, int]]:
    """The outside peer calls shop/api's NodePort on b1's address; checks the Service the real
    apiserver holds and b1's masquerade; returns (ground truth, agents' series) of the calls."""
    lab.build_outside()
    b1 = lab.node_ip("b1")
    port = lab.node_port("shop/api")
    assert port == 30080
    real = json.loads(lab.kubectl("get", "service", "api", "-n", "shop", "-o", "json").stdout)["spec"]
    assert (real["type"], real["externalTrafficPolicy"], real["ports"][0]["nodePort"]) == ("NodePort", "Cluster", 30080)
    masq0 = _masquerades(lab, "b1")
    count = 3 * COUNT

    def traffic() -> None:
        r = lab.run_flow(OUTSIDE, b1, port, "tcp", 100, 1000, count, None)
        assert r.failed == 0, r.errors

    truth, agents, m0, m1 = _counted(lab, fleet, "shop/api", traffic)
    assert _masquerades(lab, "b1") - masq0 >= count
    # the second hop comes from one of b1's addresses (ground truth: node b1), however far it then went
    assert truth and {k[0] for k in truth} == {"zone-b"}, truth
    assert {k[1] for k in truth} == set(ZONES), truth
    assert f"ip/{lab.outside_address}" not in {c for c, _, _ in lab.ground_truth()}
    _nothing_else(m0, m1)
    return truth, agents


class TestFlat:
    """Flat routing: the masquerading node's address is its InternalIP."""

    MODE = "flat"
    WEB_PER_ZONE = 3

    def test_scaling_9_11_12_hints_vanish_and_return(self, lab: Lab, fleet: AgentFleet) -> None:
        """kubernetes#122437 with the real EndpointSlice controller, the agents following."""
        _follow(lab, fleet, 9, hinted=True)
        truth, agents, m0, m1 = _counted(lab, fleet, "shop/web", lambda: _web_traffic(lab))
        assert agents == truth
        assert "cross_zone" not in {k[2] for k in truth}, truth  # every zone keeps its own traffic
        _nothing_else(m0, m1)

        _add_web(lab, "web-a4", "web-b4")  # 11: zone minimums 4+4+4 > 11, the controller drops the hints
        _follow(lab, fleet, 11, hinted=False)
        truth, agents, m0, m1 = _counted(lab, fleet, "shop/web", lambda: _web_traffic(lab))
        assert agents == truth
        assert "cross_zone" in {k[2] for k in truth}, truth  # every zone's clients use every endpoint
        _nothing_else(m0, m1)

        _add_web(lab, "web-c4")  # 12: 4 per zone, the hints return
        _follow(lab, fleet, 12, hinted=True)
        truth, agents, m0, m1 = _counted(lab, fleet, "shop/web", lambda: _web_traffic(lab))
        assert agents == truth
        assert "cross_zone" not in {k[2] for k in truth}, truth
        _nothing_else(m0, m1)

    def test_host_network_client_masqueraded_by_the_real_kube_proxy(self, lab: Lab, fleet: AgentFleet) -> None:
        truth, agents = _host_network_call(lab, fleet)
        assert agents == truth

    def test_nodeport_from_outside_billed_to_the_receiving_node(self, lab: Lab, fleet: AgentFleet) -> None:
        truth, agents = _nodeport_call(lab, fleet)
        assert agents == truth

    def test_internal_traffic_policy_local(self, lab: Lab, fleet: AgentFleet) -> None:
        """Every real kube-proxy keeps shop/local on its own node (c1 has no endpoint: DROP), the
        bytes stay on the node, and the agents' locality is what explain says."""
        cip = (str(lab.cluster_ip("shop/local")), "TCP", 80)
        for node in lab.topology.nodes:
            own = sorted(f"{lab.topology.pod(p).ip}:8080" for p in lab.topology.service("shop/local").endpoints
                         if lab.topology.pod(p).node == node.name)
            assert lab.programmed_endpoints(node.name).get(cip) == own, node.name

        def traffic() -> None:
            for client in ("client-a1", "client-b1"):
                r = lab.run_flow(client, cip[0], 80, "tcp", 100, 1000, COUNT, None)
                assert r.failed == 0, (client, r.errors)
            r = lab.run_flow("client-c1", cip[0], 80, "tcp", 100, 1000, 1, None, timeout=1.0)
            assert r.failed == 1  # kube-proxy: "has no local endpoints" -j DROP

        truth, agents, m0, m1 = _counted(lab, fleet, "shop/local", traffic)
        assert {k[:3] for k in truth} == {("zone-a", "zone-a", "same_node"), ("zone-b", "zone-b", "same_node")}, truth
        assert agents == truth
        _nothing_else(m0, m1)
        ex = _explain(lab, "shop/local")
        info = {m.info.get(("shop", "local")) for m in fleet.scrape_nodes().values()}
        assert {i[1] for i in info if i} == {"internal-traffic-policy-local"}, info
        assert m1.in_effect[("shop", "local")] == ex["locality_in_effect"]


def _via_overlay(lab: Lab, truth: dict[Key, int]) -> dict[Key, int]:
    """What the agents make of ``truth`` when the masquerading node's source address is its VXLAN
    device's (``options.overlay_cidr``): no Node lists it, so a remote endpoint's agent resolves it
    EXTERNAL (docs/metadata.md, resolution order 5): client zone ``unknown``, crossing
    ``external``. Same-node hops leave through the pod's veth and keep the node's address."""
    out: dict[Key, int] = {}
    for (cz, sz, x, d), b in truth.items():
        k = (cz, sz, x, d) if x == "same_node" else ("unknown", sz, "external", d)
        out[k] = out.get(k, 0) + b
    return out


class TestVxlan:
    """VXLAN: the masquerading node's source address towards a remote endpoint is its VXLAN
    device's, which the agents cannot map (docs/lab.md, "What the real components showed"):
    the bytes are exact and counted once, their client zone is lost."""

    MODE = "vxlan"
    WEB_PER_ZONE = 1

    def test_host_network_client_through_the_overlay(self, lab: Lab, fleet: AgentFleet) -> None:
        truth, agents = _host_network_call(lab, fleet)
        assert "cross_zone" in {k[2] for k in truth}, truth
        assert agents == _via_overlay(lab, truth)
        assert lab.topology.node("a1").overlay_ip is not None
        assert {(str(a), s) for a, s, d in lab._raw_counters() if d == "request" and s == "api-b1"} == \
            {(str(lab.topology.node("a1").overlay_ip), "api-b1")}

    def test_nodeport_from_outside_through_the_overlay(self, lab: Lab, fleet: AgentFleet) -> None:
        truth, agents = _nodeport_call(lab, fleet)
        assert agents == _via_overlay(lab, truth)
