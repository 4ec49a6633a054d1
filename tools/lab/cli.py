"""``zonemeter lab``: build, inspect, drive and tear down the network-namespace lab.

Examples::

    zonemeter lab up                                 # default 2-zone, 3-node topology
    zonemeter lab up --topology lab.yaml --prefix zmdemo --mode vxlan --ipv6
    zonemeter lab up --kubernetes real               # real control plane and kube-proxy
    zonemeter lab status --prefix zmdemo -o json
    zonemeter lab traffic --prefix zmdemo --from client-a1 --to shop/web --port 80 --count 50
    zonemeter lab snapshot --prefix zmdemo --out lab.json   # Kubernetes objects
    zonemeter lab down --prefix zmdemo               # also cleans a half-built lab
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agent.errors import InputError
from tools.lab.examples import DEFAULT_TOPOLOGY
from tools.lab.kube import KUBERNETES_MODES, PROXY_MODES
from tools.lab.lab import DEFAULT_STATE_DIR, Lab, list_prefixes
from tools.lab.state import started_by
from tools.lab.topology import Topology


def register(subparsers: Any) -> None:
    """Add the ``lab`` verb and its sub-verbs to the CLI."""
    parser = subparsers.add_parser(
        "lab", help="multi-zone lab cluster in network namespaces",
        description=(__doc__ or "").replace("``", "").replace("Examples::", "examples:"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"where lab state files live (default {DEFAULT_STATE_DIR})")
    sub = parser.add_subparsers(dest="lab_verb", metavar="ACTION",
                                parser_class=type(parser))
    raw = argparse.RawDescriptionHelpFormatter
    up = sub.add_parser("up", help="build a lab (leaves it running)", parents=[common], formatter_class=raw,
                        epilog="examples:\n  zonemeter lab up\n"
                        "  zonemeter lab up --topology lab.yaml --prefix zmdemo --mode vxlan --ipv6\n"
                        "  zonemeter lab up --kubernetes real --kube-proxy-mode nftables\n"
                        "  zonemeter lab up -o json            # status as JSON once built")
    up.add_argument("--topology", help="topology YAML file (default: built-in 2 zones, 3 nodes)")
    up.add_argument("--prefix", help="name prefix (default zm + 4 random hex digits)")
    up.add_argument("--mode", choices=("flat", "vxlan"), help="override options.mode")
    up.add_argument("--ipv6", action="store_true", help="override options.ipv6 to true")
    up.add_argument("--kubernetes", choices=KUBERNETES_MODES, default="emulated",
                    help="emulated (default: snapshot file, kube-proxy emulation) or real (etcd, "
                    "kube-apiserver, kube-controller-manager, kube-proxy built by tools/kube/build.sh)")
    up.add_argument("--kube-proxy-mode", choices=PROXY_MODES, default="iptables",
                    help="mode of the real kube-proxy (--kubernetes real; default iptables)")
    up.add_argument("--server-seconds", type=float, default=86400.0,
                    help="lifetime of the pod servers in seconds (default 86400)")
    up.add_argument("-o", "--output", choices=("table", "json"), default="table")
    down = sub.add_parser("down", parents=[common], help="remove a lab, its namespaces, links, rules, processes",
                          formatter_class=raw,
                          epilog="examples:\n  zonemeter lab down --prefix zmdemo    # also cleans a half-built lab\n"
                          "  zonemeter lab down                   # the one lab `lab up` built, if it is the only one")
    down.add_argument("--prefix", help="lab prefix (default: the only lab there is, if "
                      "`zonemeter lab up` built it)")
    status = sub.add_parser("status", parents=[common], help="show a running lab", formatter_class=raw,
                            epilog="examples:\n  zonemeter lab status\n  zonemeter lab status --prefix zmdemo -o json")
    status.add_argument("--prefix", help="lab prefix (default: the only lab there is)")
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    snap = sub.add_parser("snapshot", parents=[common],
                          help="write the lab's Nodes, Pods, Services, EndpointSlices as JSON", formatter_class=raw,
                          epilog="examples:\n  zonemeter lab snapshot --prefix zmdemo --out lab.json\n"
                          "  zonemeter explain --snapshot lab.json   # what the hint model says about it")
    snap.add_argument("--prefix", help="lab prefix (default: the only lab there is)")
    snap.add_argument("--out", help="file to write (default: standard output)")
    traffic = sub.add_parser("traffic", parents=[common], help="run request/response traffic from a pod",
                             formatter_class=raw,
                             epilog="examples:\n"
                             "  zonemeter lab traffic --from client-a1 --to shop/web --port 80 --count 50\n"
                             "  zonemeter lab traffic --from client-a1 --to shop/web --port 53 --proto udp\n"
                             "  zonemeter lab traffic --from client-a1 --to web-b1 --port 8080  # a pod\n"
                             "  zonemeter lab traffic --from client-a1 --to shop/web --port 80 --family 6  # --ipv6")
    traffic.add_argument("--prefix", help="lab prefix (default: the only lab there is)")
    traffic.add_argument("--from", dest="client", required=True, help="client pod name")
    traffic.add_argument("--to", dest="target", required=True,
                         help="Service (namespace/name), pod name, or IP address")
    traffic.add_argument("--port", type=int, required=True,
                         help="destination port (the Service port for a Service)")
    traffic.add_argument("--proto", choices=("tcp", "udp"), default="tcp",
                         help="transport (default tcp; one connection per exchange)")
    traffic.add_argument("--family", type=int, choices=(4, 6), default=4,
                         help="address family of a Service's ClusterIP or a pod's address "
                         "(default 4)")
    traffic.add_argument("--request-bytes", type=int, default=100,
                         help="application bytes per request, at least 8 (default 100)")
    traffic.add_argument("--response-bytes", type=int, default=1000,
                         help="application bytes per response (default 1000)")
    traffic.add_argument("--count", type=int, default=10,
                         help="request/response exchanges (default 10)")
    traffic.add_argument("--rate", type=float, default=None,
                         help="exchanges per second (default: back to back)")
    traffic.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.set_defaults(func=run)


def _pick_prefix(args: argparse.Namespace) -> str:
    if args.prefix:
        return str(args.prefix)
    # only labs with a state file: a bare namespace may be another run's test lab
    found = list_prefixes(args.state_dir, include_orphans=False)
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError("no lab is running", field="--prefix")
    raise InputError(f"several labs exist ({', '.join(found)}); choose one", field="--prefix")


def _pick_down_prefix(args: argparse.Namespace) -> str:
    """``lab down`` without ``--prefix`` removes a lab only when it is the one lab there is
    and ``zonemeter lab up`` built it: a demo's or a test run's lab is not taken down by a
    guess."""
    if args.prefix:
        return str(args.prefix)
    found = list_prefixes(args.state_dir, include_orphans=True)
    mine = [p for p in found if started_by(p, args.state_dir) == "lab up"]
    if len(found) == 1 and mine:
        return mine[0]
    if not found:
        raise InputError("no lab is running", field="--prefix")
    others = [f"{p} ({started_by(p, args.state_dir).replace('python', 'demo or tests')})"
              for p in found if p not in mine]
    raise InputError("name the lab to remove: " + ", ".join(mine + others), field="--prefix")


def run(args: argparse.Namespace) -> int:
    """Run ``zonemeter lab ACTION``; returns the exit code."""
    verb = getattr(args, "lab_verb", None)
    if verb is None:
        raise InputError("choose an action: up, down, status, snapshot or traffic", field="ACTION")
    if verb == "up":
        return _up(args)
    if verb == "down":
        prefix = _pick_down_prefix(args)
        removed = Lab.down_prefix(prefix, args.state_dir)
        print(f"lab {prefix}: removed {len(removed)} network namespaces")
        return 0
    lab = Lab.attach(_pick_prefix(args), args.state_dir)
    if verb == "status":
        _print_status(lab.status(), args.output)
        return 0
    if verb == "snapshot":
        if lab.kubernetes == "real":  # what the apiserver holds, slices by the real controller
            text = json.dumps(lab.real_objects(), indent=1)
            if args.out:
                Path(args.out).write_text(text + "\n")
            else:
                print(text)
        elif args.out:
            lab.write_snapshot(args.out)
        else:
            print(json.dumps(lab.snapshot(), indent=1))
        return 0
    return _traffic(lab, args)


def _up(args: argparse.Namespace) -> int:
    if args.topology:
        topo = Topology.from_yaml(Path(args.topology))
    else:
        topo = Topology.from_yaml(DEFAULT_TOPOLOGY)
    if args.mode or args.ipv6:
        data = topo.to_dict()
        opts = data["options"]
        if args.mode:
            opts["mode"] = args.mode
        if args.ipv6:
            opts["ipv6"] = True
        # addresses were resolved for the old options: let them be chosen again
        for pod in data["pods"]:
            pod.pop("ip", None)
            pod.pop("ip6", None)
        for svc in data["services"]:
            svc.pop("clusterIP", None)
            svc.pop("clusterIP6", None)
        topo = Topology.from_dict(data, source=args.topology or "<default topology>")
    for node in topo.nodes:
        if node.data_plane == "bypass":
            # the bypass data plane's links live as long as the process holding the lab
            raise InputError("the bypass data plane lives only while the process that built "
                             "the lab runs, and lab up exits: use it from a test or zonemeter demo",
                             source=args.topology, obj=f"Node {node.name}", field="dataPlane")
    lab = Lab(topo, prefix=args.prefix, state_dir=args.state_dir,
              server_max_seconds=args.server_seconds, kubernetes=args.kubernetes,
              proxy_mode=args.kube_proxy_mode)
    lab.started_by = "lab up"
    lab.up()
    _print_status(lab.status(), args.output)
    if args.output == "table":
        print(f"\ntear down with: {down_command(lab.prefix, args.state_dir)}")
    return 0


def down_command(prefix: str, state_dir: Path) -> str:
    """Return the ``lab down`` command that removes this lab, runnable as printed.

    It names the running ``zonemeter`` as the demo's printed commands do
    (``tools.demo.cli.zonemeter_command``: ``.venv/bin/zonemeter`` is not on ``PATH``) and
    adds ``--state-dir`` when it is not the default.

    Args:
        prefix: the lab's name prefix.
        state_dir: where the lab's state file lives.
    """
    import shlex

    from tools.demo.cli import zonemeter_command

    cmd = f"{zonemeter_command()} lab down --prefix {shlex.quote(prefix)}"
    if Path(state_dir) != Path(DEFAULT_STATE_DIR):
        cmd += f" --state-dir {shlex.quote(str(state_dir))}"
    return cmd


def _traffic(lab: Lab, args: argparse.Namespace) -> int:
    target = args.target
    topo = lab.topology
    if "/" in target or any(s.name == target for s in topo.services):
        dst = lab.cluster_ip(target, args.family)
    elif any(p.name == target for p in topo.pods):
        dst = lab.pod_ip(target, args.family)
    else:
        dst = target
    before = lab.ground_truth()
    result = lab.run_flow(args.client, dst, args.port, args.proto, args.request_bytes,
                          args.response_bytes, args.count, args.rate)
    after = lab.ground_truth()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    if args.output == "json":
        print(json.dumps({
            "ok": result.ok, "failed": result.failed, "errors": list(result.errors),
            "ground_truth_delta": [{"client": c, "server": s, "direction": d, "bytes": b}
                                   for (c, s, d), b in sorted(delta.items())]}, indent=1))
    else:
        print(f"{result.ok} exchanges ok, {result.failed} failed"
              + (f" ({result.errors[0]})" if result.errors else ""))
        print(f"{'CLIENT':<20} {'SERVER':<20} {'DIRECTION':<9} {'L3 BYTES':>12}")
        for (c, s, d), b in sorted(delta.items()):
            print(f"{c:<20} {s:<20} {d:<9} {b:>12}")
    return 0 if result.failed == 0 else 1


def _print_status(status: dict[str, Any], output: str) -> None:
    if output == "json":
        print(json.dumps(status, indent=1))
        return
    missing = [n for n, ok in status["netns"].items() if not ok]
    print(f"lab {status['prefix']}  mode={status['mode']}  ipv6={status['ipv6']}  "
          f"namespaces={len(status['netns']) - len(missing)}/{len(status['netns'])}")
    kube = status.get("kubernetes", {"mode": "emulated"})
    if kube["mode"] == "real":
        print(f"kubernetes: real {kube['version']} (etcd {kube['etcd']}), kube-proxy {kube['proxyMode']} on "
              f"{', '.join(kube['kubeProxyNodes']) or 'no node'}; apiserver {kube['apiserver']} in {kube['netns']}")
        print(f"  KUBECONFIG={kube['adminKubeconfig']} {kube['kubectl']} get endpointslices -A -o yaml")
        print(f"  agents: --kubeconfig {kube['agentKubeconfig']}")
    else:
        print("kubernetes: emulated (snapshot file, kube-proxy emulation)")
    print(f"\n{'NODE':<12} {'ZONE':<12} {'IP':<16} {'POD CIDR':<18} NETNS")
    for n in status["nodes"]:
        print(f"{n['name']:<12} {n['zone']:<12} {n['ip']:<16} {n['podCIDR']:<18} {n['netns']}")
    print(f"\n{'POD':<20} {'NODE':<8} {'IP':<16} {'VETH':<14} PORTS")
    for p in status["pods"]:
        print(f"{p['name']:<20} {p['node']:<8} {p['ip']:<16} {p['hostVeth'] or '(host)':<14} "
              f"{','.join(p['ports'])}")
    print(f"\n{'SERVICE':<24} {'CLUSTER IP':<14} PORTS / ENDPOINTS BY NODE")
    for s in status["services"]:
        print(f"{s['service']:<24} {s['clusterIP']:<14} {' '.join(s['ports'])}")
        for node, eps in s["endpointsByNode"].items():
            print(f"{'':<24} {'':<14}   {node}: {', '.join(eps) or '(none)'}")
    if missing:
        print(f"\nmissing namespaces: {', '.join(missing)}")
