"""The datapath counts every byte exactly once, against kernel ground truth.

Real kernel, real traffic: a two-node lab (tools/lab, built once per overlay mode and
shared by every case, which only read counters), one :class:`agent.datapath.Datapath`
per node namespace, and the lab's nftables byte counters as the independent ground truth.
For each flow the bytes kept by all nodes' datapaths (after the exactly-once rule,
:func:`agent.attribution.counted_here`) must equal
the ground truth per (client pod, server pod, direction), and the raw kernel counts must
be exactly twice the ground truth (every packet between two pods crosses two pod veths),
so nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest

from agent.attribution import counted_here
from agent.datapath import Datapath, DatapathConfig
from agent.records import FlowDelta, FlowKind, IPAddress
from tools.lab import Lab, Topology

pytestmark = pytest.mark.kernel

SERVICE_PORT = 8080   # endpoint port registered in the server node's endpoint map
PLAIN_PORT = 9090     # a listening port that is no Service endpoint
VIP_PORT = 80         # the Service port of the ClusterIP
SERVICE = "default/svc"
PROTO = {"tcp": 6, "udp": 17}
PAIRS = {"same_node": ("a1", "a2"), "cross_node": ("a1", "b1")}
#: bytes per exchange: TCP as many segments as it takes; UDP one datagram each way
#: (the lab refuses datagrams above the path MTU, which would be fragmented)
SIZES = {"tcp": (3000, 7000), "udp": (1000, 1400)}

#: nodes a (pods a1, a2) and b (pod b1); a2 and b1 serve SERVICE_PORT (the endpoints of
#: SERVICE, TCP and UDP) and PLAIN_PORT (no Service's)
TOPOLOGY = """\
options: {mode: MODE, ipv6: true}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a, zone: zone-a, cpu: 4}
  - {name: b, zone: zone-b, cpu: 4}
pods:
  - {name: a1, namespace: default, node: a, app: client}
  - name: a2
    namespace: default
    node: a
    app: server
    ports: [{port: 8080}, {port: 8080, protocol: UDP}, {port: 9090}, {port: 9090, protocol: UDP}]
  - name: b1
    namespace: default
    node: b
    app: server
    ports: [{port: 8080}, {port: 8080, protocol: UDP}, {port: 9090}, {port: 9090, protocol: UDP}]
services:
  - name: svc
    namespace: default
    selector: {app: server}
    ports:
      - {name: tcp, port: 80, targetPort: 8080}
      - {name: udp, port: 80, targetPort: 8080, protocol: UDP}
"""


class Env:
    """A lab plus one datapath per node namespace, on the veth hook or the cgroup hook
    (one cgroup_skb pair per node on the shared cgroup root, scoped to the namespaces of the node's
    pods: lab namespaces share the host's cgroup tree, docs/datapath.md)."""

    def __init__(self, overlay: str, hook: str = "veth", socket_counters: bool = False) -> None:
        self.lab = Lab(Topology.from_yaml(TOPOLOGY.replace("MODE", overlay))).up()
        self.dps: dict[str, Datapath] = {}
        try:
            for node in ("a", "b"):
                ns, uplink = self.lab.uplink(node)
                scope = tuple(self.lab.pod_netns(pod.name)
                              for pod in self.lab.topology.pods_on(node))
                cfg = DatapathConfig(netns=ns, exclude_patterns=(uplink,), flow_capacity=4096,
                                     hook=hook, scope_netns=scope if hook == "cgroup" else (),
                                     socket_counters=socket_counters)
                dp = Datapath(cfg)
                dp.attach()
                self.dps[node] = dp
            for node, dp in self.dps.items():
                dp.set_local_endpoints(
                    (self.lab.pod_ip(pod.name, fam), SERVICE_PORT, proto)
                    for pod in self.lab.topology.pods_on(node) if pod.name != "a1"
                    for fam in (4, 6) for proto in PROTO.values())
        except BaseException:
            self.close()
            raise

    def pod_ip(self, pod: str, family: int) -> IPAddress:
        return self.lab.pod_ip(pod, family)

    def drain(self) -> dict[str, list[FlowDelta]]:
        return {node: dp.drain() for node, dp in self.dps.items()}

    def close(self) -> None:
        for dp in self.dps.values():
            dp.close()
        self.lab.down()


@pytest.fixture(scope="module", params=["flat", "vxlan", "flat-cgroup", "flat-cgroup-sk"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    # "-sk": the cgroup hook with per-socket counters (DatapathConfig.socket_counters)
    overlay, _, rest = request.param.partition("-")
    hook, _, sk = rest.partition("-")
    e = Env(overlay, hook or "veth", socket_counters=sk == "sk")
    yield e
    e.close()


def frontends(env: Env) -> set[tuple[IPAddress, int, int]]:
    """Service frontends as the attribution stage would know them: ClusterIP ports and
    endpoints of pod-backed Services."""
    out: set[tuple[IPAddress, int, int]] = set()
    for fam in (4, 6):
        for proto in PROTO.values():
            out.add((env.lab.cluster_ip(SERVICE, fam), VIP_PORT, proto))
            for pod in ("a2", "b1"):
                out.add((env.pod_ip(pod, fam), SERVICE_PORT, proto))
    return out


def attribute(env: Env, per_node: dict[str, list[FlowDelta]], client: str, server: str,
              family: int) -> tuple[dict[tuple[str, str, str], list[int]], int, int]:
    """Apply the exactly-once rule (counted_here); attribute kept bytes to (client, server, direction).

    Returns (kept {(client, server, direction): [bytes, packets]}, raw bytes of every
    delta about this flow, number of dropped client-side copies).
    """
    c = env.pod_ip(client, family)
    s = env.pod_ip(server, family)
    vip = env.lab.cluster_ip(SERVICE, family)
    pods = {env.pod_ip(p.name, f) for p in env.lab.topology.pods for f in (4, 6)}
    fronts = frontends(env)
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
                key = (client, server, d.kind.value)
            elif d.kind is FlowKind.EGRESS:
                key = (client, server, "request" if d.local == c else "response")
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
        for node in ("a", "b"):  # every node's proxy DNATs the ClusterIP to this server
            env.lab.set_service_endpoints(SERVICE, node, [server])
        dst, port = env.lab.cluster_ip(SERVICE, family), VIP_PORT
    else:
        dst, port = env.pod_ip(server, family), server_port
    env.drain()
    env.lab.reset_ground_truth()

    request_bytes, response_bytes = SIZES[proto]
    result = env.lab.run_flow(client, dst, port, proto, request_bytes=request_bytes,
                              response_bytes=response_bytes, count=2)
    assert (result.ok, result.failed) == (2, 0), result

    truth = env.lab.ground_truth_counters()
    kept, raw, dropped = attribute(env, env.drain(), client, server, family)
    expected = {k: list(v) for k, v in truth.items() if k[:2] == (client, server) and v[0]}
    assert set(expected) == {(client, server, "request"), (client, server, "response")}
    assert kept == expected
    # every packet crosses the client's and the server's veth (cgroup hook: leaves the
    # client's socket and enters the server's): twice the truth in raw counts, half of
    # it dropped by the once-only rule
    assert raw == 2 * sum(v[0] for v in expected.values())
    assert dropped > 0
