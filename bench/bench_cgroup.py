"""Per-packet cost of the cgroup_skb hook (bpf/cgroup.c) against an empty cgroup_skb program.

Both run side by side in one process, rounds rotated: a child cgroup of the cgroup v2
root is created for the run, this process moves into it, and the programs are attached
to it only (never to the root: the machine's other sockets are not measured nor slowed).
Traffic: 64-byte UDP datagrams between two sockets of a network namespace made for the run
(to the addresses of a veth inside it, over ``lo``: loopback addresses themselves are not
counted by the hook), IPv4 and IPv6, each seen at the sender's egress and the receiver's
ingress. Cost per packet = the programs' ``run_time_ns`` gain
(kernel.bpf_stats_enabled) over both hooks divided by the datagrams sent. The table's
flows stay in the per-CPU cache slots, as for the veth numbers in BENCHMARKS.md.

With ``--tcp-conns N ...`` it measures instead established TCP connections (IPv4, one
64-byte segment per send, TCP_NODELAY, sent round-robin over N connections whose clients
each have their own address, so every connection is a flow of its own: four flow keys per
connection, sender and receiver, data and ACKs) for three programs side by side: the empty
one, ours (``zonemeter``: parse, classify, per-CPU cache, flow table) and ours with
per-socket counters (``zonemeter-sk``, DatapathConfig.socket_counters, plus its
sock_release program). Cost per packet = ``run_time_ns`` / ``run_cnt`` over both
cgroup_skb programs (each packet runs one of them once). Tables hold 4 x N + 4,096 flows.

Usage (root, repository root)::

    .venv/bin/python -m bench.bench_cgroup [--rounds 7] [--packets 100000] [--json]
    .venv/bin/python -m bench.bench_cgroup --tcp-conns 1 4096 65536 [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.datapath import Datapath, DatapathConfig, run_in_netns
from agent.datapath import cgroup as cg
from agent.datapath.config import CGROUP_SOURCE, flags_for
from bench.bench_datapath import LoadSampler, fdinfo, set_stats, summary

NETNS = f"zmbench{os.getpid()}"
ADDRS = {4: "10.250.0.1", 6: "fd00:250::1"}


def make_netns() -> None:
    """The bench's namespace: lo up, a veth pair (both ends inside) with ADDRS on one end."""
    for cmd in (["ip", "netns", "add", NETNS], ["ip", "-n", NETNS, "link", "set", "lo", "up"],
                ["ip", "-n", NETNS, "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                ["ip", "-n", NETNS, "addr", "add", f"{ADDRS[4]}/32", "dev", "d0"],
                ["ip", "-n", NETNS, "addr", "add", f"{ADDRS[6]}/128", "dev", "d0", "nodad"],
                ["ip", "-n", NETNS, "link", "set", "d0", "up"]):
        subprocess.run(cmd, check=True)


def udp_burst(family: int, count: int) -> None:
    """Send count 64-byte datagrams to a socket of the bench's namespace, read them."""
    run_in_netns(NETNS, lambda: _burst(family, count))


def _burst(family: int, count: int) -> None:
    fam = socket.AF_INET if family == 4 else socket.AF_INET6
    host = ADDRS[family]
    with socket.socket(fam, socket.SOCK_DGRAM) as rx, socket.socket(fam, socket.SOCK_DGRAM) as tx:
        rx.bind((host, 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        tx.connect(rx.getsockname())
        payload = b"x" * (64 - (28 if family == 4 else 48))
        for i in range(count):
            tx.send(payload)
            if i % 64 == 63:
                while True:
                    try:
                        rx.recv(64, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break


CLIENTS = "10.251.0.0/16"  # AnyIP (a local route): any address of it can be bound
SERVER_PORT = 8080


#: connections per worker process (two fds each; the bench may not raise RLIMIT_NOFILE)
PER_WORKER = 8192


class Workers:
    """Worker processes (forked, so in the bench's cgroup) that each hold up to
    PER_WORKER established TCP pairs and send one pass over them on request; passes go
    worker after worker, so N connections are sent to round-robin whatever N."""

    def __init__(self, conns: int) -> None:
        self.pipes: list[tuple[int, int]] = []
        self.pids: list[int] = []
        for w, first in enumerate(range(0, conns, PER_WORKER)):
            count = min(PER_WORKER, conns - first)
            to_child, from_parent = os.pipe()
            to_parent, from_child = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker
                os.close(from_parent)
                os.close(to_parent)
                code = 0
                try:
                    pairs = run_in_netns(NETNS, lambda f=first, c=count, k=w: _tcp_pairs(f, c, k))
                    os.write(from_child, b"k")
                    while True:
                        cmd = os.read(to_child, 1)
                        if cmd != b"p":
                            break
                        tcp_burst(pairs, len(pairs))
                        os.write(from_child, b"k")
                except BaseException:  # noqa: BLE001 - reported by the parent's read
                    code = 1
                os._exit(code)
            os.close(to_child)
            os.close(from_child)
            self.pipes.append((from_parent, to_parent))
            self.pids.append(pid)
            if os.read(to_parent, 1) != b"k":
                self.close()
                raise RuntimeError(f"worker {w} could not open its connections")

    def passes(self, count: int) -> None:
        """count passes, each one send on every connection."""
        for _ in range(count):
            for w, r in self.pipes:
                os.write(w, b"p")
                if os.read(r, 1) != b"k":
                    raise RuntimeError("a worker died")

    def close(self) -> None:
        for w, r in self.pipes:
            os.close(w)
            os.close(r)
        for pid in self.pids:
            os.waitpid(pid, 0)
        self.pipes, self.pids = [], []


def _tcp_pairs(first: int, count: int, worker: int) -> list[tuple[socket.socket, socket.socket]]:
    """count established (client, server) pairs, client i bound to address first + i of
    CLIENTS, the server on SERVER_PORT + worker; both ends non-blocking after setup."""
    subprocess.run(["ip", "-n", NETNS, "route", "replace", "local", CLIENTS, "dev", "lo"],
                   check=True)
    Path("/proc/sys/net/core/somaxconn").write_text("65535")
    lsn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsn.bind((ADDRS[4], SERVER_PORT + worker))
    lsn.listen(4096)
    pairs: list[tuple[socket.socket, socket.socket]] = []
    pending: list[socket.socket] = []
    for j in range(count):
        i = first + j
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.bind((f"10.251.{(i >> 8) & 0xFF}.{i & 0xFF}", 0))
        c.connect((ADDRS[4], SERVER_PORT + worker))
        pending.append(c)
        if len(pending) == 1024 or j == count - 1:
            byname = {p.getsockname(): p for p in pending}
            for _ in pending:
                srv, peer = lsn.accept()
                srv.setblocking(False)
                pairs.append((byname[peer], srv))
            pending = []
    lsn.close()
    for c, _ in pairs:
        c.setblocking(False)
    return pairs


def tcp_burst(pairs: list[tuple[socket.socket, socket.socket]], count: int) -> None:
    """count 64-byte sends round-robin over pairs, each read at once by its server end."""
    payload = b"x" * 64
    n = len(pairs)
    for i in range(count):
        c, srv = pairs[i % n]
        c.send(payload)
        try:
            srv.recv(4096)
        except BlockingIOError:
            pass


def tcp_main(args: argparse.Namespace) -> dict[str, Any]:
    """The --tcp-conns run: {"conns": {N: {config: summary, "extra": ...}}, ...}."""
    from bcc import BPF

    root = cg.cgroup2_root()
    child = os.path.join(root, f"zm-bench-{os.getpid()}")
    os.mkdir(child)
    home = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    old = next((line.split(":", 2)[2] for line in home.splitlines() if line.startswith("0::")), "/")
    out: dict[str, Any] = {"rounds": args.rounds, "packets": args.packets, "conns": {}}
    loads = LoadSampler()
    try:
        make_netns()
        Path(child, "cgroup.procs").write_text(str(os.getpid()))
        for conns in args.tcp_conns:
            cap = 4 * conns + 4096
            dps = {"zonemeter": Datapath(DatapathConfig(hook="cgroup", cgroup_root=child,
                                                        flow_capacity=cap)),
                   "zonemeter-sk": Datapath(DatapathConfig(hook="cgroup", cgroup_root=child,
                                                           flow_capacity=cap,
                                                           socket_counters=True))}
            if args.baseline:
                from bench.bench_flows import VariantDatapath

                dps["zonemeter-sk-base"] = VariantDatapath(
                    DatapathConfig(hook="cgroup", cgroup_root=child, flow_capacity=cap,
                                   socket_counters=True), [], Path(args.baseline))
            empty = BPF(src_file=str(CGROUP_SOURCE).encode(),
                        cflags=flags_for(dps["zonemeter"].config, (32768, 60999)))
            empty_fd = empty.load_func(b"zm_cg_empty", BPF.CGROUP_SKB).fd
            workers = Workers(conns)
            passes = max(1, args.packets // conns)
            configs = ("empty", *dps)
            res: dict[str, list[float]] = {c: [] for c in configs}
            try:
                workers.passes(2)  # warm: every connection has sent
                set_stats(True)
                for r in range(args.rounds):
                    shift = r % len(configs)  # every configuration in every position
                    for config in configs[shift:] + configs[:shift]:
                        progs = ({p: empty_fd for _, _, p in cg.SIDES} if config == "empty"
                                 else {n: f.fd for n, f in dps[config]._fns.items()})  # noqa: SLF001
                        fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY)
                        links: list[int] = []
                        try:
                            for attach_type, _side, prog in (*cg.SIDES, cg.RELEASE):
                                if prog in progs:
                                    links.append(cg.link_create(progs[prog], fd, attach_type))
                        finally:
                            os.close(fd)
                        fds = [progs[p] for _, _, p in cg.SIDES]
                        try:
                            # one pass first: the socket counters take their keys (a drain
                            # before every round makes them fold and reclassify)
                            workers.passes(1)
                            before = [fdinfo(f) for f in set(fds)]
                            workers.passes(passes)
                            after = [fdinfo(f) for f in set(fds)]
                        finally:
                            for link in links:
                                os.close(link)
                        ns = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
                        runs = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
                        res[config].append(ns / runs if runs else 0.0)
                        if config != "empty":
                            dps[config].drain()
            finally:
                set_stats(False)
                workers.close()
                for dp in dps.values():
                    dp.close()
                empty.cleanup()
            row: dict[str, Any] = {k: summary(v) for k, v in res.items()}
            for config in dps:
                row[f"extra {config}"] = summary(
                    [z - e for z, e in zip(res[config], res["empty"], strict=True)])
            out["conns"][str(conns)] = row
    finally:
        Path(root, old.lstrip("/"), "cgroup.procs").write_text(str(os.getpid()))
        os.rmdir(child)
        subprocess.run(["ip", "netns", "del", NETNS], check=False)
    out["load"] = loads.stop()
    return out


def main() -> int:
    """Run the bench; print a table (or JSON with --json). Returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--packets", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tcp-conns", type=int, nargs="+", default=[],
                    help="TCP connection counts to measure (see above) instead of UDP")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also measure the programs as built from another tree's bpf/ "
                    "directory DIR ('zonemeter-base'; with --tcp-conns socket counters, "
                    "'zonemeter-sk-base'; e.g. git archive main bpf | tar -x -C /tmp/base, DIR "
                    "/tmp/base/bpf)")
    ap.add_argument("--depth", type=int, default=0, metavar="N",
                    help="UDP: run the sockets N cgroup levels below the cgroup the programs "
                    "are attached to (3: a container's level on a systemd-driver node, "
                    "kubepods.slice/<qos>.slice/<pod>.slice/<container>.scope), since the "
                    "cgroup hook walks the socket's ancestors (bpf/cgroup.c zm_cg_hook_id)")
    args = ap.parse_args()
    if args.tcp_conns:
        res = tcp_main(args)
        if args.json:
            json.dump(res, sys.stdout, indent=2)
            print()
            return 0

        def fmt1(s: dict[str, float]) -> str:
            return f"{s['median']:.1f} ({s['min']:.1f}..{s['max']:.1f})"

        print(f"load average (1 min) {fmt1(res['load'])}; ns per packet (per program run), "
              "median (min..max)")
        cols = [c for c in ("zonemeter", "zonemeter-sk", "zonemeter-sk-base")
                if any(c in row for row in res["conns"].values())]
        print("| TCP connections | empty | " + " | ".join(cols) + " | "
              + " | ".join(f"extra {c}" for c in cols) + " |")
        print("|---|---|" + "---|" * (2 * len(cols)))
        for conns, row in res["conns"].items():
            print(f"| {int(conns):,} | {fmt1(row['empty'])} | "
                  + " | ".join(fmt1(row[c]) for c in cols) + " | "
                  + " | ".join(fmt1(row[f"extra {c}"]) for c in cols) + " |")
        return 0
    from bcc import BPF

    root = cg.cgroup2_root()
    child = os.path.join(root, f"zm-bench-{os.getpid()}")
    os.mkdir(child)
    try:
        make_netns()
    except BaseException:
        os.rmdir(child)
        subprocess.run(["ip", "netns", "del", NETNS], check=False)
        raise
    home = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    old = next((line.split(":", 2)[2] for line in home.splitlines() if line.startswith("0::")), "/")
    loads = LoadSampler()
    configs = ("empty", "zonemeter", *(("zonemeter-base",) if args.baseline else ()))
    results: dict[str, dict[str, list[float]]] = {t: {c: [] for c in configs}
                                                  for t in ("udp4", "udp6")}
    dps: dict[str, Datapath] = {
        "zonemeter": Datapath(DatapathConfig(hook="cgroup", cgroup_root=child, flow_capacity=4096))}
    if args.baseline:
        from bench.bench_flows import VariantDatapath

        dps["zonemeter-base"] = VariantDatapath(
            DatapathConfig(hook="cgroup", cgroup_root=child, flow_capacity=4096), [],
            Path(args.baseline))
    dp = dps["zonemeter"]
    empty = BPF(src_file=str(CGROUP_SOURCE).encode(), cflags=flags_for(dp.config, (32768, 60999)))
    empty_fd = empty.load_func(b"zm_cg_empty", BPF.CGROUP_SKB).fd
    progs = {c: {name: fn.fd for name, fn in d._fns.items()}  # noqa: SLF001 - a bench reads them
             for c, d in dps.items()}
    nest = [os.path.join(child, *(f"l{i}" for i in range(1, n + 1))) for n in range(1, args.depth + 1)]
    try:
        for d in nest:
            os.mkdir(d)
        Path(nest[-1] if nest else child, "cgroup.procs").write_text(str(os.getpid()))
        set_stats(True)
        for r in range(args.rounds):
            shift = r % len(configs)  # every configuration in every position
            for config in configs[shift:] + configs[:shift]:
                fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY)
                links: list[int] = []
                try:
                    for attach_type, _side, prog in cg.SIDES:
                        pfd = empty_fd if config == "empty" else progs[config][prog]
                        links.append(cg.link_create(pfd, fd, attach_type))
                finally:
                    os.close(fd)
                fds = [empty_fd] if config == "empty" else list(progs[config].values())
                try:
                    for traffic, fam in (("udp4", 4), ("udp6", 6)):
                        before = sum(fdinfo(f)[0] for f in fds)
                        udp_burst(fam, args.packets)
                        after = sum(fdinfo(f)[0] for f in fds)
                        results[traffic][config].append((after - before) / args.packets)
                finally:
                    for link in links:
                        os.close(link)
                if config != "empty":
                    dps[config].drain()
    finally:
        set_stats(False)
        Path(root, old.lstrip("/"), "cgroup.procs").write_text(str(os.getpid()))
        for d in dps.values():
            d.close()
        empty.cleanup()
        for d in reversed(nest):
            os.rmdir(d)
        os.rmdir(child)
        subprocess.run(["ip", "netns", "del", NETNS], check=False)
    load = loads.stop()
    out: dict[str, Any] = {"rounds": args.rounds, "packets": args.packets, "load": load,
                           "depth": args.depth}
    for traffic, r in results.items():
        extra = [z - e for z, e in zip(r["zonemeter"], r["empty"], strict=True)]
        ratio = [z / e for z, e in zip(r["zonemeter"], r["empty"], strict=True) if e]
        out[traffic] = {"empty": summary(r["empty"]), "zonemeter": summary(r["zonemeter"]),
                        "extra": summary(extra), "ratio": summary(ratio)}
        if args.baseline:
            out[traffic]["zonemeter-base"] = summary(r["zonemeter-base"])
            out[traffic]["over base"] = summary(
                [z - b for z, b in zip(r["zonemeter"], r["zonemeter-base"], strict=True)])
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0

    def fmt(s: dict[str, float]) -> str:
        return f"{s['median']:.1f} ({s['min']:.1f}..{s['max']:.1f})"

    print(f"load average (1 min) {fmt(load)}; ns per packet, egress + ingress, median (min..max)")
    base = " | zonemeter-base | zonemeter over base" if args.baseline else ""
    print(f"| traffic | empty cgroup_skb | zonemeter cgroup_skb | extra | ratio{base} |")
    print("|---|---|---|---|---|" + ("---|---|" if args.baseline else ""))
    for traffic in ("udp4", "udp6"):
        o = out[traffic]
        tail = (f" | {fmt(o['zonemeter-base'])} | {fmt(o['over base'])}" if args.baseline else "")
        print(f"| {traffic} | {fmt(o['empty'])} | {fmt(o['zonemeter'])} | {fmt(o['extra'])} | "
              f"{o['ratio']['median']:.2f} ({o['ratio']['min']:.2f}..{o['ratio']['max']:.2f}){tail} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
