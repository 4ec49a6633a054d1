"""The datapath counts every byte exactly once, against kernel ground truth.

Real kernel, real traffic: a two-node lab in network namespaces (tests/kernel/
_dp_fixtures.py), one :class:`agent.datapath.Datapath` per node namespace, and
iptables/ip6tables byte counters as the independent ground truth. For each flow the
bytes kept by all nodes' datapaths (after the exactly-once rule,
:func:`agent.attribution.counted_here`) must equal
the ground truth per (client pod, server pod, direction), and the raw kernel counts must
be exactly twice the ground truth (every packet between two pods crosses two pod veths),
so nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterator

import pytest

from agent.datapath import Datapath, DatapathConfig
from agent.attribution import counted_here
from agent.records import FlowDelta, FlowKind
from tests.kernel._dp_fixtures import PODS, VIP, VIP_PORT, Flow, MiniLab, all_pod_ips, pod_ip

pytestmark = pytest.mark.kernel

SERVICE_PORT = 8080   # endpoint port registered in the server node's endpoint map
PLAIN_PORT = 9090     # a listening port that is no Service endpoint
PROTO = {"tcp": 6, "udp": 17}
PAIRS = {"same_node": ("a1", "a2"), "cross_node": ("a1", "b1")}



class Env:
    """A lab plus one datapath per node namespace."""

    def __init__(self, overlay: str) -> None:
        self.lab = MiniLab(overlay).up()
        self.dps: dict[str, Datapath] = {}
        try:
            for node, ns in self.lab.nodes.items():
                cfg = DatapathConfig(netns=ns, exclude_patterns=(f"{self.lab.prefix}u",),
                                     flow_capacity=4096)
                dp = Datapath(cfg)
                dp.attach()
                self.dps[node] = dp
            for node, dp in self.dps.items():
                dp.set_local_endpoints(
                    (pod_ip(pod, fam), SERVICE_PORT, proto)
                    for pod, pnode in PODS.items() if pnode == node and pod != "a1"
                    for fam in (4, 6) for proto in PROTO.values())
            for fam in (4, 6):
                for client, server in PAIRS.values():
                    self.lab.watch_pair(fam, client, server)
        except BaseException:
            self.close()
            raise

    def drain(self) -> dict[str, list[FlowDelta]]:
        return {node: dp.drain() for node, dp in self.dps.items()}

    def close(self) -> None:
        for dp in self.dps.values():
            dp.close()
        self.lab.down()


@pytest.fixture(scope="module", params=["flat", "vxlan"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    e = Env(request.param)
    yield e
    e.close()


def frontends() -> set[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, int]]:
    """Service frontends as the attribution stage would know them: ClusterIP ports and
    endpoints of pod-backed Services."""
    out = set()
    for fam in (4, 6):
        for proto in PROTO.values():
            out.add((ipaddress.ip_address(VIP[fam]), VIP_PORT, proto))
            for pod in ("a2", "b1"):
                out.add((ipaddress.ip_address(pod_ip(pod, fam)), SERVICE_PORT, proto))
    return out


def attribute(per_node: dict[str, list[FlowDelta]], flow: Flow
              ) -> tuple[dict[tuple[str, str, str], list[int]], int, int]:
    """Apply the exactly-once rule (counted_here); attribute kept bytes to (client, server, direction).

    Returns (kept {(client, server, direction): [bytes, packets]}, raw bytes of every
    delta about this flow, number of dropped client-side copies).
    """
    c = ipaddress.ip_address(pod_ip(flow.client, flow.family))
    s = ipaddress.ip_address(pod_ip(flow.server, flow.family))
    vip = ipaddress.ip_address(VIP[flow.family])
    pods = all_pod_ips()
    fronts = frontends()
    kept: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    raw = 0
    dropped = 0
    for deltas in per_node.values():
        for d in deltas:
            assert not d.overflow, d
            if d.local not in (c, s) or d.remote not in (c, s, vip):
                continue  # ND, other tests' stragglers
            raw += d.bytes
            keep = counted_here(d.kind, remote_is_pod=d.remote in pods,
                                remote_is_frontend=(d.remote, d.port, d.protocol) in fronts)
            if not keep:
                dropped += 1
                continue
            if d.kind in (FlowKind.REQUEST, FlowKind.RESPONSE):
                assert (d.local, d.remote) == (s, c), d
                key = (flow.client, flow.server, d.kind.value)
            elif d.kind is FlowKind.EGRESS:
                key = (flow.client, flow.server, "request" if d.local == c else "response")
            else:
                raise AssertionError(f"INGRESS from a pod kept: {d}")
            kept[key][0] += d.bytes
            kept[key][1] += d.packets
    return dict(kept), raw, dropped


CASES = [
    (fam, proto, placement, access)
    for fam in (4, 6)
    for proto in ("tcp", "udp")
    for placement in ("same_node", "cross_node")
    for access in ("clusterip", "podip", "nonservice")
]


@pytest.mark.parametrize("family,proto,placement,access", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_counted_once_equals_ground_truth(env: Env, family: int, proto: str, placement: str,
                                          access: str) -> None:
    client, server = PAIRS[placement]
    server_port = PLAIN_PORT if access == "nonservice" else SERVICE_PORT
    if access == "clusterip":
        env.lab.set_clusterip(family, server, SERVICE_PORT, proto)
        dst, port = VIP[family], VIP_PORT
    else:
        dst, port = pod_ip(server, family), server_port
    flow = Flow(client, server, dst, port, server_port, proto, family)
    env.drain()
    env.lab.ground_truth()  # zero the counters

    env.lab.run_flow(flow, request_bytes=3000, response_bytes=7000, count=2)

    truth = env.lab.ground_truth()
    kept, raw, dropped = attribute(env.drain(), flow)
    expected = {k: list(v) for k, v in truth.items() if k[:2] == (client, server) and v[0]}
    assert set(expected) == {(client, server, "request"), (client, server, "response")}
    assert kept == expected
    # every packet crosses the client's and the server's veth: twice the truth in raw
    # counts, half of it dropped by the once-only rule
    assert raw == 2 * sum(v[0] for v in expected.values())
    assert dropped > 0
