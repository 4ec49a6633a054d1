"""Benchmark the zonemeter datapath against an empty clsact program (root, real kernel).

Three figures, each measured side by side in one run with the configurations
alternated round by round (medians, with min..max spread):

1. per-packet cost: ``kernel.bpf_stats_enabled`` run_time_ns / run_cnt of the programs on
   the client pod's veth (clsact ingress) plus the server pod's veth (clsact egress), i.e.
   both hooks a packet between two pods of one node crosses, for our programs and for an
   empty program returning TC_ACT_UNSPEC at the same place; 64-byte UDP frames (IPv4 and
   IPv6, the server is a local Service endpoint so classification does the endpoint
   lookup) and a TCP bulk transfer (offloads off: one skb per wire packet);
2. small-packet UDP rate: 64-byte frames a client (a small C program using sendmmsg,
   built with gcc at start) pushes through the two veths per second with our programs vs
   the empty one (bpf_stats off). Each round runs four bursts in the order A B B A (A, B
   = empty, ours; swapped every other round) and yields one ratio, ours / empty over the
   round's two bursts each: a load that drifts linearly during a round weighs on both
   configurations alike. The figure is the median of the rounds' ratios; for comparison
   the same bursts are also reported as adjacent pairs (A B, then B A), the method of
   earlier runs;
3. drain: 100,000 flow entries read, converted to FlowDelta records and deleted (wall
   time, and the process's CPU time, which other jobs on shared cores do not inflate) by
   one ``drain()`` call. As in the agent's tick (agent/loop.py: the deltas are a local
   of ``tick``), the previous drain's records are freed before the next drain starts;
   the time that freeing takes is reported on its own line.

With ``--hooks`` the run instead compares the two ways of attaching (docs/datapath.md,
"Hooks"): per-packet cost (bpf_stats, as in 1.) of the empty program and of ours, each
attached as clsact filters and as TCX links (``zm_tc_*`` / ``zm_tcx_*``), the four
configurations alternated round by round; and the UDP rate (as in 2., A-B-B-A rounds)
of ours as clsact filters against ours as TCX links, which also weighs what bpf_stats
does not see: the dispatch of each hook (cls_bpf under the clsact qdisc vs the TCX
program array). Only one kind of attachment is on the hooks at a time.

The 1-minute load average is sampled every 5 s during the run and reported (min..max):
the machine's other jobs share its cores.

Usage (as root, from the repository root):
    .venv/bin/python -m bench.bench_datapath [--rounds 7] [--packets 200000] [--rate-rounds N]
        [--drain-rounds N] [--flows N]... [--hooks] [--json]

It builds its own namespaces (``zm<hex>`` prefix, removed at exit) with the lab of
``tools/lab`` (docs/lab.md): one node ``a``, a client pod ``a1`` and a server pod ``a2`` on it,
flat routing, dual stack (:data:`BENCH_TOPOLOGY`); all traffic stays inside them. The lab's
ground-truth table in the server pod and its kube-proxy emulation are there for both
configurations alike.
"""

from __future__ import annotations

import argparse
import ctypes as ct
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agent.datapath import (
    ETH_P_ALL,
    PARENT_EGRESS,
    PARENT_INGRESS,
    Datapath,
    DatapathConfig,
    run_in_netns,
    tcx,
)
from agent.datapath.abi import FlowKey, FlowValue
from tools.lab import Lab, Topology

ROOT = Path(__file__).resolve().parents[1]

EMPTY_C = b"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
int empty_prog(struct __sk_buff *skb) { return TC_ACT_UNSPEC; }
"""
PORT = 8080
#: the bench's lab: one node, the client pod a1 and the server pod a2 on it (no lab server:
#: the bench's own sockets listen in a2)
BENCH_TOPOLOGY = """\
options: {mode: flat, ipv6: true}
zones:
  - {name: zone-a, region: region-1}
nodes:
  - {name: a, zone: zone-a, cpu: 4}
pods:
  - {name: a1, namespace: bench, node: a, app: client}
  - {name: a2, namespace: bench, node: a, app: server}
"""


def pod_ip(lab: Lab, pod: str, family: int) -> str:
    """The pod's address in ``family`` (4 or 6) as text."""
    return str(lab.pod_ip(pod, family))

# A C sender: Python's per-call overhead would hide a 2% effect in the packet rate.
# sendmmsg of 64-byte frames to one address; prints the elapsed seconds.
SENDER_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
int main(int argc, char **argv) {
    int fam = strchr(argv[1], ':') ? AF_INET6 : AF_INET;
    int port = atoi(argv[2]); long count = atol(argv[3]); int payload = atoi(argv[4]);
    int nports = argc > 5 ? atoi(argv[5]) : 1; /* > 1: round-robin over ports port.. */
    struct sockaddr_storage ss; memset(&ss, 0, sizeof(ss)); socklen_t len;
    if (fam == AF_INET) { struct sockaddr_in *a = (void *)&ss; a->sin_family = fam;
        a->sin_port = htons(port); inet_pton(fam, argv[1], &a->sin_addr); len = sizeof(*a); }
    else { struct sockaddr_in6 *a = (void *)&ss; a->sin6_family = fam;
        a->sin6_port = htons(port); inet_pton(fam, argv[1], &a->sin6_addr); len = sizeof(*a); }
    int s = socket(fam, SOCK_DGRAM, 0);
    if (s < 0 || (nports == 1 && connect(s, (void *)&ss, len) < 0)) { perror("socket"); return 1; }
    char buf[64]; memset(buf, 'x', sizeof(buf));
    enum { B = 64 }; struct mmsghdr m[B]; struct iovec io[B]; struct sockaddr_storage to[B];
    for (int i = 0; i < B; i++) { io[i].iov_base = buf; io[i].iov_len = payload;
        memset(&m[i], 0, sizeof(m[i])); m[i].msg_hdr.msg_iov = &io[i]; m[i].msg_hdr.msg_iovlen = 1;
        if (nports > 1) { to[i] = ss; m[i].msg_hdr.msg_name = &to[i]; m[i].msg_hdr.msg_namelen = len; } }
    long k = 0;
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long sent = 0; sent < count; ) {
        for (int i = 0; nports > 1 && i < B; i++) { /* sin_port and sin6_port share the offset */
            ((struct sockaddr_in *)&to[i])->sin_port = htons(port + (k++ % nports)); }
        int n = sendmmsg(s, m, count - sent < B ? count - sent : B, 0);
        if (n < 0) { perror("sendmmsg"); return 1; }
        sent += n;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.9f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
"""


def fdinfo(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a BPF program fd (needs kernel.bpf_stats_enabled=1)."""
    vals = {}
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        k, _, v = line.partition(":")
        vals[k.strip()] = v.strip()
    return int(vals.get("run_time_ns", 0)), int(vals.get("run_cnt", 0))


def set_stats(on: bool) -> None:
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1" if on else "0")


class Bench:
    def __init__(self, packets: int) -> None:
        self.packets = packets
        self.state = Path(tempfile.mkdtemp(prefix="zmbench-state"))
        self.lab = Lab(Topology.from_yaml(BENCH_TOPOLOGY), state_dir=self.state).up()
        node_ns = self.lab.node_netns("a")
        from bcc import BPF

        self.sender = Path(tempfile.mkdtemp(prefix="zmbench")) / "udp_sender"
        src = self.sender.with_suffix(".c")
        src.write_text(SENDER_C)
        subprocess.run(["gcc", "-O2", "-o", str(self.sender), str(src)], check=True)
        self.empty_bpf = BPF(text=EMPTY_C)
        self.empty_fn = self.empty_bpf.load_func(b"empty_prog", BPF.SCHED_CLS)
        # clsact: use() puts each configuration's programs on the hooks itself
        self.dp = Datapath(DatapathConfig(netns=node_ns, exclude_patterns=(self.lab.uplink("a")[1],),
                                          attach="clsact"))
        self.dp.attach()
        self.dp.set_local_endpoints([(pod_ip(self.lab, "a2", f), PORT, p) for f in (4, 6) for p in (6, 17)])
        from pyroute2 import IPRoute

        self.ipr = IPRoute(netns=node_ns)
        self.client_if = self.ipr.link_lookup(ifname=self.lab.host_veth("a1")[1])[0]
        self.server_if = self.ipr.link_lookup(ifname=self.lab.host_veth("a2")[1])[0]
        self.ours = (self.dp._fns["zm_tc_from_pod"], self.dp._fns["zm_tc_to_pod"])
        self.ours_tcx = (self.dp._fns["zm_tcx_from_pod"], self.dp._fns["zm_tcx_to_pod"])
        # the datapath's own filters are replaced by use(); the empty program gets a second
        # load for TCX so that its bpf_stats are its TCX runs only
        self.empty_tcx_fn = self.empty_bpf.load_func(b"empty_prog", BPF.SCHED_CLS)
        self.links: list[int] = []  # TCX link fds (client ingress, server egress) while in use

    def use(self, config: str) -> tuple[int, int]:
        """Put config's programs on the client's ingress and the server's egress hook;
        returns their fds (ingress, egress). Configs: ``empty``, ``zonemeter`` (clsact
        filters), ``empty_tcx``, ``zonemeter_tcx`` (TCX links, no filter of ours)."""
        cfg = self.dp.config
        hooks = ((self.client_if, PARENT_INGRESS, tcx.BPF_TCX_INGRESS),
                 (self.server_if, PARENT_EGRESS, tcx.BPF_TCX_EGRESS))
        if config.endswith("_tcx"):
            fns = ((self.empty_tcx_fn, self.empty_tcx_fn) if config == "empty_tcx"
                   else self.ours_tcx)
            for idx, parent, _ in hooks:  # only the TCX program on the hook
                try:
                    self.ipr.tc("del-filter", "bpf", idx, cfg.tc_handle, parent=parent,
                                prio=cfg.tc_priority, protocol=ETH_P_ALL)
                except Exception:  # noqa: BLE001 - not there
                    pass
            if self.links:
                for fd, fn in zip(self.links, fns, strict=True):
                    tcx.link_update(fd, fn.fd)
            else:
                ns = self.lab.node_netns("a")
                for (idx, _, typ), fn in zip(hooks, fns, strict=True):
                    def create(i: int = idx, t: int = typ, f: int = fn.fd) -> int:
                        return tcx.link_create(f, i, t)

                    self.links.append(run_in_netns(ns, create))
            return fns[0].fd, fns[1].fd
        for fd in self.links:  # only the clsact filter on the hook
            tcx.link_detach(fd)
            os.close(fd)
        self.links = []
        fin, feg = (self.empty_fn, self.empty_fn) if config == "empty" else self.ours
        for (idx, parent, _), fn in zip(hooks, (fin, feg), strict=True):
            self.ipr.tc("replace-filter", "bpf", idx, cfg.tc_handle, fd=fn.fd, name="bench",
                        parent=parent, classid=1, direct_action=True, prio=cfg.tc_priority,
                        protocol=ETH_P_ALL)
        return fin.fd, feg.fd

    def udp_burst(self, family: int, count: int, nports: int = 1) -> float:
        """Send count 64-byte frames client -> server (round-robin over nports server
        ports from PORT: one flow per port at the client's hook); return elapsed seconds."""
        fam = socket.AF_INET if family == 4 else socket.AF_INET6
        payload = b"x" * (64 - 14 - (20 if family == 4 else 40) - 8)
        dst = (pod_ip(self.lab, "a2", family), PORT)
        ready = threading.Event()
        stop = threading.Event()

        def sink() -> None:
            socks = []
            for port in range(PORT, PORT + nports):
                s = socket.socket(fam, socket.SOCK_DGRAM)
                s.bind((dst[0], port))
                socks.append(s)
            ready.set()
            stop.wait(60)  # never read: the socket queues drop, no ICMP comes back
            for s in socks:
                s.close()

        th = threading.Thread(target=lambda: run_in_netns(self.lab.pod_netns("a2"), sink))
        th.start()
        ready.wait(30)

        try:
            out = subprocess.run(
                ["ip", "netns", "exec", self.lab.pod_netns("a1"), str(self.sender), dst[0],
                 str(PORT), str(count), str(len(payload)), str(nports)],
                check=True, capture_output=True, text=True).stdout
            return float(out)
        finally:
            stop.set()
            th.join()

    def tcp_bulk(self, nbytes: int) -> None:
        """One TCP connection client -> server carrying ``nbytes`` (sendall, one byte back)."""
        dst = (pod_ip(self.lab, "a2", 4), PORT)
        ready = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(dst)
                s.settimeout(30)
                s.listen(1)
                ready.set()
                conn, _ = s.accept()
                with conn:
                    got = 0
                    while got < nbytes:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        got += len(chunk)
                    conn.sendall(b"r")
                    conn.shutdown(socket.SHUT_WR)
                    while conn.recv(65536):
                        pass

        def client() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(dst)
                s.sendall(b"q" * nbytes)
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass

        def server_thread() -> None:
            try:
                run_in_netns(self.lab.pod_netns("a2"), serve)
            except BaseException as err:  # noqa: BLE001 - re-raised below, in the caller
                errors.append(err)
                ready.set()

        th = threading.Thread(target=server_thread)
        th.start()
        ready.wait(30)
        try:
            run_in_netns(self.lab.pod_netns("a1"), client)
        finally:
            th.join(30)
        if errors:
            raise errors[0]
        time.sleep(0.3)  # last ACKs

    def per_packet_ns(self, config: str, traffic: str) -> float:
        fds = self.use(config)
        before = [fdinfo(fd) for fd in fds]
        if traffic.startswith("udp4x"):  # udp4xN: N flows round-robin
            self.udp_burst(4, self.packets, int(traffic[5:]))
        elif traffic == "udp4":
            self.udp_burst(4, self.packets)
        elif traffic == "udp6":
            self.udp_burst(6, self.packets)
        else:
            self.tcp_bulk(min(self.packets, 20000) * 200)
        after = [fdinfo(fd) for fd in fds]
        if fds[0] == fds[1]:  # the empty program on both hooks: one fd, summed stats
            rt, cnt = after[0][0] - before[0][0], after[0][1] - before[0][1]
            return 2 * rt / cnt
        return sum((a[0] - b[0]) / (a[1] - b[1]) for a, b in zip(after, before, strict=True))

    def close(self) -> None:
        for fd in self.links:
            os.close(fd)
        shutil.rmtree(self.sender.parent, ignore_errors=True)
        self.ipr.close()
        self.dp.close()
        self.lab.down()
        shutil.rmtree(self.state, ignore_errors=True)


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


class LoadSampler:
    """Samples the 1-minute load average every `every` seconds in a daemon thread."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return summary(self.samples)


def bench_drain(rounds: int, n: int = 100_000) -> dict[str, dict[str, float]]:
    """Drain n entries written into the active table from userspace (bpf_update_batch)."""
    from bcc.libbcc import lib

    dp = Datapath(DatapathConfig(flow_capacity=n))
    out = {}
    # where a drain's wall time goes: the steps of FlowTables.drain, timed per call
    phases: dict[str, list[float]] = {}
    tables: Any = dp.tables
    for step in ("_switch_both", "_read_cache", "_take_batch", "_convert", "_clear_side"):
        def timed(*a: Any, _f: Any = getattr(tables, step), _s: str = step) -> Any:  # noqa: B008 - binds this step's method
            t0 = time.perf_counter()
            try:
                return _f(*a)
            finally:
                phases.setdefault(_s, []).append(time.perf_counter() - t0)
        setattr(tables, step, timed)
    try:
        for layout, (n_local, n_remote) in (("distinct", (n, n)), ("pods", (1000, 10_000))):
            phases.clear()
            keys = (FlowKey * n)()
            vals = (FlowValue * n)()
            for i in range(n):
                k = keys[i]
                k.family, k.kind, k.proto = 4, i % 4, 6
                # unique keys: i mod lcm(n_local, n_remote) fixes the addresses; i // q
                # (q at most that period, n / q below 60,000) tells apart entries sharing them
                q = max(n_local * n_remote // n, -(-n // 60000), 1)
                k.port = socket.htons(1 + i // q % 60000)
                loc, rem = i % n_local, (i * 7919) % n_remote
                for addr, v, net in ((k.local, loc, 10), (k.remote, rem, 11)):
                    addr[10] = addr[11] = 0xFF
                    addr[12], addr[13], addr[14], addr[15] = net, v >> 16, (v >> 8) & 0xFF, v & 0xFF
                vals[i].bytes, vals[i].packets = 1500 + i, 1 + i % 7
            times, cpu, free = [], [], []
            deltas: list = []
            for _ in range(rounds):
                t = dp.tables
                cnt = ct.c_uint32(n)
                res = lib.bpf_update_batch(t._fds[t._active], ct.byref(keys), ct.byref(vals),
                                           ct.byref(cnt))
                if res != 0 or cnt.value != n:
                    raise RuntimeError(f"bpf_update_batch: {res} {cnt.value}")
                t0 = time.perf_counter()
                del deltas  # the previous drain's records, as at the end of an agent tick
                free.append(time.perf_counter() - t0)
                t0, c0 = time.perf_counter(), time.process_time()
                deltas = dp.drain()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                if len(deltas) != n:
                    raise RuntimeError(f"drained {len(deltas)} of {n} (duplicate keys?)")
            out[layout] = summary(times)
            out[f"{layout}_cpu"] = summary(cpu)
            out[f"{layout}_free"] = summary(free[1:])  # the first round had nothing to free
            for step, xs in phases.items():
                out[f"{layout}_step{step}"] = summary(xs)
    finally:
        dp.close()
    return out


HOOK_CONFIGS = ("empty", "zonemeter", "empty_tcx", "zonemeter_tcx")


def bench_hooks(args: argparse.Namespace) -> int:
    """The ``--hooks`` run: clsact filters against TCX links (module docstring)."""
    old_stats = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    results: dict[str, Any] = {"rounds": args.rounds, "packets": args.packets,
                               "kernel": os.uname().release}
    load = LoadSampler()
    bench = Bench(args.packets)
    traffics = ("udp4", "udp6", "tcp4")
    try:
        set_stats(True)
        for traffic in traffics:
            samples: dict[str, list[float]] = {c: [] for c in HOOK_CONFIGS}
            for r in range(args.rounds):
                shift = r % len(HOOK_CONFIGS)  # each configuration in every position
                for config in HOOK_CONFIGS[shift:] + HOOK_CONFIGS[:shift]:
                    samples[config].append(bench.per_packet_ns(config, traffic))
            row = {c: summary(v) for c, v in samples.items()}
            for kind in ("", "_tcx"):
                row[f"extra{kind}"] = summary([z - e for z, e in zip(
                    samples[f"zonemeter{kind}"], samples[f"empty{kind}"], strict=True)])
            results[f"ns_{traffic}"] = row
        set_stats(False)
        ratios: list[float] = []
        rates: dict[str, list[float]] = {"zonemeter": [], "zonemeter_tcx": []}
        for r in range(args.rate_rounds or 3 * args.rounds):
            a, b = ("zonemeter", "zonemeter_tcx") if r % 2 == 0 else ("zonemeter_tcx", "zonemeter")
            elapsed = {"zonemeter": 0.0, "zonemeter_tcx": 0.0}
            for config in (a, b, b, a):
                bench.use(config)
                seconds = bench.udp_burst(4, args.packets)
                elapsed[config] += seconds
                rates[config].append(args.packets / seconds)
            ratios.append(elapsed["zonemeter"] / elapsed["zonemeter_tcx"])  # rate tcx / clsact
        results["udp_rate_pps"] = {c: summary(v) for c, v in rates.items()}
        results["udp_rate_ratio_tcx_over_clsact"] = summary(ratios)
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
    print(f"kernel {results['kernel']}, {args.rounds} rounds alternated, {args.packets} frames each, "
          f"load average (1 min) {la['min']:.2f}..{la['max']:.2f} (median {la['median']:.2f})\n")
    print("| traffic | empty clsact | zonemeter clsact | extra clsact | empty tcx | "
          "zonemeter tcx | extra tcx |")
    print("|---|---|---|---|---|---|---|")
    for traffic in traffics:
        row = results[f"ns_{traffic}"]
        print(f"| {traffic} | {fmt(row['empty'])} | {fmt(row['zonemeter'])} | {fmt(row['extra'])} | "
              f"{fmt(row['empty_tcx'])} | {fmt(row['zonemeter_tcx'])} | {fmt(row['extra_tcx'])} |")
    rr, rp = results["udp_rate_ratio_tcx_over_clsact"], results["udp_rate_pps"]
    print(f"\nUDP 64-byte rate ({args.rate_rounds or 3 * args.rounds} A-B-B-A rounds): zonemeter "
          f"clsact {fmt(rp['zonemeter'])} pps, zonemeter tcx {fmt(rp['zonemeter_tcx'])} pps, "
          f"ratio tcx / clsact {rr['median']:.3f} ({rr['min']:.3f}..{rr['max']:.3f})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--packets", type=int, default=200000, help="UDP frames per measurement")
    ap.add_argument("--rate-rounds", type=int, default=0,
                    help="A-B-B-A rounds (4 bursts each) of the UDP rate measurement (default: "
                         "3 x --rounds): the rate is wall-clock and suffers most from other "
                         "jobs on the cores, so it gets more alternations")
    ap.add_argument("--flows", type=int, action="append", default=[],
                    help="also measure the per-packet cost with the client sending round-robin "
                         "to this many server ports (one flow each at the client's hook; the "
                         "per-CPU flow cache has 256 slots); repeatable")
    ap.add_argument("--drain-rounds", type=int, default=0,
                    help="drains per address layout (default: --rounds, at least 3)")
    ap.add_argument("--hooks", action="store_true",
                    help="compare clsact filters with TCX links instead (see the module docstring)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_datapath: run as root", file=sys.stderr)
        return 1
    if args.hooks:
        return bench_hooks(args)
    old_stats = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    results: dict[str, object] = {"rounds": args.rounds, "packets": args.packets,
                                  "kernel": os.uname().release}
    load = LoadSampler()
    bench = Bench(args.packets)
    try:
        set_stats(True)
        traffics = ("udp4", "udp6", "tcp4") + tuple(f"udp4x{n}" for n in args.flows)
        for traffic in traffics:
            samples: dict[str, list[float]] = {"empty": [], "zonemeter": []}
            for r in range(args.rounds):
                order = ("empty", "zonemeter") if r % 2 == 0 else ("zonemeter", "empty")
                for config in order:
                    samples[config].append(bench.per_packet_ns(config, traffic))
            extra = [z - e for z, e in zip(samples["zonemeter"], samples["empty"], strict=True)]
            ratio = [z / e for z, e in zip(samples["zonemeter"], samples["empty"], strict=True)]
            results[f"ns_{traffic}"] = {"empty": summary(samples["empty"]),
                                        "zonemeter": summary(samples["zonemeter"]),
                                        "extra_ns": summary(extra), "ratio": summary(ratio)}
        set_stats(False)
        rates: dict[str, list[float]] = {"empty": [], "zonemeter": []}
        ratios: list[float] = []
        pairwise: list[float] = []  # the same bursts taken two by two (A B, then B A)
        for r in range(args.rate_rounds or 3 * args.rounds):
            a, b = ("empty", "zonemeter") if r % 2 == 0 else ("zonemeter", "empty")
            elapsed: dict[str, float] = {"empty": 0.0, "zonemeter": 0.0}
            bursts: list[dict[str, float]] = [{}, {}]
            for i, config in enumerate((a, b, b, a)):
                bench.use(config)
                seconds = bench.udp_burst(4, args.packets)
                elapsed[config] += seconds
                bursts[i // 2][config] = seconds
                rates[config].append(args.packets / seconds)
            ratios.append(elapsed["empty"] / elapsed["zonemeter"])  # = rate ours / rate empty
            pairwise += [p["empty"] / p["zonemeter"] for p in bursts]
        results["udp_rate_pps"] = {c: summary(v) for c, v in rates.items()}
        results["udp_rate_ratio"] = summary(ratios)
        results["udp_rate_ratio_pairwise"] = summary(pairwise)
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old_stats)
        bench.close()
    results["drain_100k_seconds"] = bench_drain(max(3, args.drain_rounds or args.rounds))
    results["load_average_1m"] = load.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    fmt = lambda s, u="": f"{s['median']:.1f}{u} ({s['min']:.1f}..{s['max']:.1f})"  # noqa: E731
    la: Any = results["load_average_1m"]
    print(f"kernel {results['kernel']}, {args.rounds} rounds alternated, {args.packets} frames each, "
          f"load average (1 min) {la['min']:.2f}..{la['max']:.2f} (median {la['median']:.2f})\n")
    print("| traffic | empty ns/pkt | zonemeter ns/pkt | extra ns | ratio |")
    print("|---|---|---|---|---|")
    for traffic in traffics:
        row: Any = results[f"ns_{traffic}"]
        rt = row["ratio"]
        print(f"| {traffic} | {fmt(row['empty'])} | {fmt(row['zonemeter'])} | {fmt(row['extra_ns'])} | "
              f"{rt['median']:.2f} ({rt['min']:.2f}..{rt['max']:.2f}) |")
    rr = results["udp_rate_ratio"]
    rp = results["udp_rate_pps"]
    print(f"\nUDP 64-byte rate ({args.rate_rounds or 3 * args.rounds} A-B-B-A rounds): "  # type: ignore[index]
          f"empty {fmt(rp['empty'])} pps, zonemeter {fmt(rp['zonemeter'])} pps, "  # type: ignore[index]
          f"ratio {rr['median']:.3f} ({rr['min']:.3f}..{rr['max']:.3f})")  # type: ignore[index]
    pw: Any = results["udp_rate_ratio_pairwise"]
    print(f"the same bursts as adjacent pairs (A B, B A): ratio {pw['median']:.3f} "
          f"({pw['min']:.3f}..{pw['max']:.3f})")
    for layout, s in results["drain_100k_seconds"].items():  # type: ignore[attr-defined]
        base, _, part = layout.partition("_")
        what = {"cpu": f"{base} addresses, CPU time", "free": f"{base} addresses, freeing the "
                "previous drain's records before it, wall"}.get(
                    part, f"{base} addresses, step {part[4:]}, wall" if part.startswith("step")
                    else f"{base} addresses, wall")
        print(f"drain 100,000 entries ({what}): {s['median']:.3f} s "
              f"({s['min']:.3f}..{s['max']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
