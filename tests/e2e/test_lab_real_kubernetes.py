"""The lab's default topology on real Kubernetes (``Lab(kubernetes="real")``, tools/lab/kube.py).

etcd, kube-apiserver and kube-controller-manager built by tools/kube/build.sh run in the lab's
control-plane namespace; the real kube-proxy (iptables mode) runs in every node namespace; the
EndpointSlices and their hints are the real controller's; one real ``zonemeter agent`` per node
reads the apiserver with the token of deploy/daemonset's ServiceAccount (RBAC applied with
``kubectl apply -k``). Two phases of ClusterIP traffic from every client, TCP and UDP:

Once with kube-proxy in iptables mode, once in nftables mode on a dual-stack lab (traffic to
the IPv4 ClusterIP; the IPv6 slices, hints and rules are checked against explain too).

1. ``shop/web`` as the default topology has it (no topology annotation): no hints, every node's
   kube-proxy uses all three endpoints;
2. after ``service.kubernetes.io/topology-mode: Auto`` is set on it with kubectl: the real
   controller writes zone hints and the real kube-proxies follow them.

For each phase: the agents' per-Service bytes (client zone, server zone, crossing, direction)
equal the lab's nftables ground truth, so nothing is counted twice or missed; no byte is
hint-ignored (the real kube-proxy honours hints). After phase 2: the hints on the real slices
equal what ``zonemeter explain`` against the same apiserver says the controller writes, the
endpoints every real kube-proxy programmed equal explain's proxy view per node, and the agents'
``locality_in_effect`` equals explain's; after a server pod is deleted, the recomputed hints and
the kube-proxies' endpoints, the controller's last event and the agents' locality again equal
explain's. A write with the agents' token is refused with 403.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.reallab import Key, running_fleet, wait_for, web_bytes, web_phase
from tools.demo.agents import AgentFleet
from tools.lab import Lab
from tools.lab.examples import DEFAULT_TOPOLOGY
from tools.lab.topology import Topology

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 1.0
COUNT = 15


@pytest.fixture(scope="module", params=[("iptables", False), ("nftables", True)],
                ids=["iptables", "nftables-dualstack"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    work = tmp_path_factory.mktemp("realkube")
    mode, ipv6 = request.param
    data = yaml.safe_load(DEFAULT_TOPOLOGY)
    data["options"]["ipv6"] = ipv6
    topo = Topology.from_dict(data, source="default topology")
    with Lab(topo, state_dir=work / "state", kubernetes="real", proxy_mode=mode,
             server_max_seconds=600) as lab:
        yield lab


@pytest.fixture(scope="module")
def fleet(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    yield from running_fleet(lab, tmp_path_factory.mktemp("logs"), INTERVAL)


def _phase(lab: Lab) -> dict[Key, int]:
    return web_phase(lab, COUNT)


def _explain(lab: Lab) -> dict[str, dict[str, Any]]:
    """``zonemeter explain`` of shop/web against the lab's apiserver: address type -> entry."""
    p = subprocess.run([sys.executable, "-m", "agent", "explain", "--kubeconfig", str(lab.admin_kubeconfig),
                        "--service", "shop/web", "-o", "json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return {e["address_type"]: e for e in json.loads(p.stdout)["services"]}


def _families(lab: Lab) -> dict[str, tuple[str, str, int]]:
    """Address type -> the (ClusterIP, protocol, port) key of shop/web's http port."""
    out = {"IPv4": (str(lab.cluster_ip("shop/web")), "TCP", 80)}
    if lab.topology.options.ipv6:
        out["IPv6"] = (str(lab.cluster_ip("shop/web", 6)), "TCP", 80)
    return out


def _ep(address: str) -> str:
    return f"[{address}]:8080" if ":" in address else f"{address}:8080"


def _model_hints(ex: dict[str, dict[str, Any]]) -> dict[str, list[str] | None]:
    return {a: (sorted(h["forZones"]) if h else None)
            for e in ex.values() for a, h in e["controller"]["hints"].items()}


def _proxies_match_explain(lab: Lab, ex: dict[str, dict[str, Any]]) -> bool:
    return all(lab.programmed_endpoints(n.name)[cip] == sorted(ex[at]["proxy"][n.name]["cluster_endpoints"])
               for n in lab.topology.nodes for at, cip in _families(lab).items())


def _real_hints(lab: Lab) -> dict[str, list[str] | None]:
    """Endpoint address -> zones of its forZones hint (None: no hints) on the real slices of shop/web."""
    out: dict[str, list[str] | None] = {}
    for s in lab.real_slices():
        if s["metadata"]["namespace"] == "shop" and s["metadata"]["labels"].get("kubernetes.io/service-name") == "web":
            for e in s.get("endpoints") or []:
                h = (e.get("hints") or {}).get("forZones")
                out[e["addresses"][0]] = sorted(z["name"] for z in h) if h else None
    return out


def test_agent_token_cannot_write(lab: Lab) -> None:
    kc = yaml.safe_load(lab.agent_kubeconfig.read_text())
    token = kc["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=kc["clusters"][0]["cluster"]["certificate-authority"])
    server = kc["clusters"][0]["cluster"]["server"]
    # reading is what the ClusterRole grants
    req = urllib.request.Request(f"{server}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        assert {n["metadata"]["name"] for n in json.load(resp)["items"]} == {"a1", "a2", "b1"}
    # a write is refused by RBAC: 403 Forbidden naming the ServiceAccount
    patch = urllib.request.Request(
        f"{server}/api/v1/namespaces/shop/services/web", method="PATCH",
        data=json.dumps({"metadata": {"annotations": {"zonemeter/test": "x"}}}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(patch, context=ctx, timeout=10)
    assert refused.value.code == 403
    assert "system:serviceaccount:zonemeter:zonemeter-agent" in refused.value.read().decode()


def test_default_topology_counts_exactly_and_follows_the_real_controller(lab: Lab, fleet: AgentFleet) -> None:
    topo = lab.topology
    # phase 1: no topology annotation, so no hints; every real kube-proxy uses every endpoint
    assert set(_real_hints(lab).values()) == {None}
    for family, (at, cip) in zip((4, 6), _families(lab).items(), strict=False):
        every = sorted(_ep(str(topo.pod(p).address(family))) for p in ("web-a1", "web-a2", "web-b1"))
        for n in topo.nodes:
            assert lab.programmed_endpoints(n.name)[cip] == every, (at, n.name)
    truth1 = _phase(lab)
    assert {k[2] for k in truth1} == {"same_node", "same_zone", "cross_zone"}, truth1
    m1 = fleet.scrape_settled(after=time.time())
    assert web_bytes(m1) == truth1
    assert sum(m1.hint_ignored.values()) == 0
    assert m1.in_effect[("shop", "web")] == {"zone-a": False, "zone-b": False}

    # phase 2: ask for Auto; the real controller decides the hints, the real kube-proxies follow
    lab.kubectl("annotate", "service", "web", "-n", "shop", "service.kubernetes.io/topology-mode=Auto")
    wait_for("hints on the real slices", lambda: None not in _real_hints(lab).values())
    hints = _real_hints(lab)

    def by_zone(zone: str, at: str) -> list[str]:
        return sorted(_ep(a) for a, h in hints.items() if h and zone in h and (":" in a) == (at == "IPv6"))

    wait_for("kube-proxies following the hints", lambda: all(
        lab.programmed_endpoints(n.name)[cip] == by_zone(n.zone, at)
        for n in topo.nodes for at, cip in _families(lab).items()))
    wait_for("agents' locality in effect", lambda: fleet.scrape().in_effect.get(("shop", "web")) ==
          {"zone-a": True, "zone-b": True}, timeout_s=10 * INTERVAL)
    m1 = fleet.scrape_settled()
    truth2 = _phase(lab)
    m2 = fleet.scrape_settled(after=time.time())
    web1, web2 = web_bytes(m1), web_bytes(m2)
    delta = {k: v - web1.get(k, 0) for k, v in web2.items() if v != web1.get(k, 0)}
    assert delta == truth2
    assert "cross_zone" not in {k[2] for k in truth2}, truth2  # the hints kept every byte in its zone
    assert sum(m2.hint_ignored.values()) == 0

    # what the hint model says about the same apiserver, against what the real components did
    ex = _explain(lab)
    assert set(ex) == set(_families(lab))
    model = _model_hints(ex)
    assert model == hints, f"model hints {model} != real controller's {hints}"
    assert _proxies_match_explain(lab, ex)
    assert ex["IPv4"]["locality_in_effect"] == m2.in_effect[("shop", "web")]
    assert m2.unattributed.get("attribution_error", 0) == 0

    # a server pod goes: 2 endpoints in 2 zones. The real controller recomputes (and, for this
    # cluster, drops) the hints in the same sync that removes the endpoint; the model must agree,
    # down to the event it emits
    gone = {str(a) for a in (topo.pod("web-a2").ip, topo.pod("web-a2").ip6) if a is not None}
    lab.remove_pod("web-a2")
    wait_for("web-a2 gone from the slices", lambda: not gone & set(_real_hints(lab)))
    hints = _real_hints(lab)
    ex = _explain(lab)
    model = _model_hints(ex)
    assert model == hints, f"after removing web-a2: model hints {model} != real controller's {hints}"
    real_events = [e for e in json.loads(lab.kubectl("get", "events", "-n", "shop", "-o", "json").stdout)["items"]
                   if e["involvedObject"]["name"] == "web" and e["reason"].startswith("TopologyAwareHints")]
    last = max(real_events, key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["resourceVersion"]))
    # the address families are reconciled one after the other: the newest event is one of theirs
    assert (last["reason"], last["message"]) in [(e["reason"], e["message"])
                                                 for x in ex.values() for e in x["controller"]["events"]]
    wait_for("kube-proxies following the new slices", lambda: _proxies_match_explain(lab, ex))
    wait_for("agents' locality following the real slices", lambda: fleet.scrape().in_effect.get(("shop", "web")) ==
          ex["IPv4"]["locality_in_effect"], timeout_s=10 * INTERVAL)
