"""Benchmark the uplink programs (the first hop of node ports, bpf/uplink.h) per packet,
side by side with an empty TCX program on the same device (root, real kernel).

Every packet an uplink carries passes our program: the packets of no node port pay the
parse and one inlined array lookup (``zm_entry_ports``), those of a node port also the
entry hash and the count. Three configurations, alternated round by round on the ingress
of one lab node's uplink (a TCX link whose program is swapped with ``BPF_LINK_UPDATE``):

* ``empty``: a TCX program returning TCX_NEXT;
* ``miss``: ours, the entry set holding another port than the traffic's (every packet that
  is not a node port's first hop);
* ``hit``: ours, the traffic's destination an entry (a node port's first hop, counted).

Per-packet cost = ``kernel.bpf_stats_enabled`` run_time_ns / run_cnt of the ingress
program, 64-byte UDP frames an outside peer's namespace sends to the node's address
(IPv4 and IPv6; a C sender with sendmmsg, built with gcc at start; a socket of the node
bound to the port and never read takes them, so no ICMP error comes back). Medians over
the rounds with min..max, and the per-round difference to ``empty`` measured in the same
round. The 1-minute load average is printed (the machine's other jobs share its cores).

Usage (as root, from the repository root):
    .venv/bin/python -m bench.bench_uplink [--rounds 7] [--packets 200000] [--json]

It builds its own lab (``zm<hex>`` prefix, removed at exit): one node ``a``, one outside
peer ``lb``, flat routing, dual stack (:data:`TOPOLOGY`); all traffic stays inside them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from agent.datapath import Datapath, DatapathConfig, run_in_netns, tcx
from bench.bench_datapath import EMPTY_C, SENDER_C, fdinfo, set_stats
from tools.lab import Lab, Topology

TOPOLOGY = """\
options: {mode: flat, ipv6: true}
zones:
  - {name: zone-a, region: region-1}
nodes:
  - {name: a, zone: zone-a, cpu: 4}
pods:
  - {name: a1, namespace: bench, node: a, app: web}
outside:
  - {name: lb, kind: load-balancer, zone: zone-a, type: aws-nlb}
"""
#: the node port the traffic goes to
PORT = 30080
CONFIGS = ("empty", "miss", "hit")


class UplinkBench:
    """The lab, the datapath on node ``a`` with its uplink programs, and the sender."""

    def __init__(self, packets: int) -> None:
        from bcc import BPF

        self.packets = packets
        self.lab = Lab(Topology.from_yaml(TOPOLOGY), state_dir=Path(tempfile.mkdtemp(prefix="zmbench-state"))).up()
        ns, uplink = self.lab.uplink("a")
        self.dp = Datapath(DatapathConfig(netns=ns, exclude_patterns=(uplink,), uplink_patterns=(uplink,),
                                          attach="tcx"))
        self.dp.attach()
        assert self.dp.uplinks() == (uplink,)
        index = int(subprocess.run(["ip", "-n", ns, "-j", "link", "show", uplink], check=True,
                                   capture_output=True, text=True).stdout.split('"ifindex":')[1].split(",")[0])
        self.link = self.dp._links[index][0]  # the ingress link (tcx.SIDES order)
        self.ours = self.dp._fns["zm_tcx_up_in"]
        self.empty_bpf = BPF(text=EMPTY_C)
        self.empty = self.empty_bpf.load_func(b"empty_prog", BPF.SCHED_CLS)
        self.sender = Path(tempfile.mkdtemp(prefix="zmbench")) / "udp_sender"
        self.sender.with_suffix(".c").write_text(SENDER_C)
        subprocess.run(["gcc", "-O2", "-o", str(self.sender), str(self.sender.with_suffix(".c"))], check=True)
        self.addr = {f: str(self.lab.node_ip("a", f)) for f in (4, 6)}
        # a sink on the node's port (never read: its queue drops), so the node sends no ICMP
        # error that would make the connected sender's next send fail
        self.sinks = [run_in_netns(ns, functools.partial(self._bind, f)) for f in (4, 6)]

    def _bind(self, family: int) -> socket.socket:
        s = socket.socket(socket.AF_INET if family == 4 else socket.AF_INET6, socket.SOCK_DGRAM)
        s.bind((self.addr[family], PORT))
        return s

    def use(self, config: str) -> int:
        """Put ``config`` on the uplink's ingress link; return the program fd to read."""
        if config == "empty":
            tcx.link_update(self.link, self.empty.fd)
            return int(self.empty.fd)
        port = PORT if config == "hit" else PORT + 1
        self.dp.set_entry_points([(self.addr[f], port, 17) for f in (4, 6)])
        tcx.link_update(self.link, self.ours.fd)
        return int(self.ours.fd)

    def per_packet_ns(self, config: str, family: int) -> float:
        fd = self.use(config)
        rt0, n0 = fdinfo(fd)
        payload = 64 - 14 - (20 if family == 4 else 40) - 8
        subprocess.run(["ip", "netns", "exec", self.lab.peer_netns("lb"), str(self.sender),
                        self.addr[family], str(PORT), str(self.packets), str(payload)],
                       check=True, capture_output=True)
        rt1, n1 = fdinfo(fd)
        self.dp.drain()  # keep the tables small between rounds
        return (rt1 - rt0) / max(1, n1 - n0)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
        self.dp.close()
        self.lab.down()


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example:\n  .venv/bin/python -m bench.bench_uplink --rounds 7",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--packets", type=int, default=200000, help="UDP frames per measurement")
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("needs root (network namespaces, BPF)")
    b = UplinkBench(args.packets)
    loads = [_load()]
    out: dict[str, Any] = {}
    set_stats(True)
    try:
        for family in (4, 6):
            runs: dict[str, list[float]] = {c: [] for c in CONFIGS}
            for r in range(args.rounds):
                order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
                for c in order:
                    runs[c].append(b.per_packet_ns(c, family))
                loads.append(_load())
            out[f"udp{family}"] = {
                c: {"median_ns": statistics.median(v), "min_ns": min(v), "max_ns": max(v),
                    "over_empty_median_ns": statistics.median(x - e for x, e in zip(v, runs["empty"], strict=True))}
                for c, v in runs.items()}
    finally:
        set_stats(False)
        b.close()
    out["load_1min"] = [min(loads), max(loads)]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"per packet on the uplink's ingress, 64-byte UDP, {args.rounds} rounds x {args.packets} "
          f"packets (load {min(loads):.2f}..{max(loads):.2f})")
    print("| traffic | config | median ns | min..max | over empty (median of per-round differences) |")
    print("|---|---|---|---|---|")
    for fam in ("udp4", "udp6"):
        for c in CONFIGS:
            s = out[fam][c]
            print(f"| {fam} | {c} | {s['median_ns']:.1f} | {s['min_ns']:.1f}..{s['max_ns']:.1f} | "
                  f"{s['over_empty_median_ns']:+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
