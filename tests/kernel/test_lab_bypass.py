"""A data plane that bypasses the host veth (tools/lab/bypass.py, as Cilium's BPF host
routing and socket-LB): the veth hook is starved and says so; the cgroup hook still
counts every byte once, equal to the ground truth inside the pods' namespaces.

Flat two-node lab (nodes a, b; client a1, servers a2 and b1 behind ``default/svc``).
Every packet between pods is moved by ``bpf_redirect_peer``/``bpf_redirect_neigh``, and
ClusterIPs are resolved at ``connect()``/``sendmsg()``; ground truth is the lab's nftables
counters in the server pods' namespaces (tools/lab/groundtruth.py), which no program of
ours or of the bypass plane touches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from test_datapath import PROTO, SERVICE, SERVICE_PORT, SIZES, TOPOLOGY, VIP_PORT, attribute

from agent.datapath import Datapath, DatapathConfig
from agent.datapath.coverage import MIN_TCP_PACKETS, STARVED_RATIO, HookCoverage, tcp_packets
from agent.records import FlowDelta, IPAddress
from tools.lab import Lab, Topology
from tools.lab.bypass import BypassDataPlane

pytestmark = pytest.mark.kernel


@dataclass
class Env:
    """What test_datapath.attribute reads: the lab and its pod addresses."""

    lab: Lab
    dps: dict[str, Datapath] = field(default_factory=dict)

    def pod_ip(self, pod: str, family: int) -> IPAddress:
        return self.lab.pod_ip(pod, family)

    def attach(self, hook: str) -> None:
        """One datapath per node on ``hook`` (the cgroup one scoped to the node's pods)."""
        self.close_datapaths()
        for node in ("a", "b"):
            ns, uplink = self.lab.uplink(node)
            scope = tuple(self.lab.pod_netns(p.name) for p in self.lab.topology.pods_on(node))
            dp = Datapath(DatapathConfig(netns=ns, exclude_patterns=(uplink,), flow_capacity=4096,
                                         hook=hook, scope_netns=scope if hook == "cgroup" else ()))
            self.dps[node] = dp
            dp.attach()
            dp.set_local_endpoints(
                (self.lab.pod_ip(pod.name, fam), SERVICE_PORT, proto)
                for pod in self.lab.topology.pods_on(node) if pod.name != "a1"
                for fam in (4, 6) for proto in PROTO.values())

    def drain(self) -> dict[str, list[FlowDelta]]:
        return {node: dp.drain() for node, dp in self.dps.items()}

    def close_datapaths(self) -> None:
        for dp in self.dps.values():
            dp.close()
        self.dps = {}


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    lab = Lab(Topology.from_yaml(TOPOLOGY.replace("MODE", "flat"))).up()
    e = Env(lab)
    try:
        yield e
    finally:
        e.close_datapaths()
        lab.down()


def run(env: Env, client: str, dst: IPAddress, port: int, proto: str, count: int = 2) -> None:
    req, resp = SIZES[proto]
    result = env.lab.run_flow(client, dst, port, proto, request_bytes=req,
                              response_bytes=resp, count=count)
    assert (result.ok, result.failed) == (count, 0), result


def test_veth_hook_is_starved_and_the_coverage_alarm_says_so(env: Env) -> None:
    env.attach("veth")  # ours first, then the data plane puts its programs at the head
    plane = BypassDataPlane(env.lab)
    try:
        cov = HookCoverage()
        env.drain()  # the interface counters' baseline
        for node in ("a", "b"):
            cov.add(0.0, 0, env.dps[node].interface_bytes())
        for placement in (("a1", "a2"), ("a1", "b1")):
            run(env, placement[0], env.pod_ip(placement[1], 4), SERVICE_PORT, "tcp", count=12)
        run(env, "a1", env.lab.cluster_ip(SERVICE, 4), VIP_PORT, "tcp", count=12)
        per_node = env.drain()
        counted = sum(d.bytes for ds in per_node.values() for d in ds)
        interfaces = {(node, i): c for node, dp in env.dps.items()
                      for i, c in dp.interface_bytes().items()}
        state = cov.add(1.0, counted, interfaces)  # type: ignore[arg-type]
        # the pods' veths carried the traffic (their rx counters), our programs saw none
        assert state.carried_bytes > 12 * 3 * sum(SIZES["tcp"])
        assert state.ratio < STARVED_RATIO and state.starved, state
    finally:
        plane.close()
        env.close_datapaths()


def test_veth_hook_first_on_the_bypass_plane_sees_one_direction_and_says_so(env: Env) -> None:
    """Our TCX links attached after the data plane's go first: every packet out of a pod
    is counted, but bpf_redirect_peer moves every packet into a pod past the host veth,
    its egress hook and its tx counters alike. The byte comparison reads complete; the
    TCP direction comparison finds nothing counted into the pods."""
    plane = BypassDataPlane(env.lab)
    try:
        env.attach("veth")  # after the plane: ours at the head of each list
        cov = HookCoverage()
        env.drain()
        for node in ("a", "b"):
            cov.add(0.0, 0, env.dps[node].interface_bytes())
        run(env, "a1", env.pod_ip("b1", 4), SERVICE_PORT, "tcp", count=100)
        per_node = env.drain()
        deltas = [d for ds in per_node.values() for d in ds]
        interfaces = {(node, i): c for node, dp in env.dps.items()
                      for i, c in dp.interface_bytes().items()}
        into, out = tcp_packets(deltas)
        state = cov.add(1.0, sum(d.bytes for d in deltas), interfaces, (into, out))  # type: ignore[arg-type]
    finally:
        plane.close()
        env.close_datapaths()
    assert out >= MIN_TCP_PACKETS and into == 0, (into, out)
    # what the veths' own counters say matches what ours counted: no byte gap to see
    assert state.ratio > 0.95, state
    assert state.tcp_direction_ratio == 0.0 and state.starved, state


CASES = [(fam, proto, placement, access) for fam in (4, 6) for proto in ("tcp", "udp")
         for placement in ("same_node", "cross_node") for access in ("clusterip", "podip")]


@pytest.mark.parametrize("family,proto,placement,access", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_cgroup_hook_counts_the_bypass_plane_once_equal_to_ground_truth(
        env: Env, family: int, proto: str, placement: str, access: str) -> None:
    client, server = {"same_node": ("a1", "a2"), "cross_node": ("a1", "b1")}[placement]
    for node in ("a", "b"):  # the socket-LB picks what each node's proxy would: this server
        env.lab.set_service_endpoints(SERVICE, node, [server])
    if not env.dps:
        env.attach("cgroup")
    plane = BypassDataPlane(env.lab)
    try:
        env.drain()
        env.lab.reset_ground_truth()
        dst, port = ((env.lab.cluster_ip(SERVICE, family), VIP_PORT) if access == "clusterip"
                     else (env.pod_ip(server, family), SERVICE_PORT))
        run(env, client, dst, port, proto)
        truth = env.lab.ground_truth_counters()
        per_node = env.drain()
        kept, raw, dropped = attribute(env, per_node, client, server, family)  # type: ignore[arg-type]
    finally:
        plane.close()
    # the socket-LB resolved the ClusterIP at connect()/sendmsg(): no socket saw it
    vip = env.lab.cluster_ip(SERVICE, family)
    assert not [d for ds in per_node.values() for d in ds if d.remote == vip]
    expected = {k: list(v) for k, v in truth.items() if k[:2] == (client, server) and v[0]}
    assert set(expected) == {(client, server, "request"), (client, server, "response")}
    assert kept == expected
    # the socket-LB resolved the ClusterIP before any packet: the client's socket saw the
    # backend, so its copy is dropped as a direct dial of the endpoint
    assert raw == 2 * sum(v[0] for v in expected.values())
    assert dropped > 0
