"""Datapath lifecycle on a real kernel: coexistence with an existing TC filter, pods
created after start, overflow with a tiny table, clean exit on SIGTERM, idempotent
re-attach after a crash. The two-node lab (tests/kernel/_dp_fixtures.py) is built once
for the tests whose datapaths and agents remove what they attached (``lab``); a test
that leaves filters or pods of its own gets a fresh one (``fresh_lab``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.datapath import ETH_P_ALL, PARENT_EGRESS, PARENT_INGRESS, Datapath, DatapathConfig
from agent.records import FlowKind
from tests.kernel._dp_fixtures import Flow, PairTruth, datapath_config, exchange, pod_ip, two_node_lab
from tools.lab import Lab

pytestmark = pytest.mark.kernel
ROOT = Path(__file__).resolve().parents[2]
OUR_HANDLE = DatapathConfig().tc_handle

CNI_C = b"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
BPF_ARRAY(seen, u64, 2);   /* IPv4 UDP packets: 0 on ingress, 1 on egress */
static inline int count(struct __sk_buff *skb, int i) {
    __u8 proto = 0;
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, protocol), &proto, 1);
    u64 *v = seen.lookup(&i);
    if (v && proto == 17)
        __sync_fetch_and_add(v, 1);
    return TC_ACT_OK;
}
int cni_ingress(struct __sk_buff *skb) { return count(skb, 0); }
int cni_egress(struct __sk_buff *skb) { return count(skb, 1); }
"""


def _watched(lab: Lab) -> PairTruth:
    pairs = PairTruth(lab)
    for fam in (4, 6):
        pairs.watch(fam, "a1", "a2")
        pairs.watch(fam, "a1", "b1")
    return pairs


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """One lab for the tests whose datapaths and agents remove what they attached."""
    lab = two_node_lab()
    yield lab
    lab.down()


@pytest.fixture(scope="module")
def pairs(lab: Lab) -> PairTruth:
    """Ground truth of ``lab`` for (a1, a2) and (a1, b1)."""
    return _watched(lab)


@pytest.fixture()
def fresh_lab() -> Iterator[Lab]:
    """A lab of its own, for a test that leaves filters or pods behind."""
    lab = two_node_lab()
    yield lab
    lab.down()


@pytest.fixture()
def fresh_pairs(fresh_lab: Lab) -> PairTruth:
    """Ground truth of ``fresh_lab`` for (a1, a2) and (a1, b1)."""
    return _watched(fresh_lab)


def _config(lab: Lab, node: str, **kw: Any) -> DatapathConfig:
    """The node's config; these tests inspect tc filters, so attach defaults to clsact
    (TCX attachment: tests/kernel/test_datapath_tcx.py)."""
    kw.setdefault("attach", "clsact")
    return datapath_config(lab, node, **kw)


def _filters(netns: str) -> dict[str, list[tuple[int, int, int, str]]]:
    """{ifname: [(parent, prio, handle, name)]} of every bpf filter in netns."""
    from pyroute2 import IPRoute

    out: dict[str, list[tuple[int, int, int, str]]] = {}
    with IPRoute(netns=netns) as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            for parent in (PARENT_INGRESS, PARENT_EGRESS):
                try:
                    filters = ipr.get_filters(index=link["index"], parent=parent)
                except Exception:  # no clsact on this link
                    continue
                for f in filters:
                    opts = f.get_attr("TCA_OPTIONS")
                    if f["handle"] == 0 or opts is None:
                        continue  # the chain head entry of a priority
                    out.setdefault(name, []).append(
                        (parent, f["info"] >> 16, f["handle"], opts.get_attr("TCA_BPF_NAME")))
    return out


def _ours(netns: str) -> list[tuple[str, int]]:
    return [(ifname, parent) for ifname, fl in _filters(netns).items()
            for parent, _prio, handle, _ in fl if handle == OUR_HANDLE]


def test_existing_filter_still_sees_every_packet(fresh_lab: Lab, fresh_pairs: PairTruth) -> None:
    from bcc import BPF
    from pyroute2 import IPRoute

    cni = BPF(text=CNI_C)
    fns = {p: cni.load_func(n, BPF.SCHED_CLS)
           for p, n in ((PARENT_INGRESS, b"cni_ingress"), (PARENT_EGRESS, b"cni_egress"))}
    node_ns, host = fresh_lab.host_veth("a2")
    with IPRoute(netns=node_ns) as ipr:  # the "CNI" was there first, returning TC_ACT_OK
        idx = ipr.link_lookup(ifname=host)[0]
        ipr.tc("add", "clsact", idx)
        for parent, fn in fns.items():
            ipr.tc("add-filter", "bpf", idx, 1, fd=fn.fd, name=fn.name.decode(), parent=parent,
                   classid=1, direct_action=True, prio=1, protocol=ETH_P_ALL)
    with Datapath(_config(fresh_lab, "a")) as dp:
        assert host in dp.attach()
        fresh_pairs.read()
        flow = Flow("a1", "a2", pod_ip(fresh_lab, "a2", 4), 9090, 9090, "udp", 4)
        exchange(fresh_lab, flow, request_bytes=5000, response_bytes=3000, count=3)
        truth = fresh_pairs.read()
        deltas = dp.drain()
    req_bytes, req_pkts = truth[("a1", "a2", "request")]
    resp_bytes, resp_pkts = truth[("a1", "a2", "response")]
    # the CNI filter saw every packet in both directions (our filter returned UNSPEC)
    assert cni[b"seen"][0].value == resp_pkts    # leaving a2
    assert cni[b"seen"][1].value == req_pkts     # entering a2
    a2 = ipaddress.ip_address(pod_ip(fresh_lab, "a2", 4))
    a1 = ipaddress.ip_address(pod_ip(fresh_lab, "a1", 4))
    into = [d for d in deltas if d.local == a2 and d.remote == a1 and d.kind is FlowKind.INGRESS]
    out = [d for d in deltas if d.local == a2 and d.remote == a1 and d.kind is FlowKind.EGRESS]
    assert (sum(d.bytes for d in into), sum(d.packets for d in into)) == (req_bytes, req_pkts)
    assert (sum(d.bytes for d in out), sum(d.packets for d in out)) == (resp_bytes, resp_pkts)
    # after close the CNI's filters and its clsact qdisc are untouched
    left = _filters(node_ns)[host]
    assert sorted((p, h, n) for p, _, h, n in left) == sorted(
        [(PARENT_INGRESS, 1, "cni_ingress"), (PARENT_EGRESS, 1, "cni_egress")])


@pytest.mark.parametrize("attach", ["clsact", "tcx"])
def test_pod_created_after_start_is_counted_within_one_second(fresh_lab: Lab,
                                                               fresh_pairs: PairTruth,
                                                               attach: str) -> None:
    """Attached within a second of the pod's creation starting. The lab creates the veth
    early in add_pod and then goes on (offloads, proxy rules), so the wait runs while
    add_pod does, from the moment it is called."""
    import threading

    # the lab names a pod's host veth <prefix>p<topology index>: b2 is the 4th pod
    host = f"{fresh_lab.prefix}p{len(fresh_lab.topology.pods)}"
    added: list[BaseException] = []

    def add() -> None:
        try:
            fresh_lab.add_pod({"name": "b2", "namespace": "default", "node": "b"})
        except BaseException as err:  # noqa: BLE001 - re-raised below
            added.append(err)

    with Datapath(_config(fresh_lab, "b", attach=attach)) as dp:
        assert dp.stats().attach_mode == attach
        dp.watch()
        adder = threading.Thread(target=add)
        t0 = time.monotonic()
        adder.start()
        while host not in dp.attached() and time.monotonic() - t0 < 3:
            time.sleep(0.02)
        elapsed = time.monotonic() - t0
        adder.join(30)
        assert not added, added
        assert fresh_lab.host_veth("b2")[1] == host
        assert host in dp.attached()
        assert elapsed < 1.0, f"attached after {elapsed:.2f} s"
        fresh_pairs.watch(4, "a1", "b2")
        fresh_pairs.read()
        exchange(fresh_lab, Flow("a1", "b2", pod_ip(fresh_lab, "b2", 4), 9090, 9090, "tcp", 4),
                 4000, 9000, 2)
        truth = fresh_pairs.read()
        deltas = dp.drain()
        b2 = ipaddress.ip_address(pod_ip(fresh_lab, "b2", 4))
        # the pod goes away: its veth disappears (RTM_DELLINK) and is forgotten
        fresh_lab.remove_pod("b2")
        t0 = time.monotonic()
        while host in dp.attached() and time.monotonic() - t0 < 3:
            time.sleep(0.02)
        assert host not in dp.attached()
    got = {k: sum(d.bytes for d in deltas if d.local == b2 and d.kind is k)
           for k in (FlowKind.INGRESS, FlowKind.EGRESS)}
    assert got[FlowKind.INGRESS] == truth[("a1", "b2", "request")][0] > 0
    assert got[FlowKind.EGRESS] == truth[("a1", "b2", "response")][0] > 0


def test_tiny_table_overflow_keeps_totals_exact(lab: Lab, pairs: PairTruth) -> None:
    with Datapath(_config(lab, "a", flow_capacity=8)) as dp:
        dp.attach()
        pairs.read()
        # 24 distinct non-ephemeral ports -> far more than 8 flow keys
        for port in range(9100, 9124):
            exchange(lab, Flow("a1", "a2", pod_ip(lab, "a2", 4), port, port, "udp", 4), 300, 200, 1)
        truth = pairs.read()
        deltas = dp.drain()
        stats = dp.stats()
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    v4 = [d for d in deltas if d.local.version == 4]  # IPv6 ND/MLD noise has its own entries
    overflow = sum(d.bytes for d in v4 if d.overflow)
    keyed = sum(d.bytes for d in v4 if not d.overflow)
    assert overflow > 0 and keyed > 0
    assert stats.table.entries <= 8
    assert (stats.table.lost_bytes, stats.table.lost_packets) == (0, 0)
    # every a1<->a2 packet crosses two veths of node a; no other IPv4 traffic exists
    # (ARP is not IP)
    assert keyed + overflow == 2 * expected
    # a fresh datapath with the same tiny capacity counts exactly again
    with Datapath(_config(lab, "a", flow_capacity=8)) as dp2:
        dp2.attach()
        pairs.read()
        exchange(lab, Flow("a1", "a2", pod_ip(lab, "a2", 4), 9200, 9200, "udp", 4), 300, 200, 1)
        truth = pairs.read()
        again = dp2.drain()
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    assert sum(d.bytes for d in again if d.local.version == 4) == 2 * expected


def _agent(lab: Lab, node: str) -> subprocess.Popen[str]:
    ns, uplink = lab.uplink(node)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.datapath", "--netns", ns, "--interval", "0.5",
         "--exclude", uplink, "--attach", "clsact"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"agent did not start: {proc.stderr.read() if proc.stderr else ''}")
    pods = [p for p in ("a1", "a2", "b1") if p[0] == node]
    assert json.loads(line)["attached"] == sorted(lab.host_veth(p)[1] for p in pods)
    return proc


def test_sigterm_leaves_no_filter_of_ours(lab: Lab) -> None:
    proc = _agent(lab, "a")
    try:
        ours = _ours(lab.node_netns("a"))
        assert len(ours) == 4  # two pod veths x (ingress, egress)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _ours(lab.node_netns("a")) == []


def test_reattach_after_crash_is_idempotent(lab: Lab, pairs: PairTruth) -> None:
    proc = _agent(lab, "a")
    proc.send_signal(signal.SIGKILL)  # a crash: nothing is cleaned up
    proc.wait(10)
    assert len(_ours(lab.node_netns("a"))) == 4
    with Datapath(_config(lab, "a")) as dp:
        dp.attach()
        dp.attach()
        assert sorted(_ours(lab.node_netns("a"))) == sorted(
            (lab.host_veth(p)[1], parent) for p in ("a1", "a2")
            for parent in (PARENT_INGRESS, PARENT_EGRESS))
        pairs.read()
        exchange(lab, Flow("a1", "a2", pod_ip(lab, "a2", 6), 9090, 9090, "udp", 6), 2000, 1000, 1)
        truth = pairs.read()
        a2 = ipaddress.ip_address(pod_ip(lab, "a2", 6))
        got = sum(d.bytes for d in dp.drain() if d.local == a2 and d.kind is FlowKind.INGRESS
                  and d.remote == ipaddress.ip_address(pod_ip(lab, "a1", 6)))
        assert got == truth[("a1", "a2", "request")][0] > 0  # counted once, not twice
    assert _ours(lab.node_netns("a")) == []


@pytest.mark.parametrize("family,headers", [(4, 20 + 32), (6, 40 + 32)])
def test_gso_packets_are_counted_as_wire_segments(family: int, headers: int) -> None:
    """With TSO/GSO on, the pair counters count each GSO skb once with its skb->len; the datapath
    counts the wire segments: packets = gso_segs and the L3+L4 headers of the
    gso_segs - 1 further segments are added (IP header + TCP header with the 12-byte
    timestamp option, which Linux sends on every segment)."""
    lab = two_node_lab(offloads=True)
    try:
        pairs = PairTruth(lab)
        pairs.watch(family, "a1", "a2")
        with Datapath(_config(lab, "a")) as dp:
            dp.attach()
            pairs.read()
            exchange(lab, Flow("a1", "a2", pod_ip(lab, "a2", family), 9090, 9090, "tcp", family),
                     200_000, 300_000, 1)
            truth = pairs.read()
            deltas = dp.drain()
    finally:
        lab.down()
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, family)) for p in ("a1", "a2"))
    for direction, sender, receiver in (("request", a1, a2), ("response", a2, a1)):
        truth_bytes, truth_pkts = truth[("a1", "a2", direction)]
        # the sender's veth (EGRESS at the sender) sees each packet once
        ours = [d for d in deltas if d.kind is FlowKind.EGRESS and d.local == sender
                and d.remote == receiver]
        our_bytes, our_pkts = sum(d.bytes for d in ours), sum(d.packets for d in ours)
        assert our_pkts > truth_pkts, "no GSO packet was seen: the test proves nothing"
        assert our_bytes - truth_bytes == (our_pkts - truth_pkts) * headers


def test_draining_during_traffic_loses_nothing(lab: Lab, pairs: PairTruth) -> None:
    """Drains every few milliseconds while packets flow: the sum of all drains equals the
    ground truth, so no increment fell between a read and its delete."""
    import threading

    with Datapath(_config(lab, "a")) as dp:
        dp.attach()
        pairs.read()
        flow = Flow("a1", "a2", pod_ip(lab, "a2", 4), 9090, 9090, "udp", 4)
        errors: list[BaseException] = []

        def traffic() -> None:
            # 20 short bursts with pauses longer than a drain, so the flow spans many
            # drains however fast or loaded the machine is
            try:
                for _ in range(20):
                    exchange(lab, flow, request_bytes=20_000, response_bytes=20_000, count=2)
                    time.sleep(0.05)
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

        th = threading.Thread(target=traffic)
        th.start()
        deltas = []
        drains = 0
        while th.is_alive():
            deltas += dp.drain()
            drains += 1
            time.sleep(0.002)
        th.join()
        deltas += dp.drain()
        truth = pairs.read()
    assert not errors, errors
    assert drains > 10
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    mine = [d for d in deltas if {d.local, d.remote} == {a1, a2}]
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    assert sum(d.bytes for d in mine) == 2 * expected > 0
    assert len(mine) > 4  # the flow really was split over many drains


def test_priority_held_by_another_protocol_is_reported_per_link(fresh_lab: Lab, fresh_pairs: PairTruth) -> None:
    from bcc import BPF
    from pyroute2 import IPRoute

    from agent.errors import RuntimeFailure

    other = BPF(text=CNI_C)
    fn = other.load_func(b"cni_egress", BPF.SCHED_CLS)
    node_ns, host = fresh_lab.host_veth("a1")
    with IPRoute(netns=node_ns) as ipr:  # egress priority 1 taken by an IPv4-only filter
        idx = ipr.link_lookup(ifname=host)[0]
        ipr.tc("add", "clsact", idx)
        ipr.tc("add-filter", "bpf", idx, 1, fd=fn.fd, name="other", parent=PARENT_EGRESS,
               classid=1, direct_action=True, prio=1, protocol=0x0800)
    with Datapath(_config(fresh_lab, "a")) as dp:
        with pytest.raises(RuntimeFailure, match=host):
            dp.attach()
        assert dp.attached() == (fresh_lab.host_veth("a2")[1],)  # the other pod is still attached
        # our ingress filter went in before egress was refused: it was rolled back
        assert (host, PARENT_INGRESS) not in _ours(node_ns)
    with Datapath(_config(fresh_lab, "a", tc_priority=2)) as dp:
        assert dp.attach() == tuple(sorted(fresh_lab.host_veth(p)[1] for p in ("a1", "a2")))
    assert _ours(node_ns) == []
    assert [n for _, _, _, n in _filters(node_ns)[host]] == ["other"]


def test_endpoint_changes_take_effect_within_one_drain_interval(lab: Lab) -> None:
    """The kernel skips the endpoint hash lookup for a Service flow already in the active
    table; an endpoint added or removed between drains is still honoured at once when
    the port array changes with it (docs/datapath.md, "Hooks and classification")."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    flow = Flow("a1", "a2", pod_ip(lab, "a2", 4), 9300, 9300, "udp", 4)

    def kinds(deltas: list) -> dict[FlowKind, int]:
        out: dict[FlowKind, int] = {}
        for d in deltas:
            if d.local == a2 and d.remote == a1:
                out[d.kind] = out.get(d.kind, 0) + d.bytes
        return out

    with Datapath(_config(lab, "a")) as dp:
        dp.attach()
        dp.drain()
        exchange(lab, flow, 1000, 1000, 1)          # no endpoint yet: ingress/egress
        plain = kinds(dp.drain())
        dp.set_local_endpoints([(pod_ip(lab, "a2", 4), 9300, 17)])
        exchange(lab, flow, 1000, 1000, 1)          # endpoint: request/response
        service = kinds(dp.drain())
        exchange(lab, flow, 1000, 1000, 1)          # same interval: flow entry reused ...
        dp.set_local_endpoints([])                 # ... until the endpoint goes away
        exchange(lab, flow, 1000, 1000, 1)
        mixed = kinds(dp.drain())
    assert set(plain) == {FlowKind.INGRESS, FlowKind.EGRESS}
    assert set(service) == {FlowKind.REQUEST, FlowKind.RESPONSE}
    assert mixed[FlowKind.REQUEST] == service[FlowKind.REQUEST]
    assert mixed[FlowKind.INGRESS] == plain[FlowKind.INGRESS]


def test_server_side_pod_traffic_keeps_the_local_port(lab: Lab) -> None:
    """Pod traffic whose remote port is ephemeral keeps the local pod's (server) port
    (``local_port``), so attribution can recognise Service traffic to an endpoint the
    endpoint map does not hold yet; the client's side keeps the remote port as before."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    flow = Flow("a1", "a2", pod_ip(lab, "a2", 4), 9400, 9400, "tcp", 4)
    with Datapath(_config(lab, "a")) as dp:
        dp.attach()
        dp.drain()
        exchange(lab, flow, 3000, 5000, 2)
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2}]
    server = {d.kind: d for d in deltas if d.local == a2}
    client = {d.kind: d for d in deltas if d.local == a1}
    assert set(server) == set(client) == {FlowKind.INGRESS, FlowKind.EGRESS}
    for d in server.values():
        assert (d.port, d.local_port, d.protocol) == (0, 9400, 6), d
    for d in client.values():
        assert (d.port, d.local_port, d.protocol) == (9400, 0, 6), d
    # each side saw the same bytes (one veth each way on this node)
    assert server[FlowKind.INGRESS].bytes == client[FlowKind.EGRESS].bytes > 3000
    assert server[FlowKind.EGRESS].bytes == client[FlowKind.INGRESS].bytes > 5000


def _tcp_exchange(lab: Lab, client: str, server: str, port: int, client_port: int,
                  request: int, response: int) -> None:
    """One TCP connection client -> server:port from client_port (0: an ephemeral one),
    request bytes answered with response bytes."""
    import socket
    import threading

    from agent.datapath import run_in_netns

    sip, cip = pod_ip(lab, server, 4), pod_ip(lab, client, 4)
    ready = threading.Event()

    def serve() -> None:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((sip, port))
            s.listen(1)
            s.settimeout(5)
            ready.set()
            conn, _ = s.accept()
            with conn:
                got = 0
                while got < request:
                    got += len(conn.recv(65536))
                conn.sendall(b"r" * response)

    def dial() -> None:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((cip, client_port))
            s.settimeout(5)
            s.connect((sip, port))
            s.sendall(b"q" * request)
            got = 0
            while got < response:
                got += len(s.recv(65536))

    th = threading.Thread(target=run_in_netns, args=(lab.pod_netns(server), serve))
    th.start()
    assert ready.wait(5)
    run_in_netns(lab.pod_netns(client), dial)
    th.join(5)


def _ifindex(lab: Lab, pod: str) -> int:
    netns, veth = lab.host_veth(pod)
    out = subprocess.run(["ip", "-n", netns, "-j", "link", "show", "dev", veth],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)[0]["ifindex"])


@pytest.mark.parametrize("attach", ["clsact", "tcx"])
def test_late_endpoint_keys_keep_the_server_port_whatever_the_client_port(lab: Lab,
                                                                         attach: str) -> None:
    """No endpoint in the kernel map (a late one): the server's side keeps its port next to
    the client's for a client port outside the ephemeral range (its SYN entered on it) and
    for a server port inside the range (its SYN-ACK left from it: zm_server_ports); the
    client's side keeps only the remote port, inside the range too since its SYN left for
    it (zm_origins), so no key per connection. Every key names the host veth of its local
    pod."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    with Datapath(_config(lab, "a", attach=attach)) as dp:
        dp.attach()
        dp.drain()
        _tcp_exchange(lab, "a1", "a2", 9410, 20000, 3000, 5000)    # fixed client port
        for _ in range(8):  # ephemeral-range server port, eight client ports
            _tcp_exchange(lab, "a1", "a2", 50051, 0, 2000, 4000)
        # an ephemeral-range server port dialled from a client port outside the range
        _tcp_exchange(lab, "a1", "a2", 50052, 20001, 1000, 1500)
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2}]
    veth = {a1: _ifindex(lab, "a1"), a2: _ifindex(lab, "a2")}
    assert veth[a1] != veth[a2]
    for d in deltas:
        assert d.ifindex == veth[d.local], d
    keys = {(d.local == a2, d.kind, d.port, d.local_port) for d in deltas}
    assert keys == {
        (True, FlowKind.INGRESS, 20000, 9410), (True, FlowKind.EGRESS, 20000, 9410),
        (False, FlowKind.EGRESS, 9410, 0), (False, FlowKind.INGRESS, 9410, 0),
        (True, FlowKind.INGRESS, 0, 50051), (True, FlowKind.EGRESS, 0, 50051),
        (False, FlowKind.EGRESS, 50051, 0), (False, FlowKind.INGRESS, 50051, 0),
        (True, FlowKind.INGRESS, 20001, 50052), (True, FlowKind.EGRESS, 20001, 50052),
        (False, FlowKind.EGRESS, 50052, 0), (False, FlowKind.INGRESS, 50052, 0),
    }, keys
    server = sum(d.bytes for d in deltas if d.local == a2 and d.local_port == 50051)
    client = sum(d.bytes for d in deltas if d.local == a1 and d.port == 50051)
    # eight connections, every packet, in one key per side and direction: no key per connection
    assert len(deltas) == 12
    assert server == client > 8 * (2000 + 4000)


def _udp_exchange(lab: Lab, client: str, server: str, port: int, client_port: int,
                  request: int, response: int, family: int) -> None:
    """One UDP exchange client -> server:port from client_port (0: an ephemeral one):
    request bytes in datagrams of at most 1000, answered with response bytes alike."""
    exchange(lab, Flow(client, server, pod_ip(lab, server, family), port, port, "udp", family,
                       client_port=client_port), request, response)


@pytest.mark.parametrize("marked", [True, False], ids=["service-ports", "no-service-port"])
@pytest.mark.parametrize("family", [4, 6])
def test_late_udp_endpoint_keys_keep_the_server_port_whatever_the_client_port(
        lab: Lab, family: int, marked: bool) -> None:
    """No endpoint in the kernel map (a late one), its ports marked as Service ports
    (``set_service_ports``, ZM_PORT_SERVICE) or not marked at all (a Service the agent had
    not seen yet): UDP has no handshake, yet the side that sent the first datagram
    (``zm_origins``) tells the server's port. The server's side keeps its port next to
    the client's for a client port outside the ephemeral range, for a server port inside
    it, and for both; the client's side keeps the server's port inside the range instead
    of 0, and its own when it lies outside the range. One key per side and direction,
    not one per client port, but for the exchanges between two ephemeral-range ports of
    which neither is marked: those keep both ports, one key per client port
    (zm_unmarked_ephemeral; docs/datapath.md, "Late endpoints")."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, family)) for p in ("a1", "a2"))
    with Datapath(_config(lab, "a", attach="auto")) as dp:
        dp.attach()
        if marked:
            dp.set_service_ports({9420, 40000})
        dp.drain()
        _udp_exchange(lab, "a1", "a2", 9420, 20000, 1500, 2500, family)  # fixed client port
        for _ in range(6):  # a port inside the range, six ephemeral client ports
            _udp_exchange(lab, "a1", "a2", 40000, 0, 800, 1600, family)
        _udp_exchange(lab, "a1", "a2", 40000, 2000, 700, 900, family)    # both
        _udp_exchange(lab, "a1", "a2", 9502, 9502, 600, 300, family)     # gossip: same port
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2} and d.protocol == 17]
    keys = {(d.local == a2, d.kind, d.port, d.local_port) for d in deltas}
    # the six ephemeral client ports: kept on both sides when 40000 is no Service port
    eph = {d.port for d in deltas if d.local == a2 and d.port not in (0, 2000, 9502, 20000)}
    assert len(eph) == (0 if marked else 6) and all(32768 <= p <= 60999 for p in eph), eph
    sessions = ({(True, FlowKind.INGRESS, 0, 40000), (True, FlowKind.EGRESS, 0, 40000),
                 (False, FlowKind.EGRESS, 40000, 0), (False, FlowKind.INGRESS, 40000, 0)}
                if marked else
                {k for p in eph for k in ((True, FlowKind.INGRESS, p, 40000),
                                          (True, FlowKind.EGRESS, p, 40000),
                                          (False, FlowKind.EGRESS, 40000, p),
                                          (False, FlowKind.INGRESS, 40000, p))})
    assert keys == sessions | {
        (True, FlowKind.INGRESS, 9502, 9502), (True, FlowKind.EGRESS, 9502, 9502),
        (False, FlowKind.EGRESS, 9502, 9502), (False, FlowKind.INGRESS, 9502, 9502),
        (True, FlowKind.INGRESS, 20000, 9420), (True, FlowKind.EGRESS, 20000, 9420),
        (False, FlowKind.EGRESS, 9420, 20000), (False, FlowKind.INGRESS, 9420, 20000),
        (True, FlowKind.INGRESS, 2000, 40000), (True, FlowKind.EGRESS, 2000, 40000),
        (False, FlowKind.EGRESS, 40000, 2000), (False, FlowKind.INGRESS, 40000, 2000),
    }, keys
    assert len(deltas) == len(keys)  # one key per side and direction (and client port)
    hdr = 28 if family == 4 else 48
    server = sum(d.bytes for d in deltas if d.local == a2 and d.local_port == 40000
                 and d.port not in (2000, 9502, 20000))
    assert server == 6 * (800 + 1600 + 3 * hdr)  # one datagram each way, two back
    client = sum(d.bytes for d in deltas if d.local == a1 and d.port == 40000)
    assert client == server + 700 + 900 + 2 * hdr  # the same bytes, plus the "both" exchange


@pytest.mark.parametrize("family", [4, 6])
def test_udp_server_that_speaks_first_keeps_its_port_on_both_sides(lab: Lab, family: int) -> None:
    """A UDP endpoint that sends first (a2 pushes from 40000 to a1's negotiated port
    45000, then a1 answers: RTP), no endpoint in the kernel map and no Service port
    marked (a Service no agent had heard of yet): the first datagram each side sees is
    the server's, yet both ports lie in the ephemeral range and neither is marked, so
    both sides keep both ports (zm_unmarked_ephemeral), which lets attribution skip a1's
    bytes as the client's copy once its metadata lists a2:40000. From 40000 to a1's
    fixed port 20000, outside the range and no Service port: both kept too
    (zm_unmarked_to_fixed), or a1's answers would be its workload egress. From a port
    outside the range (3478) to 45001 or 20000: a2 spoke first, so it keeps a1's port
    and, being outside the range, its own; a1 keeps 3478 beside its own port, as before
    (docs/datapath.md, "Late endpoints")."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, family)) for p in ("a1", "a2"))
    with Datapath(_config(lab, "a", attach="auto")) as dp:
        dp.attach()
        dp.drain()
        # the endpoint a2 is _udp_exchange's "client": it sends first, a1 answers
        _udp_exchange(lab, "a2", "a1", 45000, 40000, 1200, 400, family)
        _udp_exchange(lab, "a2", "a1", 45001, 3478, 1100, 300, family)
        _udp_exchange(lab, "a2", "a1", 20000, 3478, 1000, 200, family)  # both outside
        _udp_exchange(lab, "a2", "a1", 20000, 40000, 900, 100, family)  # to a fixed port
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2} and d.protocol == 17]
    keys = {(d.local == a2, d.kind, d.port, d.local_port) for d in deltas}
    assert keys == {
        (True, FlowKind.EGRESS, 20000, 40000), (True, FlowKind.INGRESS, 20000, 40000),
        (False, FlowKind.INGRESS, 40000, 20000), (False, FlowKind.EGRESS, 40000, 20000),
        (True, FlowKind.EGRESS, 45000, 40000), (True, FlowKind.INGRESS, 45000, 40000),
        (False, FlowKind.INGRESS, 40000, 45000), (False, FlowKind.EGRESS, 40000, 45000),
        (True, FlowKind.EGRESS, 45001, 3478), (True, FlowKind.INGRESS, 45001, 3478),
        (False, FlowKind.INGRESS, 3478, 45001), (False, FlowKind.EGRESS, 3478, 45001),
        (True, FlowKind.EGRESS, 20000, 3478), (True, FlowKind.INGRESS, 20000, 3478),
        (False, FlowKind.INGRESS, 3478, 20000), (False, FlowKind.EGRESS, 3478, 20000),
    }, keys
    assert len(deltas) == len(keys)
    hdr = 28 if family == 4 else 48
    pushed = sum(d.bytes for d in deltas if d.local == a1 and d.kind is FlowKind.INGRESS)
    assert pushed == 1200 + 1100 + 1000 + 900 + 6 * hdr  # datagrams of 1000 bytes at most


@pytest.mark.parametrize("port,marked", [(9420, False), (9420, True), (514, False)],
                         ids=["fixed-port", "fixed-service-port", "system-port"])
def test_udp_clients_of_a_fixed_port_keep_their_ports_unless_it_is_a_system_port(
        lab: Lab, port: int, marked: bool) -> None:
    """Three clients on ephemeral ports ask a2 on a port outside the range. On 9420, a
    Service's port or not, both sides keep both ports, one key per client port
    (zm_unmarked_to_fixed: the packets cannot tell a server that speaks first from a
    client, and the number alone decides, so every node decides alike). On a system port
    (514, below 1024: syslog; DNS's 53 alike) one key per side and direction, as before
    (docs/datapath.md, "Late endpoints")."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    with Datapath(_config(lab, "a", attach="auto")) as dp:
        dp.attach()
        if marked:
            dp.set_service_ports({port})
        dp.drain()
        for _ in range(3):
            _udp_exchange(lab, "a1", "a2", port, 0, 500, 700, 4)
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2} and d.protocol == 17]
    keys = {(d.local == a2, d.kind, d.port, d.local_port) for d in deltas}
    eph = {d.local_port for d in deltas if d.local == a1}
    if port < 1024:
        assert eph == {0}
        assert keys == {(True, FlowKind.INGRESS, 0, port), (True, FlowKind.EGRESS, 0, port),
                        (False, FlowKind.EGRESS, port, 0), (False, FlowKind.INGRESS, port, 0)}
    else:
        assert len(eph) == 3 and all(32768 <= p <= 60999 for p in eph), eph
        assert keys == {k for p in eph for k in (
            (True, FlowKind.INGRESS, p, port), (True, FlowKind.EGRESS, p, port),
            (False, FlowKind.EGRESS, port, p), (False, FlowKind.INGRESS, port, p))}
    assert sum(d.bytes for d in deltas if d.local == a2) == 3 * (500 + 700 + 2 * 28)


def test_udp_server_that_speaks_first_judged_alike_by_nodes_that_mark_different_ports(
        lab: Lab) -> None:
    """b1 pushes from 40000, a Service port neither agent has marked yet and no endpoint
    in b's map, to a1's fixed port 20000, then a1 answers; b's agent has marked 20000 as
    some other Service's port, a's not yet (watch latency). Both judge the exchange an
    unmarked ephemeral port and a fixed one by the numbers (zm_unmarked_to_fixed) and keep
    both ports, so attribution skips a's keys as the client's copy of b1's Service and
    takes b's as that late endpoint's request and response: once
    (test_udp_server_that_speaks_first_counted_once_while_the_nodes_mark_different_ports
    in tests/unit/attribution/test_join_kernel_model.py; docs/datapath.md, "Late
    endpoints")."""
    a1, b1 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "b1"))
    with Datapath(_config(lab, "a", attach="auto")) as da, \
            Datapath(_config(lab, "b", attach="auto")) as db:
        da.attach()
        db.attach()
        db.set_service_ports({20000})
        da.drain()
        db.drain()
        # the endpoint b1 is _udp_exchange's "client": it sends first, a1 answers
        _udp_exchange(lab, "b1", "a1", 20000, 40000, 900, 100, 4)
        on_a = [d for d in da.drain() if {d.local, d.remote} == {a1, b1} and d.protocol == 17]
        on_b = [d for d in db.drain() if {d.local, d.remote} == {a1, b1} and d.protocol == 17]
    assert {(d.local, d.kind, d.port, d.local_port) for d in on_a} == {
        (a1, FlowKind.INGRESS, 40000, 20000), (a1, FlowKind.EGRESS, 40000, 20000)}
    assert {(d.local, d.kind, d.port, d.local_port) for d in on_b} == {
        (b1, FlowKind.EGRESS, 20000, 40000), (b1, FlowKind.INGRESS, 20000, 40000)}
    assert sum(d.bytes for d in on_a if d.kind is FlowKind.INGRESS) == 900 + 28
    assert sum(d.bytes for d in on_b if d.kind is FlowKind.INGRESS) == 100 + 28


def test_udp_server_that_speaks_first_to_a_learned_server_port_keeps_both_ports(lab: Lab) -> None:
    """The client's port lies in the range and some pod of the client's node accepts TCP
    connections on it (a SYN-ACK left from it: a learned server port, ``zm_server_ports``,
    the node's own array). The endpoint's node cannot see that mark and keeps both ports
    when the endpoint pushes first (a2 from 40000 to a1:45002, then a1 answers), so the
    client's side must keep both too: keeping only its own port made a1's answers, keyed
    with remote port 0, a1's workload egress, while a2's node counted them as the
    Service's request once its metadata listed a2:40000 (docs/datapath.md, "Two unmarked
    ephemeral ports: both kept")."""
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    with Datapath(_config(lab, "a", attach="auto")) as dp:
        dp.attach()
        _tcp_exchange(lab, "a2", "a1", 45002, 0, 100, 100)  # a1 serves TCP on 45002
        dp.drain()
        _udp_exchange(lab, "a2", "a1", 45002, 40000, 1200, 400, 4)
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2} and d.protocol == 17]
    keys = {(d.local == a2, d.kind, d.port, d.local_port) for d in deltas}
    assert keys == {
        (True, FlowKind.EGRESS, 45002, 40000), (True, FlowKind.INGRESS, 45002, 40000),
        (False, FlowKind.INGRESS, 40000, 45002), (False, FlowKind.EGRESS, 40000, 45002),
    }, keys


def test_endpoint_to_endpoint_on_the_same_port_is_the_receivers_request(lab: Lab) -> None:
    """Two local endpoints of UDP 9500 gossiping from 9500 to 9500 (memberlist): the
    receiver's veth counts a REQUEST, the sender's an EGRESS with the remote port, which
    attribution skips as the copy of an endpoint's traffic: once, not twice."""
    import socket

    from agent.datapath import run_in_netns

    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    got: list[int] = []

    def receive() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((str(a2), 9500))
        s.settimeout(5)
        ready.set()
        try:
            while sum(got) < 3000:
                got.append(len(s.recv(65536)))
        finally:
            s.close()

    def send() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((str(a1), 9500))
        for _ in range(3):
            s.sendto(b"g" * 1000, (str(a2), 9500))
        s.close()

    import threading
    ready = threading.Event()
    with Datapath(_config(lab, "a")) as dp:
        dp.attach()
        dp.set_local_endpoints([(a1, 9500, 17), (a2, 9500, 17)])
        dp.drain()
        th = threading.Thread(target=run_in_netns, args=(lab.pod_netns("a2"), receive))
        th.start()
        assert ready.wait(5)
        run_in_netns(lab.pod_netns("a1"), send)
        th.join(10)
        deltas = [d for d in dp.drain() if {d.local, d.remote} == {a1, a2}]
    assert sum(got) == 3000
    by = {(d.kind, d.local): d for d in deltas}
    assert set(by) == {(FlowKind.EGRESS, a1), (FlowKind.REQUEST, a2)}, deltas
    assert by[FlowKind.EGRESS, a1].port == by[FlowKind.REQUEST, a2].port == 9500
    assert by[FlowKind.EGRESS, a1].bytes == by[FlowKind.REQUEST, a2].bytes == 3 * (1000 + 28)


def _udp_spray(dst: str, ports: range, rounds: int, payload: int) -> None:
    """Send ``rounds`` datagrams of ``payload`` bytes to every port of ``dst`` (nobody
    listens: the ICMP errors are pair traffic too), port after port."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", 20999))  # below the ephemeral range: one fixed client port
        for _ in range(rounds):
            for port in ports:
                s.sendto(b"z" * payload, (dst, port))


def test_more_flows_than_cache_slots_drained_during_traffic_are_exact(lab: Lab,
                                                                       pairs: PairTruth) -> None:
    """1,500 flows round-robin per hook, several times the per-CPU cache's slots
    (bpf/zonemeter.h ZM_CACHE_SLOTS): sets fill, later flows go to the flow table, and
    drains switch caches and tables full of them while the packets flow. Every flow's
    bytes come out exactly once, and the pair's total equals the ground truth."""
    import threading

    from agent.datapath import run_in_netns

    ports, rounds, payload = range(21000, 22500), 6, 36
    dst = pod_ip(lab, "a2", 4)
    with Datapath(_config(lab, "a")) as dp:
        dp.attach()
        pairs.read()
        errors: list[BaseException] = []

        def traffic() -> None:
            try:
                for _ in range(rounds):
                    run_in_netns(lab.pod_netns("a1"), lambda: _udp_spray(dst, ports, 1, payload))
                    time.sleep(0.02)
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

        th = threading.Thread(target=traffic)
        th.start()
        deltas = []
        drains = 0
        while th.is_alive():
            deltas += dp.drain()
            drains += 1
            time.sleep(0.005)
        th.join()
        deltas += dp.drain()
        truth = pairs.read()
    assert not errors, errors
    assert drains > 3
    a1, a2 = (ipaddress.ip_address(pod_ip(lab, p, 4)) for p in ("a1", "a2"))
    mine = [d for d in deltas if {d.local, d.remote} == {a1, a2}]
    expected = truth[("a1", "a2", "request")][0] + truth[("a1", "a2", "response")][0]
    assert sum(d.bytes for d in mine) == 2 * expected > 0
    # per flow: the client's egress key of each port holds its datagrams exactly, over
    # however many drains its bytes were split
    sent: dict[int, tuple[int, int]] = {}
    for d in mine:
        if d.kind is FlowKind.EGRESS and d.local == a1 and d.protocol == 17:
            b, n = sent.get(d.port, (0, 0))
            sent[d.port] = (b + d.bytes, n + d.packets)
    assert sent == {p: (rounds * (28 + payload), rounds) for p in ports}
