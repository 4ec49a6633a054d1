"""``zonemeter demo``: the product on one machine, no cluster needed.

Builds a three-zone lab cluster in network namespaces (tools/lab), writes its Kubernetes
objects with the hints the EndpointSlice controller would write, programs every node's
kube-proxy emulation with the endpoints kube-proxy would select (node c2 ignores hints;
both answers come from the upstream code through tools/oracle when its binary is built,
else from zonemeter's model, and the demo says which),
starts one ``zonemeter agent`` per lab node, runs the traffic matrix while a per-Service
table refreshes, and prints the agents' numbers beside the lab's own counters.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from agent.errors import InputError, RuntimeFailure
from tools.demo.run import DemoOptions, DemoResult, DemoRun, sigterm_as_interrupt, teardown_kept, warning_messages
from tools.demo.summary import render_table
from tools.demo.topology import load_demo

EXAMPLES = """\
examples:
  zonemeter demo                          # default cluster, 30 s of traffic, then clean up
  zonemeter demo --duration 10 -o json    # machine-readable summary on stdout
  zonemeter demo --prometheus --keep      # leave agents + Prometheus running to explore
  zonemeter demo --teardown /tmp/zonemeter-demo-XXXX   # end a --keep run
  zonemeter demo --topology my-cluster.yaml --mode vxlan --ipv6
  zonemeter demo --topology docs/examples/every-path.yaml -o json   # every path a byte takes
  zonemeter demo --zone-cidrs zones.yaml  # also map these ranges (managed databases, LBs)
  zonemeter demo --kubernetes real --keep # real control plane and kube-proxy; prints a kubectl line

The live table goes to standard error, the final summary to standard output.
Needs root (network namespaces, iptables, BPF).
"""


def register(subparsers: Any) -> None:
    """Add the ``demo`` verb."""
    p = subparsers.add_parser(
        "demo", help="run a three-zone lab cluster with one agent per node and show "
        "per-Service cross-zone bytes beside the lab's ground truth",
        description=(__doc__ or "").replace("``", ""), epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", metavar="FILE",
                   help="lab topology YAML with an optional traffic section (docs/demo.md); "
                   "default: the built-in three-zone shop")
    p.add_argument("--duration", type=float, default=30.0, metavar="SECONDS",
                   help="seconds of measured traffic (default 30)")
    p.add_argument("--keep", action="store_true",
                   help="leave the lab, agents (and Prometheus) running at the end")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--prometheus", action="store_true",
                   help="also run Prometheus (/usr/bin/prometheus) scraping the agents and "
                   "check its sums against the lab")
    p.add_argument("--mode", choices=("flat", "vxlan"), help="override options.mode")
    p.add_argument("--ipv6", action="store_true",
                   help="dual-stack lab (options.ipv6: true); clients call the IPv4 and the "
                   "IPv6 ClusterIPs (a traffic section with family: 6 keeps IPv6 only)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="agents' export interval (default 2)")
    p.add_argument("--workdir", type=Path, metavar="DIR",
                   help="snapshot, logs and TSDB go here (default: a new temporary directory)")
    p.add_argument("--hints", choices=("auto", "oracle", "model"), default="auto",
                   help="where the lab's EndpointSlice hints and kube-proxy endpoints come from: "
                   "the upstream code (tools/oracle), zonemeter's model, or auto: the oracle "
                   "when built (default)")
    p.add_argument("--kubernetes", choices=("emulated", "real"), default="emulated",
                   help="emulated (default: snapshot file, kube-proxy emulation) or real: etcd, "
                   "kube-apiserver, the EndpointSlice controller and kube-proxy built by "
                   "tools/kube/build.sh decide, and the agents read the apiserver (docs/lab.md)")
    p.add_argument("--kube-proxy-mode", choices=("iptables", "nftables"), default="iptables",
                   help="mode of the real kube-proxy (--kubernetes real; default iptables)")
    p.add_argument("--hook", choices=("veth", "cgroup"), default="veth",
                   help="where the agents count: at the pod veths (default) or at the sockets "
                   "(cgroup_skb; needed for nodes with dataPlane: bypass, docs/lab.md)")
    p.add_argument("--zone-cidrs", type=Path, metavar="FILE",
                   help="zone CIDR file (CSV or YAML, docs/metadata.md) the agents read, beside "
                   "the entries the lab writes for the topology's outside peers")
    p.add_argument("--teardown", type=Path, metavar="DIR",
                   help="stop what a --keep run left in DIR and exit")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.duration <= 86400:
        raise InputError(f"must be 1-86400 seconds, got {args.duration:g}", source="--duration")
    if not 0.5 <= args.interval <= 60:
        raise InputError(f"must be 0.5-60 seconds, got {args.interval:g}", source="--interval")


def _progress_printer(zones: list[str], modes: dict[str, str]) -> Any:
    tty = sys.stderr.isatty()

    def show(summary: dict[str, Any], elapsed: float, total: float) -> None:
        title = f"zonemeter demo: {elapsed:5.1f} s elapsed (measuring {total:g} s); " \
                "agents' numbers = lab's counters (settle after each agent interval)"
        text = render_table(summary, zones, modes, title)
        if tty:
            sys.stderr.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            sys.stderr.write(f"[{elapsed:5.1f}s] " + "; ".join(
                f"{s['name']} cross-zone {s['cross_zone_bytes']:,}"
                for s in summary["services"]) + "\n")
        sys.stderr.flush()

    return show


def zonemeter_command(argv0: str | None = None, python: str | None = None) -> str:
    """Return how the user can run zonemeter again, for the commands the demo prints.

    ``zonemeter`` when that name on ``PATH`` is the running executable; the running
    executable's absolute path when it is a ``zonemeter`` script (e.g. ``.venv/bin/zonemeter``,
    which is not on ``PATH``); otherwise ``<python> -m agent`` with the running interpreter.

    Args:
        argv0: the program path (default ``sys.argv[0]``).
        python: the interpreter (default ``sys.executable``).
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    python = sys.executable if python is None else python
    path = Path(argv0)
    if path.name == "zonemeter" and path.is_file():
        resolved = path.resolve()
        on_path = shutil.which("zonemeter")
        if on_path is not None and Path(on_path).resolve() == resolved:
            return "zonemeter"
        return shlex.quote(str(resolved))
    return f"{shlex.quote(python)} -m agent"


def _report(result: DemoResult, run: DemoRun, args: argparse.Namespace, zones: list[str],
            modes: dict[str, str]) -> None:
    cmd = zonemeter_command()

    def q(path: object) -> str:
        return shlex.quote(str(path))

    why = (f"why: {cmd} explain --snapshot {q(run.cluster.snapshot_path)} "
           f"(snapshot and agent logs stay in {run.workdir})")
    if args.output == "json":
        print(json.dumps(result.summary, indent=1))
        # standard output stays pure JSON; the directory left in /tmp is still named
        print(f"zonemeter demo: {why}", file=sys.stderr)
    else:
        try:
            messages = warning_messages(run.cluster.snapshot_path)
        except InputError:
            messages = {}  # codes alone; explain on the snapshot says why it cannot be read
        title = (f"zonemeter demo: {result.traffic_seconds:.1f} s of traffic per client "
                 f"({result.summary['duration_seconds']:.1f} s from starting the first client "
                 f"to the last reply) on {len(run.cluster.topology.nodes)} nodes in "
                 f"{len(zones)} zones (lab {run.cluster.prefix})")
        print(render_table(result.summary, zones, modes, title, warning_messages=messages))
        failed = sum(f.failed for f in result.flows)
        ok = sum(f.ok for f in result.flows)
        print(f"requests: {ok:,} completed, {failed:,} failed")
        kube = result.summary.get("kubernetes") or {"mode": "emulated"}
        if kube["mode"] == "real":
            print(f"kubernetes: real {kube['version']} (etcd {kube['etcd']}): hints by the real EndpointSlice "
                  f"controller, kube-proxy {kube['proxyMode']} on {', '.join(kube['kubeProxyNodes'])}"
                  + (f", the lab's emulation (ignores hints) on {', '.join(kube['emulatedProxyNodes'])}"
                     if kube["emulatedProxyNodes"] else ""))
        else:
            source = f" from the {kube['hints']}" if kube.get("hints") else ""
            print(f"kubernetes: emulated (snapshot file, hints and kube-proxy endpoints{source}, "
                  "kube-proxy emulation)")
        if result.prometheus is not None:
            p = result.prometheus
            print(f"prometheus {p.url}: sum by (service) (increase(zonemeter_service_bytes_total"
                  "{crossing=\"cross_zone\"}[window])) vs the lab in that window:")
            for key, truth in sorted(p.truth.items()):
                got = p.aligned.get(key, 0.0)
                print(f"  {key:<22} {got:>14,.0f} vs {truth:>14,}   (plain increase, "
                      f"extrapolated: {p.plain.get(key, 0.0):,.0f})")
        print(why)
    out = sys.stdout if args.output == "table" else sys.stderr
    if args.keep:
        lines = [f"kept running (workdir {run.workdir}):"]
        for a in run.fleet.agents:
            lines.append(f"  agent {a.node}: curl -s {a.url}/metrics")
            lines.append(f"  {'':{len(a.node) + 6}}  {cmd} top --url {a.url}")
        if run.prometheus_url:
            lines.append(f"  prometheus: {run.prometheus_url}/graph")
        lines.append(f"  lab: {cmd} lab status --prefix {run.cluster.prefix} "
                     f"--state-dir {q(run.cluster.lab.state_dir)}")
        kube = result.summary.get("kubernetes") or {"mode": "emulated"}
        if kube["mode"] == "real":
            lines.append(f"  KUBECONFIG={q(kube['adminKubeconfig'])} {q(kube['kubectl'])} "
                         "get endpointslices -A -o yaml")
        lines.append(f"tear down: {cmd} demo --teardown {q(run.workdir)}")
        print("\n".join(lines), file=out)


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit code."""
    if args.teardown is not None:
        for line in teardown_kept(args.teardown):
            print(line)
        return 0
    _check(args)
    spec = load_demo(args.topology, mode=args.mode, ipv6=True if args.ipv6 else None)
    if args.zone_cidrs is not None:
        from agent.k8s.cidrs import load_zone_cidrs

        load_zone_cidrs(args.zone_cidrs)  # a bad file is one line naming it, before any build
    if os.geteuid() != 0:
        raise RuntimeFailure("the demo needs root (network namespaces, iptables, BPF)")
    zones = [z.name for z in spec.topology.zones]
    options = DemoOptions(duration_seconds=args.duration, interval_seconds=args.interval,
                          refresh_seconds=max(2.0, args.interval), prometheus=args.prometheus,
                          keep=args.keep, workdir=args.workdir, hints=args.hints,
                          kubernetes=args.kubernetes, kube_proxy_mode=args.kube_proxy_mode,
                          hook=args.hook,
                          zone_cidrs=args.zone_cidrs)
    restore = sigterm_as_interrupt()
    owner = os.getpid()
    run_ = DemoRun(spec, options)
    try:
        with run_:
            print(f"zonemeter demo: building lab {run_.cluster.prefix} "
                  f"({len(spec.topology.nodes)} nodes, {len(spec.topology.pods)} pods: "
                  "namespaces, links, kube-proxy rules)", file=sys.stderr, flush=True)
            print(f"zonemeter demo: {run_.cluster.hints.line}", file=sys.stderr, flush=True)
            modes: dict[str, str] = {}
            started = time.monotonic()

            def progress(summary: dict[str, Any], elapsed: float, total: float) -> None:
                if not modes:
                    modes.update({k: m.mode for k, m in run_.cluster.models.items()})
                _progress_printer(zones, modes)(summary, elapsed, total)

            def phase(text: str) -> None:
                print(f"zonemeter demo: {text}", file=sys.stderr, flush=True)

            result = run_.execute(progress=progress, phase=phase)
            modes.update({k: m.mode for k, m in run_.cluster.models.items()})
            print(f"zonemeter demo: done in {time.monotonic() - started:.0f} s", file=sys.stderr)
            follows = "the real components" if args.kubernetes == "real" else "upstream"
            for text in run_.cluster.disagreements:
                print(f"zonemeter demo: model bug (the lab follows {follows}): {text}",
                      file=sys.stderr)
            _report(result, run_, args, zones, modes)
    except KeyboardInterrupt:
        # leaving `with run_` stopped the agents and removed the lab; a forked helper that
        # unwound here must stay silent
        if os.getpid() == owner:
            print(f"zonemeter demo: interrupted: agents stopped, lab removed; snapshot and "
                  f"agent logs stay in {run_.workdir}", file=sys.stderr, flush=True)
        raise
    finally:
        restore()
    bad = [n for n, c in result.agent_exit_codes.items() if c != 0]
    if bad:
        print(f"zonemeter: error: agents of nodes {', '.join(bad)} did not exit cleanly "
              f"(logs in {run_.workdir / 'logs'})", file=sys.stderr)
        return 1
    return 0
