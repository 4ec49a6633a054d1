"""The agents against a real kube-apiserver that goes away (``Lab(kubernetes="real")``).

The default topology on the real control plane (tools/lab/kube.py, tools/kube/controlplane.py),
kube-proxy in iptables mode, one real ``zonemeter agent`` per node with the ServiceAccount token.
Two cases of docs/reliability.md, each ending with the agents' per-Service bytes (client zone,
server zone, crossing, direction) equal to the lab's nftables ground truth:

1. a real ``410 Gone``: the agents are cut off from the apiserver (their relay frozen,
   ``Lab.hold_relay``), kube-apiserver is stopped, etcd is compacted past every revision the
   agents saw (etcd's gRPC gateway, :meth:`ControlPlane.compact_etcd`) and the apiserver started
   again, so its new watch cache begins after the agents' resourceVersions; a server pod is
   replaced by one in the other zone, then the agents are let through. Every agent logs the
   expired resourceVersion of its Pod watch and lists again after the change, and attributes
   the new pod's traffic;
2. kube-apiserver down for longer than the agents' 30 s unsync threshold while traffic runs:
   the bytes of the outage are counted, every agent reports ``zonemeter_metadata_synced`` 0,
   then 1 again once the apiserver is back (each lists its Pods again), and a server pod created
   right after it came back (while the agents were still backing off) is attributed right.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.fixtures.reallab import Key, running_fleet, wait_for, web_bytes, web_phase
from tools.demo.agents import AgentFleet, AgentMetrics
from tools.lab import Lab
from tools.lab.examples import DEFAULT_TOPOLOGY
from tools.lab.topology import Topology

pytestmark = [pytest.mark.e2e]

INTERVAL = 1.0
COUNT = 10
#: the agents' unsync threshold (agent/k8s/watch.py, WatchSettings.unsynced_after_seconds)
UNSYNCED_AFTER_S = 30.0
SYNCED = re.compile(r'^zonemeter_metadata_synced\{resource="(\w+)"\} (\S+)$', re.M)
WEB_PORTS = [{"port": 8080, "name": "http"}, {"port": 5353, "protocol": "UDP", "name": "dns"}]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    topo = Topology.from_dict(yaml.safe_load(DEFAULT_TOPOLOGY), source="default topology")
    with Lab(topo, state_dir=tmp_path_factory.mktemp("outage") / "state", kubernetes="real",
             proxy_mode="iptables", server_max_seconds=600) as lab:
        yield lab


@pytest.fixture(scope="module")
def fleet(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    yield from running_fleet(lab, tmp_path_factory.mktemp("logs"), INTERVAL)


def _phase(lab: Lab) -> dict[Key, int]:
    return web_phase(lab, COUNT)


def _delta(before: AgentMetrics, after: AgentMetrics) -> dict[Key, int]:
    a, b = web_bytes(before), web_bytes(after)
    return {k: v - a.get(k, 0) for k, v in b.items() if v != a.get(k, 0)}


def _add(*parts: dict[Key, int]) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0) + v
    return out


def _synced(fleet: AgentFleet) -> dict[str, dict[str, float]]:
    """Node -> resource -> ``zonemeter_metadata_synced`` of that node's agent."""
    return {node: {r: float(v) for r, v in SYNCED.findall(text)} for node, text in fleet.scrape_text().items()}


def _gone_lines(fleet: AgentFleet) -> dict[str, int]:
    """Node -> how many times its agent logged an expired Pod watch (agent/k8s/watch.py)."""
    return {a.node: sum(1 for line in a.log.read_text(errors="replace").splitlines()
                        if "pods: resourceVersion" in line and "expired (410 Gone)" in line)
            for a in fleet.agents}


def _relisted_after(fleet: AgentFleet, t: float) -> dict[str, float]:
    """Node -> time (Unix s) its agent first listed Pods after ``t``, for agents that did."""
    out: dict[str, float] = {}
    for a in fleet.agents:
        for line in a.log.read_text(errors="replace").splitlines():
            if "listed pods at resourceVersion" in line:
                ts = float(json.loads(line)["ts"])
                if ts > t:
                    out[a.node] = ts
                    break
    return out


def _served(lab: Lab, pod: str) -> int:
    """Bytes the ground truth has for server pod ``pod``."""
    return sum(b for (_c, s, _d), b in lab.ground_truth().items() if s == pod)


def _replace(lab: Lab, old: str, new: str, node: str) -> None:
    """Delete server pod ``old`` and create ``new`` (same labels, ports) on ``node``."""
    lab.remove_pod(old)
    lab.add_pod({"name": new, "namespace": "shop", "node": node, "app": "web", "ports": WEB_PORTS})


def test_410_gone_after_compaction_relists_and_loses_nothing(lab: Lab, fleet: AgentFleet) -> None:
    m0 = fleet.scrape_settled()
    truth1 = _phase(lab)
    assert {k[2] for k in truth1} == {"same_node", "same_zone", "cross_zone"}, truth1
    m1 = fleet.scrape_settled(after=time.time())
    assert _delta(m0, m1) == truth1
    assert _gone_lines(fleet) == {n.name: 0 for n in lab.topology.nodes}

    # the agents are cut off (their relay frozen) before the apiserver goes, and until the pod
    # change is done: web-a2 (zone-a) goes, web-b2 (zone-b) comes while their watches are broken
    lab.hold_relay(True)
    try:
        lab.stop_apiserver()
        rev = lab.compact_etcd()
        lab.start_apiserver()
        changed = time.time()
        _replace(lab, "web-a2", "web-b2", "b1")
    finally:
        lab.hold_relay(False)
    wait_for("every agent's Pod watch answered 410 Gone",
          lambda: all(_gone_lines(fleet).values()), timeout_s=60)
    nodes = {n.name for n in lab.topology.nodes}
    wait_for("every agent listed its Pods again after the change",
          lambda: set(_relisted_after(fleet, changed)) == nodes, timeout_s=30)
    relisted = _relisted_after(fleet, changed)
    assert all(v == 1 for r in _synced(fleet).values() for v in r.values())
    truth2 = _phase(lab)
    assert _served(lab, "web-b2")
    m2 = fleet.scrape_settled(after=time.time())
    assert _delta(m1, m2) == truth2, f"etcd compacted to revision {rev}"
    print(f"compacted to revision {rev}; pod change began {changed:.3f}; Pod relists {relisted}")
    assert m2.unattributed.get("attribution_error", 0) == 0


def test_apiserver_outage_unsynced_then_recovers(lab: Lab, fleet: AgentFleet) -> None:
    m0 = fleet.scrape_settled()
    lab.stop_apiserver()
    stopped = time.monotonic()
    truth_outage = _phase(lab)  # the real kube-proxies keep their rules: traffic goes on
    wait_for("every agent unsynced", lambda: all(v == 0 for r in _synced(fleet).values() for v in r.values()),
          timeout_s=UNSYNCED_AFTER_S + 30)
    assert time.monotonic() - stopped >= UNSYNCED_AFTER_S
    lab.start_apiserver()
    # right after the apiserver is back, before the agents' backoff ends: a server pod web-a3
    # is created. (A deletion would wait for every kube-proxy to drop the pod, and they back
    # off as long as the agents do: client-go's reflector, up to 30 s.)
    added = time.time()
    ip = str(lab.add_pod({"name": "web-a3", "namespace": "shop", "node": "a1", "app": "web",
                          "ports": WEB_PORTS}).ip)
    wait_for("every agent synced again", lambda: all(v == 1 for r in _synced(fleet).values() for v in r.values()),
          timeout_s=60)
    wait_for("every kube-proxy forwarding to web-a3", lambda: all(
        f"{ip}:8080" in lab.programmed_endpoints(n.name)[(str(lab.cluster_ip("shop/web")), "TCP", 80)]
        for n in lab.topology.nodes), timeout_s=60)
    relisted = _relisted_after(fleet, added)
    assert set(relisted) == {n.name for n in lab.topology.nodes}, relisted
    truth_after = _phase(lab)
    assert _served(lab, "web-a3")
    m1 = fleet.scrape_settled(after=time.time())
    assert _delta(m0, m1) == _add(truth_outage, truth_after)
    assert m1.unattributed.get("attribution_error", 0) == 0
