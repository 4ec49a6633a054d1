"""``zonemeter agent --pod-scope node`` on the lab's real Kubernetes (docs/metadata.md, "Pod scope").

The lab's default topology on the real control plane and the real kube-proxy (iptables), one
real agent per node reading the real kube-apiserver with deploy/daemonset's ServiceAccount
token, each listing and watching only its own node's Pods (``fieldSelector=
spec.nodeName=NODE``, served by the apiserver's watch cache). ClusterIP traffic from every
client, TCP and UDP, reaches endpoints on the same node, in the same zone and across zones:

* the agents' ``zonemeter_service_bytes_total`` per (client zone, server zone, crossing,
  direction) equal the lab's nftables ground truth, exactly: remote clients' zones come from
  their Node's podCIDR, and nothing is counted twice or lost;
* each agent's ``/flows`` rows, read while the traffic runs, name its own node's pods and
  show every other node's client by address: the apiserver sent it no other node's Pod.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from tests.fixtures.reallab import Key, web_bytes, web_phase
from tools.demo.agents import AgentFleet
from tools.lab import Lab
from tools.lab.examples import DEFAULT_TOPOLOGY
from tools.lab.topology import Topology

pytestmark = [pytest.mark.e2e]

INTERVAL = 1.0
COUNT = 15


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    work = tmp_path_factory.mktemp("podscope")
    topo = Topology.from_dict(yaml.safe_load(DEFAULT_TOPOLOGY), source="default topology")
    with Lab(topo, state_dir=work / "state", kubernetes="real", proxy_mode="iptables",
             server_max_seconds=600) as lab:
        yield lab


def test_node_scope_counts_exactly_with_only_its_own_pods(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> None:
    topo = lab.topology
    fleet = AgentFleet(lab, None, tmp_path_factory.mktemp("logs"), INTERVAL, kubeconfig=lab.agent_kubeconfig,
                       extra_args=("--pod-scope", "node"))
    fleet.start()
    try:
        truth: dict[Key, int] = {}
        rows: dict[str, set[tuple[str, str]]] = {a.node: set() for a in fleet.agents}
        # /flows holds the pairs of the last interval only: read it while traffic runs, and
        # run another round until every agent showed some (at most four rounds)
        for _ in range(4):
            done = threading.Event()
            got: dict[Key, int] = {}

            def traffic(got: dict[Key, int] = got, done: threading.Event = done) -> None:
                try:
                    got.update(web_phase(lab, COUNT))
                finally:
                    done.set()

            t = threading.Thread(target=traffic)
            t.start()
            while not done.is_set():
                for a in fleet.agents:
                    with urllib.request.urlopen(a.url + "/flows?top=200", timeout=5) as resp:
                        doc = json.load(resp)
                    rows[a.node] |= {(p["client"], p["server"]) for p in doc["pairs"]
                                     if (p["namespace"], p["service"]) == ("shop", "web")}
                time.sleep(0.2)
            t.join()
            for k, v in got.items():
                truth[k] = truth.get(k, 0) + v
            if all(rows.values()):
                break
        assert {k[2] for k in truth} == {"same_node", "same_zone", "cross_zone"}, truth
        m = fleet.scrape_settled(after=time.time())
        assert web_bytes(m) == truth
        assert m.unattributed.get("attribution_error", 0) == 0

        clients = [p for p in ("client-a1", "client-a2", "client-b1")]
        for node, seen in rows.items():
            assert seen, f"no shop/web pair rows read from {node}'s /flows"
            for client, server in seen:
                assert topo.pod(server.split("/", 1)[1]).node == node, (node, server)
                local = [c for c in clients if topo.pod(c).node == node]
                others = {str(topo.pod(c).ip): c for c in clients if topo.pod(c).node != node}
                # a pod of this node by name; another node's client (no endpoint) by its address
                assert client in {f"shop/{c}" for c in local} | set(others), (node, client)
        assert any(c in {str(topo.pod(x).ip) for x in clients} for s in rows.values() for c, _ in s)
    finally:
        codes = fleet.stop()
    assert set(codes.values()) == {0}, codes
