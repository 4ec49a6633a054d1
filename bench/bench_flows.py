"""The datapath at realistic flow counts, against a minimal one-hash counter (root, real kernel).

Per-packet cost (``kernel.bpf_stats_enabled`` run_time_ns / run_cnt, summed over the two hooks
a packet between two pods of one node crosses: the client's host veth, clsact ingress, and the
server's, clsact egress) of three programs put on the same hooks in turn, alternated round by
round (every configuration in every position), medians with min..max spread:

* ``empty``: returns TC_ACT_UNSPEC (the floor: the hook's dispatch);
* ``minimal``: the floor of any per-flow hash design (:data:`MINIMAL_C`): parse Ethernet,
  IPv4/IPv6 and the L4 ports, one lookup in a 5-tuple keyed ``BPF_MAP_TYPE_HASH`` of the
  same size as ours (65,536 + 8 entries), atomic adds of bytes and packets, an insert on a
  miss;
* ``minimal2``: the same minimal counter loaded twice, one table per hook, as the two
  nodes of a cross-node flow each hold their own (every cross-zone flow is cross-node):
  each hook's lookup then meets its own cold entry, as ours does, where ``minimal`` with
  one table for both hooks finds the entry the first hook just touched;
* ``zonemeter``: our clsact programs (bpf/tc.c), classification and endpoint test included.

The figures to quote are ``extra`` = program - empty, and the ratios zonemeter / minimal and
zonemeter / minimal2 of the extras (ours keeps one key per pod side: the client's veth and
the server's, so a same-node pair is two keys, as in two nodes' tables).

Traffic: 64-byte UDP frames from a C sender (``sendmmsg``, :data:`FLOWS_SENDER_C`) in
the client pod to UDP sockets bound in the server pod, one burst per measurement:

* ``udp4/N``, ``udp6/N``: N concurrent flows round-robin, each packet of another flow than
  the previous one (the worst case for every cache). N = S sockets (distinct client ports)
  x P server ports. Our flow keys name the server port, not the client's ephemeral one
  (docs/datapath.md, "Flow keys"), so S x P flows are P keys for us and S x P for the
  minimal counter: the ``keys`` column says how many each table held;
* ``udp4/N-distinct``: N server ports, one client socket: N keys for both programs;
* ``udp4/N-svc``: as ``udp4/N``, but every server port is a local Service endpoint (UDP),
  so every packet takes the Service path of classification (the endpoint-port array, the
  active-table lookup, the endpoint hash), as most of a node's pod traffic does;
* ``udp4/N-zipf``: N flows (as ``udp4/N``) drawn from a Zipf-like law (exponent 1.1, a
  fixed pseudo-random sequence): a few heavy flows and many light ones, which is what
  nodes see;
* ``tcp4``: one TCP bulk transfer (the lab's links run without offloads: one skb per wire
  packet);
* ``tcp4-gso``: the same with TSO/GSO/GRO on both veths (the kernel's ``gso_max_segs``):
  each program run sees a GSO packet of several wire packets, as on real nodes; ns per
  program run (per skb).

Port 8080 is a local Service endpoint (written to zm_endpoints), so its packets take the
Service path with the endpoint test; other ports are non-Service traffic.

Usage (as root, from the repository root; nothing else busy on the machine):
    .venv/bin/python -m bench.bench_flows [--rounds 5] [--packets 200000]
        [--flows 1 --flows 64 --flows 4096 --flows 65536] [--traffic ROW]...
        [--baseline OTHER_TREE/bpf] [--variant NAME=CFLAGS]... [--json]

Figures go to BENCHMARKS.md (*Many flows*).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from agent.datapath import ETH_P_ALL, PARENT_EGRESS, PARENT_INGRESS, Datapath, DatapathConfig, run_in_netns
from bench.bench_datapath import Bench, LoadSampler, fdinfo, pod_ip, set_stats, summary

PORT = 8080

#: the minimal per-flow counter: one 5-tuple hash, atomic adds, insert on a miss
MINIMAL_C = rb"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>
struct key { __u8 saddr[16]; __u8 daddr[16]; __be16 sport; __be16 dport; __u8 proto; __u8 pad[3]; };
struct val { __u64 bytes; __u64 packets; };
BPF_HASH(flows, struct key, struct val, 65544);
int minimal_prog(struct __sk_buff *skb) {
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct key k = {};
    __u32 l4;
    if (data + ETH_HLEN > end) return TC_ACT_UNSPEC;
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = data + ETH_HLEN;
        if ((void *)(ip + 1) > end) return TC_ACT_UNSPEC;
        __builtin_memcpy(k.saddr + 12, &ip->saddr, 4);
        __builtin_memcpy(k.daddr + 12, &ip->daddr, 4);
        k.proto = ip->protocol;
        l4 = ETH_HLEN + ip->ihl * 4;
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = data + ETH_HLEN;
        if ((void *)(ip6 + 1) > end) return TC_ACT_UNSPEC;
        __builtin_memcpy(k.saddr, &ip6->saddr, 16);
        __builtin_memcpy(k.daddr, &ip6->daddr, 16);
        k.proto = ip6->nexthdr;
        l4 = ETH_HLEN + sizeof(*ip6);
    } else {
        return TC_ACT_UNSPEC;
    }
    if (k.proto == IPPROTO_UDP || k.proto == IPPROTO_TCP) {
        __be16 *ports = data + l4;
        if (l4 > 128 || (void *)(ports + 2) > end) return TC_ACT_UNSPEC;
        k.sport = ports[0];
        k.dport = ports[1];
    }
    __u64 bytes = skb->len - ETH_HLEN;
    struct val *v = flows.lookup(&k);
    if (v) {
        __sync_fetch_and_add(&v->bytes, bytes);
        __sync_fetch_and_add(&v->packets, 1);
    } else {
        struct val init = { .bytes = bytes, .packets = 1 };
        flows.update(&k, &init);
    }
    return TC_ACT_UNSPEC;
}
"""

#: sender: 64-byte frames round-robin (or Zipf-like) over nsocks client sockets x nports
#: server ports from PORT; prints the elapsed seconds
FLOWS_SENDER_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
int main(int argc, char **argv) {
    int fam = strchr(argv[1], ':') ? AF_INET6 : AF_INET;
    int port = atoi(argv[2]); long count = atol(argv[3]); int payload = atoi(argv[4]);
    int nports = atoi(argv[5]), nsocks = atoi(argv[6]), zipf = atoi(argv[7]);
    long nflows = (long)nports * nsocks;
    struct sockaddr_storage ss; memset(&ss, 0, sizeof(ss)); socklen_t len;
    if (fam == AF_INET) { struct sockaddr_in *a = (void *)&ss; a->sin_family = fam;
        inet_pton(fam, argv[1], &a->sin_addr); len = sizeof(*a); }
    else { struct sockaddr_in6 *a = (void *)&ss; a->sin6_family = fam;
        inet_pton(fam, argv[1], &a->sin6_addr); len = sizeof(*a); }
    int *socks = calloc(nsocks, sizeof(int));
    /* fixed client ports in the ephemeral range (50000 + i), so the warm-up burst and the
     * measured one are the same flows */
    for (int i = 0; i < nsocks; i++) { socks[i] = socket(fam, SOCK_DGRAM, 0);
        struct sockaddr_storage me; memset(&me, 0, sizeof(me)); me.ss_family = fam;
        ((struct sockaddr_in *)&me)->sin_port = htons(50000 + i);
        int one = 1; setsockopt(socks[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (socks[i] < 0 || bind(socks[i], (void *)&me, len) < 0) { perror("bind"); return 1; } }
    /* the flow of each packet: round-robin, or a fixed Zipf-like sequence (inverse CDF
     * of rank^-1.1 over nflows, drawn with a 64-bit LCG) */
    enum { SEQ = 1 << 20 };
    long *seq = NULL;
    if (zipf) {
        double *cdf = malloc(nflows * sizeof(double)), total = 0;
        for (long r = 0; r < nflows; r++) { total += pow(r + 1, -1.1); cdf[r] = total; }
        seq = malloc(SEQ * sizeof(long));
        unsigned long long x = 88172645463325252ULL;
        for (long i = 0; i < SEQ; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            double u = (double)(x >> 11) / 9007199254740992.0 * total;
            long lo = 0, hi = nflows - 1;
            while (lo < hi) { long mid = (lo + hi) / 2; if (cdf[mid] < u) lo = mid + 1; else hi = mid; }
            seq[i] = (lo * 2654435761L) % nflows; /* heavy flows spread over ports and sockets */
        }
        free(cdf);
    }
    char buf[64]; memset(buf, 'x', sizeof(buf));
    enum { B = 64 }; struct mmsghdr m[B]; struct iovec io[B]; struct sockaddr_storage to[B];
    for (int i = 0; i < B; i++) { io[i].iov_base = buf; io[i].iov_len = payload;
        memset(&m[i], 0, sizeof(m[i])); m[i].msg_hdr.msg_iov = &io[i]; m[i].msg_hdr.msg_iovlen = 1;
        to[i] = ss; m[i].msg_hdr.msg_name = &to[i]; m[i].msg_hdr.msg_namelen = len; }
    long k = 0;
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long sent = 0; sent < count; ) {
        /* one socket per call: consecutive packets of a call differ in the server port */
        long f0 = zipf ? seq[k % SEQ] : k;
        int s = socks[(f0 / nports) % nsocks];
        int n = count - sent < B ? count - sent : B;
        for (int i = 0; i < n; i++) {
            long f = zipf ? seq[(k + i) % SEQ] : k + i;
            if (zipf && (f / nports) % nsocks != (f0 / nports) % nsocks) { n = i ? i : 1; break; }
            ((struct sockaddr_in *)&to[i])->sin_port = htons(port + f % nports);
        }
        n = sendmmsg(s, m, n, 0);
        if (n < 0) { perror("sendmmsg"); return 1; }
        sent += n; k += n;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.9f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
"""

CONFIGS = ("empty", "minimal", "minimal2", "zonemeter")
COUNTERS = ("minimal", "minimal2", "zonemeter")


def shape(flows: int, distinct: bool) -> tuple[int, int]:
    """(client sockets, server ports) for ``flows`` concurrent flows: up to 4,096 server
    ports (sockets in the server pod) times client sockets, or all server ports."""
    if distinct or flows <= 4096:
        return 1, flows
    if flows % 4096:
        raise SystemExit(f"bench_flows: --flows {flows}: above 4,096 use a multiple of 4,096")
    return flows // 4096, 4096


class VariantDatapath(Datapath):
    """Our programs compiled with extra ``-D`` options (an A/B variant of bpf/), or from
    another tree's bpf/ directory (``bpf_dir``: e.g. ``git archive main bpf | tar -x -C
    DIR``, then ``DIR/bpf``), loaded with their own maps and never attached by themselves.
    The other tree's maps must have this tree's layout (the drain reads them)."""

    def __init__(self, config: DatapathConfig, extra: list[str],
                 bpf_dir: Path | None = None) -> None:
        self._extra = extra
        self._bpf_dir = bpf_dir
        if bpf_dir is None:
            super().__init__(config)
            return
        from unittest import mock

        from agent.datapath import attach

        with mock.patch.object(attach, "TC_SOURCE", bpf_dir / "tc.c"), \
                mock.patch.object(attach, "CGROUP_SOURCE", bpf_dir / "cgroup.c"):
            super().__init__(config)

    def cflags(self) -> list[str]:
        flags = super().cflags()
        if self._bpf_dir is not None:
            flags = [f"-I{self._bpf_dir}" if f.startswith("-I") else f for f in flags]
        return [*flags, *self._extra]


class FlowsBench(Bench):
    """:class:`bench.bench_datapath.Bench` with the minimal counter, the flows sender and
    optional variants of our programs (``variants``: name -> extra cflags)."""

    def __init__(self, packets: int, variants: dict[str, tuple[list[str], Path | None]] | None = None
                 ) -> None:
        super().__init__(packets)
        self.variants: dict[str, VariantDatapath] = {}
        for name, (extra, bpf_dir) in (variants or {}).items():
            vdp = VariantDatapath(DatapathConfig(netns=self.lab.node_netns("a"),
                                                 attach="clsact"), extra, bpf_dir)
            vdp.set_local_endpoints([(pod_ip(self.lab, "a2", f), PORT, p)
                                     for f in (4, 6) for p in (6, 17)])
            self.variants[name] = vdp
        from bcc import BPF

        self.minimal_bpf = BPF(text=MINIMAL_C)
        self.minimal_fn = self.minimal_bpf.load_func(b"minimal_prog", BPF.SCHED_CLS)
        self.minimal2_bpf = BPF(text=MINIMAL_C)  # a second object: its own table
        self.minimal2_fn = self.minimal2_bpf.load_func(b"minimal_prog", BPF.SCHED_CLS)
        self.flows_sender = self.sender.parent / "flows_sender"
        src = self.flows_sender.with_suffix(".c")
        src.write_text(FLOWS_SENDER_C)
        subprocess.run(["gcc", "-O2", "-o", str(self.flows_sender), str(src), "-lm"], check=True)

    def use(self, config: str) -> tuple[int, int]:
        if config not in ("minimal", "minimal2") and config not in self.variants:
            return super().use(config)
        cfg = self.dp.config
        if config in self.variants:
            v = self.variants[config]._fns
            fns = (v["zm_tc_from_pod"], v["zm_tc_to_pod"])
        else:
            fns = ((self.minimal_fn, self.minimal_fn) if config == "minimal"
                   else (self.minimal_fn, self.minimal2_fn))
        for fn, (idx, parent) in zip(fns, ((self.client_if, PARENT_INGRESS),
                                           (self.server_if, PARENT_EGRESS)), strict=True):
            self.ipr.tc("replace-filter", "bpf", idx, cfg.tc_handle, fd=fn.fd,
                        name="bench", parent=parent, classid=1, direct_action=True,
                        prio=cfg.tc_priority, protocol=ETH_P_ALL)
        return fns[0].fd, fns[1].fd

    @staticmethod
    def _empty(bpf: Any) -> int:
        """Empty the minimal counter's table of ``bpf`` with batch syscalls (one key at a
        time took seconds at 65,536 keys); returns how many keys it held."""
        return sum(1 for _ in bpf["flows"].items_lookup_and_delete_batch())

    def set_service_ports(self, nports: int) -> None:
        """Make ports PORT..PORT+nports-1 of the server pod local Service endpoints (UDP and
        TCP, both families) in our datapath and every variant: 1 is the default (only
        PORT), more makes every flow of a ``-svc`` row Service traffic."""
        eps = [(pod_ip(self.lab, "a2", f), port, p) for f in (4, 6) for p in (6, 17)
               for port in range(PORT, PORT + nports) if p == 17 or port == PORT]
        for dp in (self.dp, *self.variants.values()):
            dp.set_local_endpoints(eps)

    def offloads(self, on: bool) -> None:
        """Turn TSO/GSO/GRO on (and ``gso_max_segs`` to the kernel default) or back off on
        both pods' veths, both ends: the lab keeps them off so that one skb is one wire
        packet; real nodes send TCP as GSO packets of up to 64 KiB."""
        ends = [(self.lab.pod_netns(p), "eth0") for p in ("a1", "a2")]
        ends += [self.lab.host_veth(p) for p in ("a1", "a2")]
        state = "on" if on else "off"
        for ns, dev in ends:
            subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", state,
                            "gso", state, "gro", state], check=True, capture_output=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "dev", dev, "gso_max_segs",
                            "65535" if on else "1"], check=True, capture_output=True)

    def clear_tables(self) -> None:
        """Empty the minimal counter's table and drain ours, so every measurement starts
        with the same (empty) tables and ends holding only its own flows."""
        self._empty(self.minimal_bpf)
        self._empty(self.minimal2_bpf)
        self.dp.drain()
        for v in self.variants.values():
            v.drain()

    def keys_held(self, config: str) -> int:
        if config == "minimal":
            return self._empty(self.minimal_bpf)
        if config == "minimal2":
            return self._empty(self.minimal_bpf) + self._empty(self.minimal2_bpf)
        if config == "zonemeter":
            return len(self.dp.drain())
        if config in self.variants:
            return len(self.variants[config].drain())
        return 0

    def close(self) -> None:
        for v in self.variants.values():
            v.close()
        super().close()

    def flows_burst(self, family: int, nsocks: int, nports: int, zipf: bool,
                    count: int | None = None) -> float:
        fam = socket.AF_INET if family == 4 else socket.AF_INET6
        payload = b"x" * (64 - 14 - (20 if family == 4 else 40) - 8)
        dst = pod_ip(self.lab, "a2", family)
        ready, stop = threading.Event(), threading.Event()

        def sink() -> None:
            socks = []
            for port in range(PORT, PORT + nports):
                s = socket.socket(fam, socket.SOCK_DGRAM)
                s.bind((dst, port))
                socks.append(s)
            ready.set()
            stop.wait(120)  # never read: the socket queues drop, no ICMP comes back
            for s in socks:
                s.close()

        th = threading.Thread(target=lambda: run_in_netns(self.lab.pod_netns("a2"), sink))
        th.start()
        ready.wait(60)
        try:
            out = subprocess.run(
                ["ip", "netns", "exec", self.lab.pod_netns("a1"), str(self.flows_sender), dst,
                 str(PORT), str(count or self.packets), str(len(payload)), str(nports), str(nsocks),
                 "1" if zipf else "0"], check=True, capture_output=True, text=True).stdout
            return float(out)
        finally:
            stop.set()
            th.join()

    def measure(self, config: str, traffic: str) -> tuple[float, int]:
        """(ns per packet summed over both hooks, keys the program's table holds after)."""
        fds = self.use(config)
        self.clear_tables()
        if traffic in ("tcp4", "tcp4-gso"):
            before = [fdinfo(fd) for fd in dict.fromkeys(fds)]
            self.tcp_bulk(min(self.packets, 20000) * 200)
        else:
            fam, _, rest = traffic.partition("/")
            n, _, kind = rest.partition("-")
            nsocks, nports = shape(int(n), kind == "distinct")
            kind = "" if kind == "svc" else kind
            family = 6 if fam == "udp6" else 4
            # warm-up: every flow's entry exists before the measured burst, which then sees
            # the steady state (a flow table some drains old), not first packets' inserts
            self.flows_burst(family, nsocks, nports, kind == "zipf", 2 * int(n))
            before = [fdinfo(fd) for fd in dict.fromkeys(fds)]
            self.flows_burst(family, nsocks, nports, kind == "zipf")
        after = [fdinfo(fd) for fd in dict.fromkeys(fds)]
        if len(after) == 1:  # one program on both hooks: per packet per hook, times two
            ns = 2 * (after[0][0] - before[0][0]) / (after[0][1] - before[0][1])
        else:
            ns = sum((a[0] - b[0]) / (a[1] - b[1]) for a, b in zip(after, before, strict=True))
        return ns, self.keys_held(config)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--packets", type=int, default=200000, help="UDP frames per measurement")
    ap.add_argument("--flows", type=int, action="append", default=[],
                    help="concurrent flows (default 1, 64, 4096, 65536); repeatable")
    ap.add_argument("--no-extra", action="store_true",
                    help="only udp4/N (no IPv6, distinct-key, Zipf and TCP rows)")
    ap.add_argument("--traffic", action="append", default=[], metavar="ROW",
                    help="measure only these rows (e.g. udp4/4096-svc, tcp4); repeatable")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=CFLAGS",
                    help="also measure our programs compiled with extra space-separated "
                    "cflags (e.g. 'nocache=-DZM_CACHE_SLOTS=1'), alternated with the rest; "
                    "repeatable")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also measure the programs of another tree's bpf/ directory DIR as "
                    "'baseline' (e.g. git archive main bpf | tar -x -C /tmp/base; DIR "
                    "/tmp/base/bpf)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = ap.parse_args()
    variants: dict[str, tuple[list[str], Path | None]] = {}
    for spec in args.variant:
        name, sep, flags = spec.partition("=")
        if not sep or not name or name in CONFIGS:
            raise SystemExit(f"bench_flows: --variant {spec!r}: expected NAME=CFLAGS with a new NAME")
        variants[name] = (flags.split(), None)
    if args.baseline:
        variants["baseline"] = ([], Path(args.baseline))
    configs = (*CONFIGS, *variants)
    counters = (*COUNTERS, *variants)
    if os.geteuid() != 0:
        print("bench_flows: run as root", file=sys.stderr)
        return 1
    flows = args.flows or [1, 64, 4096, 65536]
    traffics = [f"udp4/{n}" for n in flows]
    if not args.no_extra:
        traffics += [f"udp6/{n}" for n in flows]
        traffics += [f"udp4/{n}-distinct" for n in flows if 4096 < n <= 16384]
        traffics += [f"udp4/{n}-zipf" for n in flows if n >= 4096]
        traffics += [f"udp4/{n}-svc" for n in flows if n >= 64]
        traffics += ["tcp4", "tcp4-gso"]
    if args.traffic:
        traffics = args.traffic
    old_stats = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    results: dict[str, Any] = {"rounds": args.rounds, "packets": args.packets,
                               "kernel": os.uname().release, "rows": {}}
    load = LoadSampler()
    bench = FlowsBench(args.packets, variants)
    try:
        set_stats(True)
        for traffic in traffics:
            bench.offloads(traffic == "tcp4-gso")
            if traffic.endswith("-svc"):
                bench.set_service_ports(shape(int(traffic.split("/")[1].split("-")[0]), False)[1])
            else:
                bench.set_service_ports(1)
            ns: dict[str, list[float]] = {c: [] for c in configs}
            keys: dict[str, int] = {}
            for r in range(args.rounds):
                shift = r % len(configs)
                for config in configs[shift:] + configs[:shift]:
                    v, k = bench.measure(config, traffic)
                    ns[config].append(v)
                    keys[config] = k
            extra = {c: [x - e for x, e in zip(ns[c], ns["empty"], strict=True)]
                     for c in counters}
            ratio = [z / m for z, m in zip(extra["zonemeter"], extra["minimal"], strict=True)
                     if m > 0]
            ratio2 = [z / m for z, m in zip(extra["zonemeter"], extra["minimal2"], strict=True)
                      if m > 0]
            results["rows"][traffic] = {
                **{c: summary(v) for c, v in ns.items()},
                **{f"extra_{c}": summary(v) for c, v in extra.items()},
                "ratio_zonemeter_over_minimal": summary(ratio) if ratio else None,
                "ratio_zonemeter_over_minimal2": summary(ratio2) if ratio2 else None,
                "keys": {c: keys[c] for c in counters},
                "ratio_over_minimal2": {
                    c: summary([z / m for z, m in zip(extra[c], extra["minimal2"], strict=True)
                                if m > 0] or [float("nan")]) for c in variants}}
            print(f"bench_flows: {traffic} done", file=sys.stderr)
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old_stats)
        bench.close()
    results["load_average_1m"] = load.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0

    def fmt(s: dict[str, float]) -> str:
        return f"{s['median']:.1f} ({s['min']:.1f}..{s['max']:.1f})"

    la = results["load_average_1m"]
    print(f"kernel {results['kernel']}, {args.rounds} rounds alternated, {args.packets} frames "
          f"each, load average (1 min) {la['min']:.2f}..{la['max']:.2f} (median {la['median']:.2f})\n")
    def fmt_ratio(rt: dict[str, float] | None) -> str:
        return "-" if rt is None else f"{rt['median']:.2f} ({rt['min']:.2f}..{rt['max']:.2f})"

    print("| traffic | empty ns | minimal extra ns | minimal2 extra ns | zonemeter extra ns | "
          "zonemeter / minimal | zonemeter / minimal2 | keys (minimal / minimal2 / ours) |")
    print("|---|---|---|---|---|---|---|---|")
    for traffic, row in results["rows"].items():
        k = row["keys"]
        print(f"| {traffic} | {fmt(row['empty'])} | {fmt(row['extra_minimal'])} | "
              f"{fmt(row['extra_minimal2'])} | {fmt(row['extra_zonemeter'])} | "
              f"{fmt_ratio(row['ratio_zonemeter_over_minimal'])} | "
              f"{fmt_ratio(row['ratio_zonemeter_over_minimal2'])} | "
              f"{k['minimal']} / {k['minimal2']} / {k['zonemeter']} |")
    if variants:
        print("\n| traffic | " + " | ".join(f"{v} extra ns | {v} / minimal2" for v in variants)
              + " |")
        print("|---|" + "---|---|" * len(variants))
        for traffic, row in results["rows"].items():
            print(f"| {traffic} | " + " | ".join(
                f"{fmt(row[f'extra_{v}'])} | {fmt_ratio(row['ratio_over_minimal2'][v])}"
                for v in variants) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
