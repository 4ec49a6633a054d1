"""End to end on the lab (tools/lab): one Datapath per lab node, counted once == ground truth.

The lab builds three nodes in two zones as network namespaces with a kube-proxy-like
ClusterIP DNAT per node and its own ground-truth counters (no eBPF). Here every node
gets a :class:`agent.datapath.Datapath` in its namespace with that node's Service
endpoints; traffic goes through the ClusterIP (TCP and UDP, random endpoint per
connection, so same-node and cross-node), directly to pod IPs, and to a port that is no
Service's. For IPv4 and IPv6, flat and VXLAN: the bytes kept by all agents after
:func:`agent.attribution.counted_here` equal the lab's ground truth per (client pod, server
pod, direction). The same with the programs attached as TCX links (VXLAN) as with
clsact filters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest

from agent.attribution import counted_here
from agent.datapath import Datapath, DatapathConfig
from agent.records import FlowKind, IPAddress

pytestmark = pytest.mark.kernel

PROTO = {"TCP": 6, "UDP": 17}
PLAIN_PORT = 9090  # listened on by web pods, in no Service

TOPOLOGY = """\
options: {mode: MODE, ipv6: true}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: a2, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: client-a1, namespace: shop, node: a1, app: client}
  - {name: client-b1, namespace: shop, node: b1, app: client}
  - name: web-a1
    namespace: shop
    node: a1
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}, {port: 9090}]
  - name: web-a2
    namespace: shop
    node: a2
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}, {port: 9090}]
  - name: web-b1
    namespace: shop
    node: b1
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}, {port: 9090}]
services:
  - name: web
    namespace: shop
    selector: {app: web}
    ports:
      - {name: http, port: 80, targetPort: http}
      - {name: dns, port: 53, targetPort: dns, protocol: UDP}
"""


def _target_port(pod, sp) -> int:  # type: ignore[no-untyped-def]
    if isinstance(sp.target_port, int):
        return sp.target_port
    for pp in pod.ports:
        if pp.name == sp.target_port:
            return pp.port
    raise AssertionError(f"no port {sp.target_port} on {pod.name}")


class LabEnv:
    def __init__(self, mode: str, attach: str) -> None:
        from tools.lab import Lab, Topology

        self.topo = Topology.from_yaml(TOPOLOGY.replace("MODE", mode))
        self.lab = Lab(self.topo)
        self.lab.up()
        self.dps: dict[str, Datapath] = {}
        try:
            self.frontends: set[tuple[object, int, int]] = set()
            endpoints: dict[str, set[tuple[IPAddress, int, int]]] = defaultdict(set)
            for svc in self.topo.services:
                for sp in svc.ports:
                    proto = PROTO[sp.protocol]
                    for fam in (4, 6):
                        self.frontends.add((self.lab.cluster_ip(svc.key, fam), sp.port, proto))
                    for name in svc.endpoints:
                        pod = self.topo.pod(name)
                        for fam in (4, 6):
                            ep = (self.lab.pod_ip(name, fam), _target_port(pod, sp), proto)
                            self.frontends.add(ep)
                            endpoints[pod.node].add(ep)
            self.pod_by_ip = {self.lab.pod_ip(p.name, fam): p.name
                              for p in self.topo.pods if not p.host_network for fam in (4, 6)}
            for node in self.topo.nodes:
                ns, uplink = self.lab.uplink(node.name)
                dp = Datapath(DatapathConfig(netns=ns, exclude_patterns=(uplink,), attach=attach))
                assert dp.attach_mode == attach
                dp.attach()
                dp.set_local_endpoints(endpoints[node.name])
                self.dps[node.name] = dp
        except BaseException:
            self.close()
            raise

    def counted(self) -> dict[tuple[str, str, str], int]:
        """Drain every node and return kept bytes per (client pod, server pod, direction)."""
        out: dict[tuple[str, str, str], int] = defaultdict(int)
        for dp in self.dps.values():
            for d in dp.drain():
                assert not d.overflow, d
                keep = counted_here(d.kind, remote_is_pod=d.remote in self.pod_by_ip,
                                    remote_is_frontend=(d.remote, d.port, d.protocol)
                                    in self.frontends)
                if not keep:
                    continue
                local = self.pod_by_ip[d.local]
                remote = self.pod_by_ip.get(d.remote, str(d.remote))
                if d.kind in (FlowKind.REQUEST, FlowKind.RESPONSE):
                    key = (remote, local, d.kind.value)
                elif d.kind is FlowKind.EGRESS and d.port:   # to a server port: request
                    key = (local, remote, "request")
                elif d.kind is FlowKind.EGRESS:              # from a server to an ephemeral port
                    key = (remote, local, "response")
                else:
                    raise AssertionError(f"unexpected kept delta {d}")
                out[key] += d.bytes
        return dict(out)

    def close(self) -> None:
        for dp in self.dps.values():
            dp.close()
        self.lab.down()


@pytest.fixture(scope="module", params=[("flat", "clsact"), ("vxlan", "clsact"), ("vxlan", "tcx")],
                ids=lambda p: "-".join(p))
def env(request: pytest.FixtureRequest) -> Iterator[LabEnv]:
    """The lab in one routing mode, every node's datapath attached one way (TCX or clsact)."""
    e = LabEnv(*request.param)
    yield e
    e.close()


@pytest.mark.parametrize("family", [4, 6])
def test_all_agents_together_equal_lab_ground_truth(env: LabEnv, family: int) -> None:
    lab = env.lab
    for dp in env.dps.values():
        dp.drain()
    lab.reset_ground_truth()
    for client in ("client-a1", "client-b1"):
        lab.run_flow(client, lab.cluster_ip("shop/web", family), 80, "tcp", 2000, 6000, count=6)
        lab.run_flow(client, lab.cluster_ip("shop/web", family), 53, "udp", 300, 900, count=6)
        lab.run_flow(client, lab.pod_ip("web-b1", family), 8080, "tcp", 1500, 3000, count=2)
        lab.run_flow(client, lab.pod_ip("web-a2", family), PLAIN_PORT, "tcp", 1000, 4000, count=2)
        lab.run_flow(client, lab.pod_ip("web-a1", family), 5353, "udp", 200, 400, count=2)
    truth = {k: v for k, v in lab.ground_truth().items() if v}
    counted = env.counted()
    # only this family's pod IPs carry traffic in this test, but ground truth is per pod
    assert counted == truth
    assert len(truth) >= 6  # several (client, server, direction) keys really exercised
