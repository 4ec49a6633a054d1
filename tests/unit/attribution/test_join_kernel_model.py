"""The exactly-once rule against a datapath model that runs the
classification of bpf/classify.h (``zm_classify_and_count``) packet side by packet side,
instead of the connection-shaped shortcut of ``Model.send``: every veth a packet crosses
classifies it with *that node's* endpoint map and port array, from the packet's real
source and destination ports. So a pod that is client and server on one port, client
source ports outside the ephemeral range, SNAT (NodePort, masquerade) and endpoints the
kernel map lacks (not ready, no nodeName, agent behind) come out as the kernel counts them.
"""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.attribution import Attributor
from agent.records import FlowDelta, FlowKind, IPAddress, ServicePort
from tests.unit.attribution.cluster import (
    EPHEMERAL,
    PROTO,
    FakeHints,
    FakeMetadata,
    endpoint,
    objects,
    pod,
    service,
    service_ports,
    slice_,
)

T0 = 1_764_470_000.0
ip = ipaddress.ip_address
NODES = ("n1", "n2", "n3", "n4", "n5")


def cluster() -> dict[str, Any]:
    """The shared model cluster plus an Alertmanager-like StatefulSet whose pods gossip
    from UDP 9094 to UDP 9094 (memberlist), an endpoint that is not ready, and an
    endpoint without ``nodeName`` (both are never in any node's kernel endpoint map), and a
    UDP Service with a port inside the ephemeral range (RTP 40000) and one outside it
    (STUN 3478), IPv4 and IPv6."""
    o = copy.deepcopy(objects())
    o["pods"] += [
        pod("monitoring", "am-0", "n1", ["10.1.1.90"], ("StatefulSet", "am")),
        pod("monitoring", "am-1", "n3", ["10.1.3.90"], ("StatefulSet", "am")),
        pod("shop", "slow-0", "n2", ["10.1.2.70"], ("StatefulSet", "slow")),
        pod("shop", "legacy-0", "n3", ["10.1.3.71"], ("StatefulSet", "legacy")),
    ]
    o["services"] += [
        service("monitoring", "am-operated", ["None"], [("mesh-tcp", 9094, 9094, "TCP"),
                                                      ("mesh-udp", 9094, 9094, "UDP")]),
        service("shop", "slow", ["10.96.0.70"], [("http", 80, 8000, "TCP")]),
        service("shop", "legacy", ["10.96.0.71"], [("http", 80, 8001, "TCP")]),
        service("shop", "grpc", ["10.96.0.80"], [("grpc", 50051, 50051, "TCP")]),
        service("shop", "media", ["10.96.0.90", "fd00:96::90"],
                [("rtp", 40000, 40000, "UDP"), ("stun", 3478, 3478, "UDP")]),
    ]
    am = next(x for x in o["services"] if x["metadata"]["name"] == "am-operated")
    am["spec"]["clusterIPs"] = []  # headless
    o["slices"] += [
        slice_("monitoring", "am-operated", "am-x1",
               [endpoint("10.1.1.90", "n1", "eu-west-1a"), endpoint("10.1.3.90", "n3", "eu-west-1b")],
               [("mesh-tcp", 9094, "TCP"), ("mesh-udp", 9094, "UDP")]),
        slice_("shop", "slow", "slow-x1", [endpoint("10.1.2.70", "n2", "eu-west-1a", ready=False)],
               [("http", 8000, "TCP")]),
        slice_("shop", "legacy", "legacy-x1", [{"addresses": ["10.1.3.71"]}],  # no nodeName
               [("http", 8001, "TCP")]),
        # a Service port inside the ephemeral range (gRPC's default)
        slice_("shop", "grpc", "grpc-x1", [endpoint("10.1.2.60", "n2", "eu-west-1a")],
               [("grpc", 50051, "TCP")]),
        slice_("shop", "media", "media-x1", [endpoint("10.1.2.20", "n2", "eu-west-1a")],
               [("rtp", 40000, "UDP"), ("stun", 3478, "UDP")]),
        slice_("shop", "media", "media-x6", [endpoint("fd00:10:1:2::20", "n2", "eu-west-1a")],
               [("rtp", 40000, "UDP"), ("stun", 3478, "UDP")], "IPv6"),
    ]
    return o


class Meta(FakeMetadata):
    """FakeMetadata that answers port 0 on a ClusterIP like ``MetadataAdapter`` does (the
    kernel records a remote port inside the ephemeral range as 0)."""

    def service_address(self, ip: IPAddress, port: int, protocol: int) -> ServicePort | None:
        if port == 0 and protocol in (6, 132):
            sps = [sp for (a, _, pr), sp in self.service_addrs.items() if a == ip and pr == protocol]
            return min(sps, key=lambda x: (not 32768 <= x.port <= 60999, x.port)) if sps else None
        return super().service_address(ip, port, protocol)


def build(o: dict[str, Any]) -> tuple[FakeMetadata, FakeHints]:
    meta = Meta(o["nodes"], o["pods"], o["services"], o["slices"], o["cidrs"], o["replicasets"])
    return meta, FakeHints(meta, o["slices"])


@dataclass
class Conn:
    """A connection: ``client`` (pod name, ``node:NAME``, or an address) dials
    ``dst:dport`` from ``sport``; kube-proxy on the client's node DNATs it to
    ``backend:bport`` and, with ``snat``, rewrites the source to ``snat`` (address, port)
    as the server's veth sees it (NodePort / masquerade)."""

    client: str
    dst: str
    dport: int
    req: int
    resp: int
    backend: str | None = None
    bport: int | None = None
    proto: int = 6
    sport: int = 45000
    snat: tuple[str, int] | None = None


class Kernel:
    """The datapath of every node, as bpf/classify.h classifies (one packet per call).

    ``behind``: nodes whose endpoint map lacks every endpoint (the agent has not written
    it yet). ``svc_ports``: the ports marked ``ZM_PORT_SERVICE`` (the Service ports the
    agent knew when the packets passed; default: every port of the cluster's Services).
    ``node_svc``: the marks of the nodes whose agents knew other Service ports than
    ``svc_ports`` (each node's agent writes its own array, within its watch latency).
    ``node_eph``: the ephemeral range of the nodes whose agent read another
    ``net.ipv4.ip_local_port_range`` than Linux's default (``ZM_EPHEMERAL_MIN``/``MAX``
    are per node: ``DatapathConfig.ephemeral_ports``)."""

    def __init__(self, o: dict[str, Any], meta: FakeMetadata, behind: frozenset[str] = frozenset(),
                 svc_ports: frozenset[int] | None = None,
                 node_svc: dict[str, frozenset[int]] | None = None,
                 node_eph: dict[str, range] | None = None) -> None:
        self.o, self.meta, self.behind = o, meta, behind
        self.svc = service_ports(o) if svc_ports is None else svc_ports
        self.node_svc = node_svc or {}
        self.node_eph = node_eph or {}
        self.deltas: dict[str, list[FlowDelta]] = {}
        # node -> ports marked in its zm_server_ports (a local pod's SYN-ACK left from them)
        self.servers: dict[str, set[int]] = {}
        # node -> zm_origins: (local, lport, remote, rport, proto) of a UDP/SCTP 5-tuple ->
        # whether the first packet seen of it entered the local pod (the peer spoke first)
        self.origins: dict[str, dict[tuple[IPAddress, int, IPAddress, int, int], bool]] = {}
        self.veth: dict[IPAddress, str] = {}  # pod address -> node, veth pods only
        for p in o["pods"]:
            if not p["spec"]["hostNetwork"]:
                for i in p["status"]["podIPs"]:
                    self.veth[ip(i["ip"])] = p["spec"]["nodeName"]
        # what the agent writes per node (ClusterMetadata.local_endpoints): endpoints whose
        # nodeName is the node (or, without nodeName, whose address is a pod of the node),
        # ready or serving, with a veth
        self.table: dict[str, set[tuple[IPAddress, int, int]]] = {n: set() for n in NODES}
        for sl in o["slices"]:
            for ep in sl["endpoints"]:
                cond = ep.get("conditions", {})
                if cond.get("ready") is False and cond.get("serving", False) is False:
                    continue
                n = ep.get("nodeName")
                for a in ep["addresses"]:
                    na = n if n is not None else self.veth.get(ip(a))
                    if na is None or na in behind:
                        continue
                    n_ = na
                    if self.veth.get(ip(a)) == n_:
                        for slp in sl["ports"]:
                            self.table[n_].add((ip(a), slp["port"], PROTO[slp.get("protocol", "TCP")]))

    def _addr(self, who: str) -> IPAddress:
        if who.startswith("node:"):
            n = next(x for x in self.o["nodes"] if x["metadata"]["name"] == who[5:])
            return ip(n["status"]["addresses"][0]["address"])
        for p in self.o["pods"]:
            if p["metadata"]["name"] == who:
                return ip(p["status"]["podIP"])
        return ip(who)

    def packet(self, src: IPAddress, sport: int, dst: IPAddress, dport: int, proto: int, n: int,
               at: str, opens: bool = False) -> None:
        """One packet (or GSO burst of ``n`` L3 bytes) as the veth of its source (``at`` =
        "src": leaving that pod) or of its destination ("dst": entering it) sees it.
        ``opens``: a TCP request burst, whose first segment is the SYN; a TCP response
        burst starts with the SYN-ACK."""
        local, remote, lport, rport, into = ((src, dst, sport, dport, False) if at == "src"
                                             else (dst, src, dport, sport, True))
        node = self.veth.get(local)
        if node is None:
            return
        has_ports = proto in (6, 17, 132)
        table = self.table[node]
        svc = self.node_svc.get(node, self.svc)  # this node's zm_endpoint_ports
        eph = self.node_eph.get(node, EPHEMERAL)  # this node's ZM_EPHEMERAL_MIN..MAX
        d: FlowDelta | None = None
        # zm_endpoint_port; a packet leaving from an endpoint port to the same port is a
        # peer's request, not a response
        if has_ports and lport in {p for _, p, _ in table} and (into or lport != rport):
            if (local, lport, proto) in table:
                kind = FlowKind.REQUEST if into else FlowKind.RESPONSE
                d = FlowDelta(kind, local, remote, lport, proto, n, 1)
        if d is None:
            kind = FlowKind.INGRESS if into else FlowKind.EGRESS
            # zm_peer_port: an ephemeral port is kept when some Service uses it
            port = rport if has_ports and (rport not in eph or rport in svc) else 0
            # zm_local_port: a SYN entering the pod keeps its port, and its SYN-ACK then
            # leaves through this same path (the endpoint map lacks it alike), marking the
            # port in zm_server_ports for the rest of the connection and for good; a
            # Service port (ZM_PORT_SERVICE) is kept whatever the protocol
            learned = self.servers.setdefault(node, set())
            lp = 0
            # zm_origin: UDP and SCTP keep the server's port by who spoke first, the
            # local pod's when the peer did, the remote one (even ephemeral) when it did;
            # a peer talking from a port to the same port keeps it on both sides, and so
            # does an exchange between two ports of the ephemeral range that no Service
            # uses (zm_unmarked_ephemeral), or between one of them and a port outside the
            # range that no Service uses (zm_unmarked_to_fixed), without asking zm_origins
            remote_first = None
            tup = (local, lport, remote, rport, proto)
            seen = self.origins.setdefault(node, {})
            unmarked = {x for x in (lport, rport) if x in eph and x not in svc}
            fixed = {x for x in (lport, rport) if x >= 1024 and x not in eph}
            if has_ports and proto != 6:
                if rport == lport or (not port and rport and lport in unmarked) or (
                        unmarked and fixed):
                    port = rport
                    remote_first = True
                else:
                    remote_first = seen.setdefault(tup, into)
                    if not remote_first:
                        # the pod spoke first: its own port is kept outside the range
                        # (a server may speak first), or marked
                        if lport in learned or lport in svc or (
                                rport and lport not in eph):
                            lp = lport
                        port = rport
            if remote_first:
                lp = lport
            elif has_ports and lport and proto == 6:
                # zm_tcp_dialled: a TCP server port inside the range that the pod dialled
                # (its SYN left it) is kept, whatever the pod's own port, unless the pod's
                # port is a learned server port
                if proto == 6 and not port and rport and lport not in learned:
                    if opens and not into:
                        seen.setdefault(tup, False)
                        port = rport
                    elif seen.get(tup) is False:
                        port = rport
                if proto == 6 and ((opens and into) or (not opens and not into)):
                    learned.add(lport)
                if lport in learned or lport in svc:
                    lp = lport
                elif not port and rport and lport not in eph:
                    lp = lport
            d = FlowDelta(kind, local, remote, port, proto, n, 1, local_port=lp)
        self.deltas.setdefault(node, []).append(d)

    def send(self, c: Conn) -> None:
        caddr = self._addr(c.client)
        dst = ip(c.dst)
        back = ip(c.backend) if c.backend else dst
        bport = c.bport if c.bport is not None else c.dport
        seen_src, seen_sport = (ip(c.snat[0]), c.snat[1]) if c.snat else (caddr, c.sport)
        if caddr == dst:  # a pod dialling its own address stays on its loopback
            return
        # the client's veth sees the pre-DNAT destination as the request leaves and the
        # response enters; the server's veth the DNAT target and (with SNAT) the rewritten
        # source as the request enters and the response leaves (hairpin: the same veth)
        self.packet(caddr, c.sport, dst, c.dport, c.proto, c.req, "src", opens=True)
        self.packet(dst, c.dport, caddr, c.sport, c.proto, c.resp, "dst")
        self.packet(seen_src, seen_sport, back, bport, c.proto, c.req, "dst", opens=True)
        self.packet(back, bport, seen_src, seen_sport, c.proto, c.resp, "src")


def run(o: dict[str, Any], conns: list[Conn], behind: frozenset[str] = frozenset(),
        svc_ports: frozenset[int] | None = None) -> tuple[int, dict[str, Any], Kernel]:
    meta, hints = build(o)
    k = Kernel(o, meta, behind, svc_ports)
    for c in conns:
        k.send(c)
    total, out = attribute_all(meta, hints, k)
    return total, out, k


def attribute_all(meta: FakeMetadata, hints: FakeHints, k: Kernel) -> tuple[int, dict[str, Any]]:
    """Every node's agent attributes what ``k`` counted there; returns the bytes counted
    cluster-wide (Service, workload and unattributed) and each node's totals. Asserts that
    each agent counted or skipped every byte it saw."""
    total = 0
    out = {}
    for n in NODES:
        a = Attributor(n, meta, hints)
        a.attribute(k.deltas.get(n, []), T0)
        t = out[n] = a.totals()
        counted = (sum(t.service_bytes.values()) + sum(t.workload_bytes.values())
                   + sum(t.unattributed_bytes.values()))
        assert t.bytes_seen == counted + sum(t.skipped_bytes.values())
        total += counted
    return total, out


def service_bytes(totals: dict[str, Any], ns: str, svc: str) -> int:
    return sum(v for t in totals.values() for k, v in t.service_bytes.items()
               if (k.namespace, k.service) == (ns, svc))


# --------------------------------------------------------------------------- the model's own checks


def test_kernel_model_matches_the_shared_model_for_plain_connections() -> None:
    from tests.unit.attribution.cluster import Conn as C0
    from tests.unit.attribution.cluster import Model
    o = cluster()
    meta, _ = build(o)
    conns = [("web-7c9f-abcde", "10.96.0.10", 80, "10.1.3.20", 8080),
             ("web-7c9f-abcde", "10.1.2.60", 6379, None, None),
             ("db-0", "10.1.1.10", 7000, None, None)]
    for behind in (frozenset(), frozenset({"n3"})):
        m, k = Model(meta, o, kernel_behind=behind), Kernel(o, meta, behind)
        for cl, dst, dp, b, bp in conns:
            m.send(C0(cl, dst, dp, 1000, 5000, backend=b, bport=bp))
            k.send(Conn(cl, dst, dp, 1000, 5000, backend=b, bport=bp))
        for n in NODES:
            strip = [(d.kind, d.local, d.remote, d.port, d.protocol, d.bytes, d.local_port)
                     for d in m.deltas.get(n, [])]
            assert strip == [(d.kind, d.local, d.remote, d.port, d.protocol, d.bytes, d.local_port)
                             for d in k.deltas.get(n, [])]


# --------------------------------------------------------------------------- attacks


def test_gossip_between_endpoints_on_the_same_port_counted_once() -> None:
    o = cluster()
    c = Conn("am-0", "10.1.3.90", 9094, 700, 300, proto=17, sport=9094)
    total, t, _ = run(o, [c])
    assert total == c.req + c.resp


@pytest.mark.xfail(strict=True, reason="a UDP endpoint that sends from its Service port to "
                   "another Service's endpoint port is both Services' traffic (README "
                   "Limitations; docs/datapath.md, 'Two endpoints on different ports')")
@pytest.mark.parametrize("direct", [True, False], ids=["pod-address", "clusterip"])
def test_udp_from_one_services_endpoint_port_to_anothers_counted_once(direct: bool) -> None:
    """am-0 serves UDP 9094 (am-operated) and sends from that socket to another
    Service's endpoint: its node takes the datagrams for am-operated's responses (they
    leave an endpoint port), the other node for that Service's requests, and the answers
    the other way round. Known endpoints' keys do not ask who spoke first
    (bpf/classify.h), so both nodes count every byte."""
    o = cluster()
    c = (Conn("am-0", "10.1.2.20", 3478, 700, 300, proto=17, sport=9094) if direct else
         Conn("am-0", "10.96.0.53", 53, 700, 300, backend="10.1.3.30", bport=5353, proto=17,
              sport=9094))
    total, _, _ = run(o, [c])
    assert total == c.req + c.resp


# --------------------------------------------------------------------------- property: any mix

CLIENTS = ["web-7c9f-abcde", "api-5d8b-aaaaa", "api-5d8b-bbbbb", "cache-1", "web-7c9f-fghij",
           "api-5d8b-ccccc", "db-0", "am-0", "am-1", "slow-0", "legacy-0",
           "node:n1", "node:n2", "node:n3"]
TARGETS: list[tuple[str, int, int, list[tuple[str, int]] | None]] = [
    ("10.96.0.10", 80, 6, [("10.1.1.20", 8080), ("10.1.2.20", 8080), ("10.1.3.20", 8080)]),
    ("10.96.0.53", 53, 17, [("10.1.3.30", 5353)]),
    ("10.96.0.80", 50051, 6, [("10.1.2.60", 50051)]),  # Service port in the ephemeral range
    ("10.1.3.90", 9094, 17, None),                      # am-1 mesh over UDP, ephemeral client
    ("10.96.0.90", 40000, 17, [("10.1.2.20", 40000)]),  # UDP Service port in the ephemeral range
    ("10.96.0.90", 3478, 17, [("10.1.2.20", 3478)]),
    ("10.1.2.20", 40000, 17, None),                     # the same endpoints dialled directly
    ("10.1.2.20", 3478, 17, None),
    ("10.96.0.71", 80, 6, [("10.1.3.71", 8001)]),   # endpoint without nodeName
    ("10.1.2.70", 8000, 6, None),                   # not-ready endpoint, dialled directly
    ("10.1.3.71", 8001, 6, None),
    ("10.1.1.20", 8080, 6, None),
    ("10.1.3.90", 9094, 6, None),                   # am-1 mesh over TCP
    ("10.1.3.30", 5432, 6, None),                   # pod, no Service on that port
    ("192.168.0.3", 10250, 6, None),
    ("203.0.113.7", 443, 6, None),
]
ENDPOINT_PORTS = {8080, 5353, 8001, 8000, 9094, 9100, 3478, 40000}


@st.composite
def conns(draw: st.DrawFn) -> Conn:
    client = draw(st.sampled_from(CLIENTS))
    dst, port, proto, backends = draw(st.sampled_from(TARGETS))
    backend, bport = draw(st.sampled_from(backends)) if backends else (None, None)
    # a client's source port is never a port its own address serves on
    sport = draw(st.one_of(st.integers(32768, 60999).filter(lambda p: p not in ENDPOINT_PORTS),
                           st.integers(1024, 32767).filter(lambda p: p not in ENDPOINT_PORTS),
                           st.integers(61000, 65535)))
    return Conn(client, dst, port, draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)),
                backend=backend, bport=bport, proto=proto, sport=sport)


# the media Service's ports unmarked (a Service no agent had heard of yet), or all marked
UNMARKED = frozenset({3478, 40000})


@settings(max_examples=300, deadline=None)
@given(st.lists(conns(), max_size=8), st.sets(st.sampled_from(("n1", "n2", "n3"))), st.booleans())
def test_any_mix_counted_once(cs: list[Conn], behind: set[str], marked: bool) -> None:
    """Any mix of connections, any client port, with any nodes' endpoint maps behind and
    the UDP Service's ports marked or not: TCP and UDP alike, every byte once
    (docs/datapath.md, "Late endpoints")."""
    o = cluster()
    meta, _ = build(o)
    svc = service_ports(o) - (frozenset() if marked else UNMARKED)
    expected = 0
    for c in cs:
        k = Kernel(o, meta, frozenset(behind), svc)
        k.send(c)
        if k.deltas:
            expected += c.req + c.resp
    total, _, _ = run(o, cs, frozenset(behind), svc)
    assert total == expected


def test_late_endpoint_with_a_fixed_client_port_counted_once() -> None:
    """A client port outside this node's ephemeral range (another node's
    ip_local_port_range, a pod's own sysctl, masquerade with --random-fully) to an
    endpoint the kernel map lacks: the SYN keeps the endpoint port in the key beside the
    client's, so attribution promotes both directions to the Service."""
    o = cluster()
    c = Conn("web-7c9f-abcde", "10.96.0.10", 80, 1000, 5000, backend="10.1.2.20", bport=8080,
             sport=20000)
    total, t, _ = run(o, [c], frozenset({"n2"}))
    assert total == service_bytes(t, "shop", "api") == c.req + c.resp


UDP_LATE = {
    # a client port outside the ephemeral range, to an endpoint port outside it
    "v4_fixed_client_port": Conn("web-7c9f-abcde", "10.96.0.90", 3478, 120, 900,
                                 backend="10.1.2.20", bport=3478, proto=17, sport=20000),
    "v6_fixed_client_port": Conn("fd00:10:1:1::10", "fd00:96::90", 3478, 130, 700,
                                 backend="fd00:10:1:2::20", bport=3478, proto=17, sport=20000),
    # an endpoint port inside the range, from an ephemeral client port
    "v4_port_in_range": Conn("web-7c9f-abcde", "10.96.0.90", 40000, 140, 1400,
                             backend="10.1.2.20", bport=40000, proto=17, sport=45000),
    "v6_port_in_range": Conn("fd00:10:1:1::10", "fd00:96::90", 40000, 150, 1500,
                             backend="fd00:10:1:2::20", bport=40000, proto=17, sport=45000),
    # both: a port in the range, from a client port outside it (masquerade --random-fully)
    "v4_both": Conn("web-7c9f-abcde", "10.96.0.90", 40000, 160, 1600,
                    backend="10.1.2.20", bport=40000, proto=17, sport=2000),
    "v6_both": Conn("fd00:10:1:1::10", "fd00:96::90", 40000, 170, 1700,
                    backend="fd00:10:1:2::20", bport=40000, proto=17, sport=2000),
    # the endpoint dialled by its pod address (headless), port in the range
    "v4_direct_in_range": Conn("web-7c9f-abcde", "10.1.2.20", 40000, 180, 1800, proto=17,
                               sport=2001),
    "v6_direct_in_range": Conn("fd00:10:1:1::10", "fd00:10:1:2::20", 40000, 190, 1900,
                               proto=17, sport=2001),
}


@pytest.mark.parametrize("name", sorted(UDP_LATE))
@pytest.mark.parametrize("behind", [frozenset(), frozenset({"n2"})], ids=["synced", "behind"])
def test_late_udp_endpoint_counted_once_whatever_the_ports(name: str, behind: frozenset[str]) -> None:
    """UDP has no handshake: the endpoint's port is kept because some Service uses it
    (ZM_PORT_SERVICE), on the server's side whatever the client's port, and on the
    client's side inside the ephemeral range too, so the endpoint's node promotes both
    directions to the Service and the client's node skips its copy. IPv4 and IPv6."""
    o = cluster()
    c = UDP_LATE[name]
    total, t, k = run(o, [c], behind)
    assert total == service_bytes(t, "shop", "media") == c.req + c.resp
    if behind:  # the endpoint map lacked it: counted through the kept port
        server = k.deltas["n2"]
        assert {d.kind for d in server} == {FlowKind.INGRESS, FlowKind.EGRESS}
        assert {d.local_port for d in server} == {c.bport or c.dport}


@pytest.mark.parametrize("name", sorted(UDP_LATE))
@pytest.mark.parametrize("behind", [frozenset(), frozenset({"n2"}), frozenset({"n1", "n2"})],
                         ids=["synced", "server-behind", "both-behind"])
def test_late_udp_endpoint_on_a_port_no_service_had_counted_once(name: str,
                                                                 behind: frozenset[str]) -> None:
    """A UDP Service port no node's agent had written yet (a new Service, a new target
    port): the server's node keeps its port because the client spoke first, the client's
    node keeps the remote port for the same reason (zm_origins), so attribution promotes
    the server's bytes to the Service and skips the client's copy, whatever the ports."""
    o = cluster()
    c = UDP_LATE[name]
    total, t, k = run(o, [c], behind, svc_ports=service_ports(o) - {3478, 40000})
    assert total == service_bytes(t, "shop", "media") == c.req + c.resp
    if "n2" in behind:
        assert {d.local_port for d in k.deltas["n2"]} == {c.bport or c.dport}


@pytest.mark.parametrize("behind", [frozenset(), frozenset({"n1", "n3"})], ids=["synced", "behind"])
@pytest.mark.parametrize("marked", [True, False], ids=["service-port", "no-service-port"])
def test_late_udp_gossip_on_the_same_port_counted_once(behind: frozenset[str], marked: bool) -> None:
    """Two peers of UDP 9094 talking from 9094 to 9094 (memberlist), neither in its node's
    endpoint map, the port marked or not: both sides keep the port as theirs and the
    remote one whoever spoke first, so each direction is its receiver's request and its
    sender's copy, once."""
    o = cluster()
    c = Conn("am-0", "10.1.3.90", 9094, 700, 300, proto=17, sport=9094)
    svc = service_ports(o) - (set() if marked else {9094})
    total, _, k = run(o, [c], behind, svc_ports=frozenset(svc))
    assert total == c.req + c.resp
    assert {(d.port, d.local_port) for ds in k.deltas.values() for d in ds
            if d.kind in (FlowKind.INGRESS, FlowKind.EGRESS)} <= {(9094, 9094)}


def _server_first(o: dict[str, Any], behind: frozenset[str], svc: frozenset[int],
                  server_bytes: int, client_bytes: int, sport: int = 40000,
                  cport: int = 45000,
                  node_svc: dict[str, frozenset[int]] | None = None,
                  node_eph: dict[str, range] | None = None) -> tuple[int, Kernel]:
    """The media endpoint 10.1.2.20:``sport`` sends first to web's port ``cport`` (RTP
    pushed to a negotiated port), then web answers; returns what every node's agent
    counted, and the kernel model (``node_svc``, ``node_eph``: as :class:`Kernel`)."""
    meta, hints = build(o)
    k = Kernel(o, meta, behind, svc, node_svc, node_eph)
    web, srv = k._addr("web-7c9f-abcde"), ip("10.1.2.20")
    for src, sp, dst, dp, n in ((srv, sport, web, cport, server_bytes),
                                (web, cport, srv, sport, client_bytes)):
        k.packet(src, sp, dst, dp, 17, n, "src")
        k.packet(src, sp, dst, dp, 17, n, "dst")
    total, _ = attribute_all(meta, hints, k)
    return total, k


def test_udp_server_that_speaks_first_on_a_port_the_clients_node_had_not_marked() -> None:
    """The endpoint's node knows the endpoint, the client's node does not know the
    Service port yet (inside the range, as the client's port): the client's first packet
    seen is the server's, so its node would take the client for the server; both ports
    lie in the ephemeral range and neither is marked, so its keys keep both
    (zm_unmarked_ephemeral) and attribution skips them as the client's copy of the
    endpoint's Service traffic, which the endpoint's node counts."""
    o = cluster()
    total, k = _server_first(o, frozenset(), service_ports(o) - {40000}, 500, 200)
    assert total == 700
    assert {(d.kind, d.port, d.local_port) for d in k.deltas["n1"]} == {
        (FlowKind.INGRESS, 40000, 45000), (FlowKind.EGRESS, 40000, 45000)}


# the endpoint's port and the client's, inside and outside the ephemeral range
# (8000: shop/slow's TCP port, which web does not serve: a Service port all the same)
SERVER_FIRST_PORTS = {"both-in-range": (40000, 45000), "endpoint-port-outside": (3478, 45000),
                      "client-port-outside": (40000, 20000), "both-outside": (3478, 20000),
                      "client-port-a-service-port": (40000, 8000),
                      # 50051: shop/grpc's TCP port, inside the range
                      "client-port-a-service-port-in-range": (40000, 50051),
                      # 500: a system port (below 1024), no Service's
                      "client-port-a-system-port": (40000, 500)}
# (endpoint's node behind, the endpoint's port marked as a Service port)
SERVER_FIRST_LAGS = {"marked": (False, True), "marked-endpoint-behind": (True, True),
                     "unmarked": (False, False), "unmarked-endpoint-behind": (True, False)}
# the bound that remains (docs/datapath.md, "Late endpoints"): a client port below 1024
# looks like a DNS server's 53 to the client's node, and one inside the range that some
# Service uses like that Service's port: it sees the other side speak first from a port
# of the range it has not marked and drops it (zm_unmarked_to_fixed leaves system ports
# out, zm_unmarked_ephemeral marked ones)
SERVER_FIRST_BOUND = {("client-port-a-system-port", "unmarked"),
                      ("client-port-a-service-port-in-range", "unmarked")}


@pytest.mark.parametrize("ports,lag", [
    pytest.param(p, lag, id=f"{p}-{lag}", marks=[pytest.mark.xfail(
        strict=True, reason="the bound that remains (docs/datapath.md, 'Late endpoints')")]
        if (p, lag) in SERVER_FIRST_BOUND else [])
    for p in SERVER_FIRST_PORTS for lag in SERVER_FIRST_LAGS])
def test_udp_server_that_speaks_first_counted_once(ports: str, lag: str) -> None:
    """A UDP endpoint that sends first (the client's first packet is an answer), its port
    and the client's inside or outside the ephemeral range, the port marked as a Service
    port or not and the endpoint's node's map behind or not: every byte once."""
    o = cluster()
    sport, cport = SERVER_FIRST_PORTS[ports]
    behind, marked = SERVER_FIRST_LAGS[lag]
    svc = service_ports(o) - (set() if marked else {sport})
    total, _ = _server_first(o, frozenset({"n2"} if behind else ()), frozenset(svc), 500, 200,
                             sport, cport)
    assert total == 700


# (endpoint's port, client's port, ports marked on the client's node only, ports marked on
# the endpoint's node only), the endpoint's node behind: two agents a watch latency apart
SERVER_FIRST_SPLIT = {
    "endpoint-port-marked-at-the-clients-node": (40000, 20000, {40000}, set()),
    "endpoint-port-marked-at-the-endpoints-node": (40000, 20000, set(), {40000}),
    # 20000: a Service created or deleted within the watch latency uses the client's port
    "client-port-marked-at-the-clients-node": (40000, 20000, {20000}, set()),
    "client-port-marked-at-the-endpoints-node": (40000, 20000, set(), {20000}),
    # 8000: shop/slow's port on every node; the endpoint's one marked at the client's only
    "endpoint-port-marked-at-the-clients-node-client-port-a-service-port":
        (40000, 8000, {40000}, set()),
}
# zm_unmarked_to_fixed judges the client's port by its number, not by the Service ports,
# so two agents that know different Services judge the exchange alike; the endpoint's
# port marked at one node only is judged alike too (the marked side keeps it as a
# Service port, the other as an unmarked ephemeral one)
@pytest.mark.parametrize("split", list(SERVER_FIRST_SPLIT))
def test_udp_server_that_speaks_first_counted_once_while_the_nodes_mark_different_ports(
        split: str) -> None:
    """The endpoint that sends first, its node's map behind, while the client's node and
    the endpoint's have marked different Service ports (each agent writes its own
    ``zm_endpoint_ports`` within its watch latency): every byte once."""
    o = cluster()
    sport, cport, at_client, at_endpoint = SERVER_FIRST_SPLIT[split]
    base = service_ports(o) - {sport}
    node_svc = {"n1": frozenset(base | at_client), "n2": frozenset(base | at_endpoint)}
    total, _ = _server_first(o, frozenset({"n2"}), frozenset(base), 500, 200, sport, cport,
                             node_svc)
    assert total == 700


@pytest.mark.parametrize("sport", [45000, 20000], ids=["ephemeral-client", "fixed-client"])
@pytest.mark.parametrize("direct", [False, True], ids=["clusterip", "pod-address"])
@pytest.mark.parametrize("behind", [frozenset(), frozenset({"n2"}), frozenset({"n1", "n2"})],
                         ids=["synced", "server-behind", "both-behind"])
def test_tcp_port_in_the_range_no_service_had_counted_once(direct: bool, sport: int,
                                                            behind: frozenset[str]) -> None:
    """A TCP Service port inside the ephemeral range that no agent had written yet (a new
    gRPC Service on 50051): the client's node keeps the remote port because the pod's SYN
    left for it (zm_tcp_dialled), so attribution skips the client's copy of a direct dial
    too, and the server's node keeps its own port by the handshake."""
    o = cluster()
    c = (Conn("web-7c9f-abcde", "10.1.2.60", 50051, 400, 4000, sport=sport) if direct else
         Conn("web-7c9f-abcde", "10.96.0.80", 50051, 400, 4000, backend="10.1.2.60",
              bport=50051, sport=sport))
    total, t, k = run(o, [c], behind, svc_ports=service_ports(o) - {50051})
    assert total == service_bytes(t, "shop", "grpc") == c.req + c.resp
    assert {d.port for d in k.deltas["n1"]} == {50051}


def test_endpoint_without_node_name_is_in_its_pods_node_map() -> None:
    # hand-written / mirrored slices without nodeName: the agent writes the endpoint on the
    # node whose live pod holds the address, so a fixed client port is no problem there
    o = cluster()
    c = Conn("web-7c9f-abcde", "10.96.0.71", 80, 300, 900, backend="10.1.3.71", bport=8001,
             sport=20001)
    total, t, k = run(o, [c])
    assert (ip("10.1.3.71"), 8001, 6) in k.table["n3"]
    assert total == service_bytes(t, "shop", "legacy") == c.req + c.resp


LATE = {
    "ipv6_clusterip": Conn("fd00:10:1:1::10", "fd00:96::10", 80, 1100, 7700,
                           backend="fd00:10:1:2::20", bport=8080),
    "udp_clusterip": Conn("web-7c9f-abcde", "10.96.0.53", 53, 80, 400, backend="10.1.3.30",
                          bport=5353, proto=17),
    "node_client_direct": Conn("node:n1", "10.1.2.20", 8080, 90, 900),
    "host_network_client_clusterip": Conn("node:n2", "10.96.0.10", 80, 77, 880,
                                          backend="10.1.3.20", bport=8080),
    # a node's traffic to a ClusterIP, masqueraded (source port kept)
    "node_clusterip_snat": Conn("node:n1", "10.96.0.10", 80, 300, 3000,
                                backend="10.1.3.20", bport=8080, snat=("192.168.0.1", 45001)),
    "same_node_direct": Conn("web-7c9f-abcde", "10.1.1.20", 8080, 5, 6, sport=50000),
    "not_ready_endpoint_scraped": Conn("web-7c9f-abcde", "10.1.2.70", 8000, 20, 30000),
    "endpoint_without_node_name": Conn("web-7c9f-abcde", "10.96.0.71", 80, 200, 2000,
                                       backend="10.1.3.71", bport=8001),
}


@pytest.mark.parametrize("name", sorted(LATE))
@pytest.mark.parametrize("behind", [frozenset(), frozenset({"n1", "n2", "n3"})], ids=["synced", "behind"])
def test_late_endpoints_counted_once_in_their_service(name: str, behind: frozenset[str]) -> None:
    o = cluster()
    c = LATE[name]
    total, t, k = run(o, [c], behind)
    assert total == c.req + c.resp
    back = ip(c.backend or c.dst)
    meta, _ = build(o)
    eps = meta.endpoints.get((back, c.bport or c.dport, c.proto), [])
    assert eps, "scenario must target an endpoint"
    sp = min(eps, key=lambda s: (s.namespace, s.service, s.port, s.port_name))
    assert service_bytes(t, sp.namespace, sp.service) == total


def test_late_endpoint_on_an_ephemeral_range_port_counted_once() -> None:
    """An endpoint port inside the ephemeral range (gRPC's 50051) the kernel map lacks:
    the range cannot tell it from a client's port, the handshake can (a SYN entered on it,
    a SYN-ACK left from it: zm_server_ports)."""
    o = cluster()
    c = Conn("web-7c9f-abcde", "10.96.0.80", 50051, 400, 4000, backend="10.1.2.60", bport=50051)
    total, t, _ = run(o, [c])  # the kernel map holds it: exact (port 0 to a ClusterIP skipped)
    assert total == service_bytes(t, "shop", "grpc") == c.req + c.resp
    total, t, _ = run(o, [c], frozenset({"n2"}))
    assert total == service_bytes(t, "shop", "grpc") == c.req + c.resp


@settings(max_examples=100, deadline=None)
@given(st.lists(conns(), max_size=6), st.sets(st.sampled_from(("n1", "n2", "n3"))), st.booleans())
def test_shared_model_agrees_with_the_kernel_model(cs: list[Conn], behind: set[str],
                                                   marked: bool) -> None:
    """``Model.send`` of test_attribution_cluster (which the other attribution tests use)
    emits what classify.h would, for clients with ephemeral source ports, with the UDP
    Service's ports marked or not."""
    from tests.unit.attribution.cluster import Conn as C0
    from tests.unit.attribution.cluster import Model
    o = cluster()
    meta, _ = build(o)
    svc = service_ports(o) - (frozenset() if marked else UNMARKED)
    m = Model(meta, o, kernel_behind=frozenset(behind), svc_ports=svc)
    k = Kernel(o, meta, frozenset(behind), svc)
    for c in cs:
        # UDP: any client port (TCP: the Model keeps no client port outside the range)
        assume((c.sport in EPHEMERAL or c.proto != 6) and k._addr(c.client) != ip(c.dst))
        # Model has no zm_server_ports: a client port a pod already served on is not drawn
        assume(all(c.sport not in ports for ports in k.servers.values()))
        # the shared Model's table ignores readiness and nodeName: draw only endpoints
        # every node's map treats alike
        assume(ip(c.backend or c.dst) not in (ip("10.1.2.70"), ip("10.1.3.71")))
        m.send(C0(c.client, c.dst, c.dport, c.req, c.resp, backend=c.backend, bport=c.bport,
                  proto=c.proto, sport=c.sport))
        k.send(c)
    for n in NODES:
        def key(d: FlowDelta) -> tuple[Any, ...]:
            return (d.kind.value, str(d.local), str(d.remote), d.port, d.protocol, d.bytes, d.local_port)
        assert sorted(map(key, m.deltas.get(n, []))) == sorted(map(key, k.deltas.get(n, [])))
