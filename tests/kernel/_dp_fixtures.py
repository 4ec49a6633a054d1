"""The lab shape the datapath kernel tests share, and their probes: ground truth per pod
pair and request/response exchanges on ports of the test's choosing.

The lab is :class:`tools.lab.Lab` with :data:`TOPOLOGY`: nodes ``a`` (pods ``a1``, ``a2``)
and ``b`` (pod ``b1``), IPv4 and IPv6, flat routing, no Service and no declared port (so
no lab server holds a port a test wants). What tools/lab does not give these tests:

* :class:`PairTruth`: nftables counters in the forward hook of the server's node, one
  rule per (client pod, server pod, direction), matching the two addresses only. Every
  packet between two pods is forwarded by the server's node (same node too: veth to
  veth), so this counts every packet of the pair once, whatever its port or protocol
  (ICMP errors included), as L3 bytes (``skb->len``) and packets;
* :func:`exchange`: request/response exchanges from a client pod's namespace to a
  server socket opened for the call in the server pod's namespace, on any port; UDP
  payloads are sent in datagrams of at most 1000 bytes.

Offloads are off on every lab link (one skb is one wire packet) unless
:func:`two_node_lab` is asked to keep them (the GSO accounting test): the datapath
expands GSO packets into wire segments, the counters do not (docs/datapath.md,
docs/lab.md). Tests shell out to nft; the agent never does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from agent.datapath import DatapathConfig, run_in_netns, tcx
from tools.lab import Lab, Topology

#: two nodes in two zones; pods without ports (servers are the tests' own sockets)
TOPOLOGY = """\
options: {mode: flat, ipv6: true, offloads: OFFLOADS}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a, zone: zone-a, cpu: 4}
  - {name: b, zone: zone-b, cpu: 4}
pods:
  - {name: a1, namespace: default, node: a}
  - {name: a2, namespace: default, node: a}
  - {name: b1, namespace: default, node: b}
services: []
"""
#: the nftables table of :class:`PairTruth` in each node namespace
TRUTH_TABLE = "zmpairs"


def sh(*cmd: str, check: bool = True) -> str:
    """Run a command, return stdout; raise RuntimeError with its stderr on failure."""
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def two_node_lab(offloads: bool = False) -> Lab:
    """Return the lab of :data:`TOPOLOGY`, up; the caller calls ``down()``.

    Raises:
        RuntimeFailure: the lab cannot be built (see :meth:`tools.lab.Lab.up`).
    """
    text = TOPOLOGY.replace("OFFLOADS", "true" if offloads else "false")
    return Lab(Topology.from_yaml(text), server_max_seconds=600).up()


def pod_ip(lab: Lab, pod: str, family: int) -> str:
    """Return the address of ``pod`` (``family`` 4 or 6) as a string."""
    return str(lab.pod_ip(pod, family))


def datapath_config(lab: Lab, node: str, **kw: Any) -> DatapathConfig:
    """Return a DatapathConfig for ``node``'s namespace that leaves its uplink alone."""
    ns, uplink = lab.uplink(node)
    return DatapathConfig(netns=ns, exclude_patterns=(uplink,), **kw)


def _nft(ns: str, *args: str, input: str | None = None) -> str:
    res = subprocess.run(["ip", "netns", "exec", ns, "nft", *args], input=input,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)} in {ns}: {res.stderr.strip()}")
    return res.stdout


class PairTruth:
    """Ground truth per (client pod, server pod, direction) of a lab, see the module
    docstring. :meth:`read` returns what the counters gained since the previous read."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._namespaces: list[str] = []  # node namespaces holding the table
        self._last: dict[tuple[str, str, str], tuple[int, int]] = {}

    def watch(self, family: int, client: str, server: str) -> None:
        """Count (client, server) in ``family`` from now on, on the server's node."""
        ns = self.lab.node_netns(self.lab.topology.pod(server).node)
        if ns not in self._namespaces:
            _nft(ns, "-f", "-", input=(
                f"table inet {TRUTH_TABLE} {{\n  chain pairs {{ type filter hook forward "
                f"priority 0; policy accept; }}\n}}\n"))
            self._namespaces.append(ns)
        ip = "ip" if family == 4 else "ip6"
        c, s = pod_ip(self.lab, client, family), pod_ip(self.lab, server, family)
        for direction, src, dst in (("request", c, s), ("response", s, c)):
            _nft(ns, "add", "rule", "inet", TRUTH_TABLE, "pairs", ip, "saddr", src, ip, "daddr",
                 dst, "counter", "comment", f'"{client}:{server}:{direction}"')

    def _totals(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        out: dict[tuple[str, str, str], tuple[int, int]] = {}
        for ns in self._namespaces:
            doc = json.loads(_nft(ns, "-j", "list", "table", "inet", TRUTH_TABLE))
            for item in doc.get("nftables", []):
                rule = item.get("rule")
                if not rule or "comment" not in rule:
                    continue
                client, server, direction = rule["comment"].split(":")
                counter = next(e["counter"] for e in rule["expr"] if "counter" in e)
                b, p = out.get((client, server, direction), (0, 0))
                out[(client, server, direction)] = (b + int(counter["bytes"]),
                                                    p + int(counter["packets"]))
        return out

    def read(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Return ``{(client, server, direction): (L3 bytes, packets)}`` gained since the
        previous read (or watch), IPv4 and IPv6 summed; pairs not watched are absent."""
        now = self._totals()
        gained = {k: (b - self._last.get(k, (0, 0))[0], p - self._last.get(k, (0, 0))[1])
                  for k, (b, p) in now.items()}
        self._last = now
        return gained


@dataclass
class Flow:
    """One exchange pattern of :func:`exchange`."""

    client: str
    server: str
    dst: str          # address the client dials (a pod IP)
    port: int         # port the client dials
    server_port: int  # port the server listens on
    proto: str        # "tcp" or "udp"
    family: int
    client_port: int = 0  # the client's own port (0: an ephemeral one, a new one per exchange)


def udp_answer(s: socket.socket, request_bytes: int, response_bytes: int) -> None:
    """Read request_bytes from the UDP socket s and answer their sender with
    response_bytes, in datagrams of at most 1000 bytes.

    Raises:
        OSError: the socket failed or timed out.
    """
    got, addr = 0, None
    while got < request_bytes:
        data, addr = s.recvfrom(65536)
        got += len(data)
    left = response_bytes
    while left > 0:
        n = min(1000, left)
        s.sendto(b"r" * n, addr)
        left -= n


def udp_ask(s: socket.socket, dst: tuple[str, int], request_bytes: int,
            response_bytes: int) -> None:
    """Send request_bytes from the UDP socket s to dst in datagrams of at most 1000 bytes
    and read response_bytes back, exactly.

    Raises:
        OSError: the socket failed or timed out.
        AssertionError: more came back than response_bytes.
    """
    left = request_bytes
    while left > 0:
        n = min(1000, left)
        s.sendto(b"q" * n, dst)
        left -= n
    got = 0
    while got < response_bytes:
        got += len(s.recv(65536))
    assert got == response_bytes, (got, response_bytes)


def exchange(lab: Lab, flow: Flow, request_bytes: int, response_bytes: int,
             count: int = 1) -> None:
    """Send count exchanges client -> server (request_bytes, answered with
    response_bytes) through a server socket opened in the server pod's namespace for
    the call. UDP payloads are sent in datagrams of at most 1000 bytes.

    Raises:
        OSError, AssertionError: the exchange failed or came back short.
    """
    fam = socket.AF_INET if flow.family == 4 else socket.AF_INET6
    stype = socket.SOCK_STREAM if flow.proto == "tcp" else socket.SOCK_DGRAM
    ready = threading.Event()
    errors: list[BaseException] = []
    sip = pod_ip(lab, flow.server, flow.family)

    def serve() -> None:
        s = socket.socket(fam, stype)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sip, flow.server_port))
        s.settimeout(5)
        if stype == socket.SOCK_STREAM:
            s.listen(8)
        ready.set()
        try:
            for _ in range(count):
                if stype == socket.SOCK_STREAM:
                    conn, _ = s.accept()
                    with conn:
                        got = 0
                        while got < request_bytes:
                            chunk = conn.recv(65536)
                            if not chunk:
                                break
                            got += len(chunk)
                        conn.sendall(b"r" * response_bytes)
                        conn.shutdown(socket.SHUT_WR)
                        while conn.recv(65536):
                            pass
                else:
                    udp_answer(s, request_bytes, response_bytes)
        finally:
            s.close()

    def client() -> None:
        for _ in range(count):
            s = socket.socket(fam, stype)
            s.settimeout(5)
            try:
                if flow.client_port:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((pod_ip(lab, flow.client, flow.family), flow.client_port))
                if stype == socket.SOCK_STREAM:
                    s.connect((flow.dst, flow.port))
                    s.sendall(b"q" * request_bytes)
                    s.shutdown(socket.SHUT_WR)
                    got = 0
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        got += len(chunk)
                    assert got == response_bytes, (got, response_bytes)
                else:
                    udp_ask(s, (flow.dst, flow.port), request_bytes, response_bytes)
            finally:
                s.close()

    def server_thread() -> None:
        try:
            run_in_netns(lab.pod_netns(flow.server), serve)
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)
            ready.set()

    th = threading.Thread(target=server_thread)
    th.start()
    ready.wait(5)
    try:
        run_in_netns(lab.pod_netns(flow.client), client)
    finally:
        th.join(10)
    if errors:
        raise errors[0]
    time.sleep(0.3)  # last ACKs, TIME_WAIT ACK


def ifindex(netns: str, ifname: str) -> int:
    """Return the index of link ``ifname`` in ``netns``."""
    return run_in_netns(netns, lambda: socket.if_nametoindex(ifname))


def tcx_chain(netns: str, ifname: str, side: str) -> list[str]:
    """Return the names of the TCX programs on ``ifname`` in ``netns``, side
    ``"ingress"``/``"egress"``, in the order they run (BPF_PROG_QUERY)."""
    from agent.datapath import tcx

    attach_type = tcx.BPF_TCX_INGRESS if side == "ingress" else tcx.BPF_TCX_EGRESS
    chain = tcx.query(ifindex(netns, ifname), attach_type, netns)
    return [tcx.prog_name(pid) for pid in chain.prog_ids]


FOREIGN_C = b"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
BPF_ARRAY(seen, u64, 1);   /* IPv4 UDP packets this program saw */
int foreign(struct __sk_buff *skb) {
    __u8 proto = 0;
    int zero = 0;
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return -1; /* TCX_NEXT */
    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, protocol), &proto, 1);
    if (proto != 17)
        return -1;
    u64 *v = seen.lookup(&zero);
    if (v)
        __sync_fetch_and_add(v, 1);
#ifdef REDIRECT_IFINDEX
    return bpf_redirect(REDIRECT_IFINDEX, 0);
#else
    return VERDICT;
#endif
}
"""


class Foreign:
    """A foreign TCX program on one device and side, placed with ``flags`` (it stands for a
    CNI's: Cilium attaches with TCX): it counts the IPv4 UDP packets it sees in its own map
    and returns ``verdict`` for them (or redirects to ``redirect``), ``TCX_NEXT`` for the rest."""

    def __init__(self, netns: str, ifname: str, attach_type: int, flags: int,
                 verdict: int = 0, redirect: int | None = None) -> None:
        from bcc import BPF

        cflags = [f"-DVERDICT={verdict}"]
        if redirect is not None:
            cflags.append(f"-DREDIRECT_IFINDEX={redirect}")
        self.bpf = BPF(text=FOREIGN_C, cflags=cflags)
        fn = self.bpf.load_func(b"foreign", BPF.SCHED_CLS)
        index = ifindex(netns, ifname)
        self.fd = run_in_netns(netns, lambda: tcx.link_create(fn.fd, index, attach_type, flags))

    def seen(self) -> int:
        return int(self.bpf[b"seen"][0].value)

    def close(self) -> None:
        os.close(self.fd)  # the link's only reference: detached
        self.bpf.cleanup()
