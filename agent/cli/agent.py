"""``zonemeter agent``: flags, signals and the run of the per-node loop (:mod:`agent.loop`).

On SIGTERM/SIGINT: stop the link watcher and detach (so nothing is counted after the
last read), drain what the tables hold, attribute and export it, keep serving for
``--final-linger-seconds``, exit 0.

Examples::

    zonemeter agent --node-name node-a --snapshot cluster.json
    zonemeter agent --node-name a1 --snapshot lab.json --netns zm1a2b-node-a1 \\
        --metrics-address 127.0.0.1:11808 --interval 2 --exclude-interfaces 'zm1a2bu*'
    NODE_NAME=node-a zonemeter agent            # in-cluster (DaemonSet)
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from agent import exporter as ex
from agent.checkpoint import DEFAULT_CHECKPOINT_PATH, Checkpointer
from agent.datapath import ATTACH_MODES, HOOKS
from agent.errors import InputError, RuntimeFailure
from agent.exporter.shard import DEFAULT_REPLICAS
from agent.hints import DEFAULT_VERSION, HintModel
from agent.k8s import ClusterMetadata
from agent.k8s.cache import POD_SCOPES
from agent.k8s.cidrs import IPNetwork
from agent.logs import setup_logging
from agent.loop import DEFAULT_INTERVAL, AgentLoop, HeapFreezer

log = logging.getLogger(__name__)

DEFAULT_METRICS_ADDRESS = "0.0.0.0:11808"
#: production default of ``--hold-unresolved-seconds``: covers watch latency for new pods
#: and an API outage up to a minute, delays only the bytes of unknown pod addresses
DEFAULT_HOLD_UNRESOLVED_SECONDS = 60.0
#: ``--series-retention`` default: far above any scrape interval, so the last value of a
#: deleted object's series is scraped many times before the series goes (docs/metrics.md)
DEFAULT_SERIES_RETENTION = 600.0
#: ``--pin-path`` default root on a node: ``/sys/fs/bpf/zonemeter/<node-name>``
DEFAULT_PIN_ROOT = "/sys/fs/bpf/zonemeter"
#: upper bound of every seconds flag (one week): larger values are typos, and
#: ``time.sleep`` refuses some of them
MAX_SECONDS = 7 * 24 * 3600.0

_EPILOG = """\
examples:
  zonemeter agent --node-name node-a --snapshot cluster.json
  zonemeter agent --node-name a1 --snapshot lab.json --netns zm1a2b-node-a1 \\
      --metrics-address 127.0.0.1:11808 --interval 2 --exclude-interfaces 'zm1a2bu*'
  NODE_NAME=node-a zonemeter agent                 # in-cluster (DaemonSet)

Serves /metrics, /healthz, /readyz and /flows (read by `zonemeter top`).
Logs one JSON object per line on stderr. SIGTERM: detach, final drain and export, exit 0.
"""


# ----------------------------------------------------------------------------- CLI


def _patterns(text: str | None, flag: str) -> tuple[str, ...]:
    if not text:
        return ()
    out = tuple(p.strip() for p in text.split(",") if p.strip())
    if not out:
        raise InputError("expected GLOB[,GLOB...]", source=flag)
    return out


def register(subparsers: Any) -> None:
    """Add the ``agent`` verb."""
    p = subparsers.add_parser(
        "agent", help="run the per-node agent (datapath, attribution, /metrics)",
        description="Count pod traffic on this node with eBPF, attribute it to Services, "
        "zones and workloads, and serve Prometheus metrics.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"), metavar="NODE",
                   help="this node's name (default: $NODE_NAME)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--snapshot", metavar="FILE",
                     help="read Nodes, Pods, Services, EndpointSlices from a kubectl dump")
    src.add_argument("--kubeconfig", metavar="FILE",
                     help="list+watch a cluster with this kubeconfig (default, as kubectl: $KUBECONFIG, "
                     "then ~/.kube/config, then in-cluster config)")
    p.add_argument("--netns", metavar="NODE_NETNS",
                   help="attach to pod veths inside this network namespace (/run/netns/NAME); "
                   "metrics still listen in the agent's own namespace")
    p.add_argument("--metrics-address", default=DEFAULT_METRICS_ADDRESS, metavar="HOST:PORT",
                   help="where /metrics, /healthz, /readyz, /flows listen (default %(default)s)")
    p.add_argument("--flows-allow-remote", action="store_true",
                   help="serve /flows (pod names, peer IPs) to non-loopback peers too; by "
                        "default only `zonemeter top` on the node may read it")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help="drain and export period (default %(default)g)")
    p.add_argument("--zone-cidrs", metavar="FILE",
                   help="CIDR -> zone[, region] file for addresses outside the cluster")
    p.add_argument("--pod-scope", choices=POD_SCOPES, default="cluster",
                   help="which Pods the agent watches: cluster (every Pod: remote pods by name) "
                   "or node (this node's only, spec.nodeName=NODE; other nodes' pod addresses "
                   "resolve through EndpointSlices and Nodes' podCIDRs, which every pod "
                   "address must lie in). Node scope keeps the API server's watch traffic "
                   "per agent independent of the cluster's pod count (default %(default)s; "
                   "docs/metadata.md, Pod scope)")
    p.add_argument("--pod-cidrs", metavar="CIDR,...",
                   help="the cluster's pod address ranges beyond Nodes' spec.podCIDRs (a VPC "
                   "CNI's subnets, a Calico IP pool): addresses inside them are pods, never "
                   "external")
    p.add_argument("--exclude-interfaces", metavar="GLOB,...",
                   help="interfaces never attached (fnmatch), e.g. an uplink veth")
    p.add_argument("--interface-patterns", metavar="GLOB,...",
                   help="extra interfaces attached whatever their kind (cali*, lxc*, eni*)")
    p.add_argument("--attach", choices=ATTACH_MODES, default="auto",
                   help="how programs attach to pod veths: tcx (TCX links, Linux 6.6+, first in the "
                   "device's list), clsact (tc filters) or auto (tcx when the kernel has it; "
                   "default %(default)s; docs/datapath.md, Hooks)")
    p.add_argument("--hook", choices=HOOKS, default="veth",
                   help="where the programs count: veth (host-side pod veths), cgroup (cgroup_skb "
                   "on the node's cgroup v2 root: every socket, whatever the CNI; host-network "
                   "endpoints counted at their node) or auto (cgroup when a cgroup_skb link "
                   "attaches on the cgroup v2 hierarchy's root, else veth; the choice is logged "
                   "and exported as zonemeter_datapath_info). Should be the same on every node: "
                   "ZonemeterHookMixed fires otherwise (default %(default)s; docs/datapath.md, "
                   "The cgroup_skb hook)")
    p.add_argument("--cgroup-root", metavar="DIR",
                   help="cgroup hook: the node's cgroup v2 root (default: the cgroup2 mount in "
                   "/proc/self/mountinfo). In a container, mount the host's /sys/fs/cgroup and name "
                   "it here (its unified/ subdirectory is used on hybrid hosts): the container's "
                   "own /sys/fs/cgroup is its cgroup namespace, not the node's")
    p.add_argument("--uplink-interfaces", metavar="GLOB,...",
                   help="the node's uplinks (fnmatch; default: every physical device, else the "
                   "default routes' devices): where the first hop of node ports is counted "
                   "(--entry-hops), and on the cgroup hook the interfaces whose counters the "
                   "coverage check compares with the bytes counted for peers off the node")
    p.add_argument("--entry-hops", choices=("on", "off"), default="on",
                   help="count the first hop of node ports (a load balancer or another client off "
                   "the node to a node port, LoadBalancer IP or externalIP of a Service with "
                   "externalTrafficPolicy Cluster) with tc programs on the uplinks, exported as "
                   "zonemeter_service_entry_bytes_total; off: no program on the uplinks "
                   "(default %(default)s; docs/datapath.md, The first hop of a node port)")
    p.add_argument("--cgroup-scope-netns", metavar="NETNS,...",
                   help="cgroup hook: count only sockets of these network namespaces (/run/netns "
                   "names). For labs, whose namespaces share the machine's cgroup tree; a node "
                   "needs none (Linux 6.12+)")
    p.add_argument("--cgroup-scope-cgroup", default=None, metavar="DIR",
                   help="cgroup hook: count also sockets of this cgroup v2 directory and the "
                   "cgroups below it (with --cgroup-scope-netns: either suffices). For labs, "
                   "whose pods come and go under a node's cgroup; a node needs none")
    p.add_argument("--kubernetes-version", default=None, metavar="X.Y",
                   help="control-plane Kubernetes version the hint model reproduces, 1.27 to "
                   f"1.37 (default: from the cluster's /version, or the version.json beside "
                   f"--snapshot; else {DEFAULT_VERSION})")
    p.add_argument("--kube-proxy-version", default="auto", metavar="auto|X.Y",
                   help="kube-proxy version the hint model judges nodes with: auto = each "
                   "Node's status.nodeInfo (kubeProxyVersion, else kubeletVersion; the "
                   "control plane's version when it reports none), X.Y = every node "
                   "(default %(default)s)")
    p.add_argument("--feature-gates", default="", metavar="A=true,...",
                   help="feature gate overrides for the control-plane version (kube-proxies "
                   "of another version run that version's defaults)")
    p.add_argument("--flow-capacity", type=int, default=65536, metavar="N",
                   help="kernel flow entries per table (default %(default)s)")
    p.add_argument("--final-linger-seconds", type=float, default=0.0, metavar="SECONDS",
                   help="after SIGTERM and the final export, keep serving /metrics this long "
                   "so a last scrape sees every byte (default %(default)g)")
    p.add_argument("--hold-unresolved-seconds", type=float,
                   default=DEFAULT_HOLD_UNRESOLVED_SECONDS, metavar="SECONDS",
                   help="hold bytes of pod addresses the metadata does not know yet (a new "
                   "pod, an API outage, a reused address's new veth) for up to this long, "
                   "then count them as they resolve (unknown when still unresolved) "
                   "(default %(default)g; 0: count at once; at most 100000 deltas held)")
    p.add_argument("--series-retention", type=float, default=DEFAULT_SERIES_RETENTION,
                   metavar="SECONDS",
                   help="drop the series of a deleted Service, or of a workload no pod "
                   "belongs to any more, once it gained no bytes for this long (default "
                   "%(default)g; 0: never, series live until restart)")
    p.add_argument("--locality-replicas", type=int, default=DEFAULT_REPLICAS, metavar="N",
                   help="export each Service's locality series (cluster-wide state, the same "
                   "on every agent) from N agents chosen by hashing Node names, plus every "
                   "agent that counted bytes of the Service; 0: every agent exports every "
                   "Service (default %(default)d; docs/metrics.md, Locality series)")
    p.add_argument("--pod-name", default=os.environ.get("POD_NAME"), metavar="NAME",
                   help="this agent's own pod (default: $POD_NAME); with --pod-namespace, "
                   "the --locality-replicas ring holds only the nodes running a pod of its "
                   "DaemonSet, not every Node (docs/metrics.md, Locality series)")
    p.add_argument("--pod-namespace", default=os.environ.get("POD_NAMESPACE"), metavar="NS",
                   help="this agent's pod's namespace (default: $POD_NAMESPACE)")
    p.add_argument("--sync-timeout-seconds", type=float, default=60.0, metavar="SECONDS",
                   help="live cluster: wait this long for the first list of every resource "
                   "before attaching (default %(default)g)")
    p.add_argument("--pin-path", metavar="DIR",
                   help="pin the flow tables here (a BPF filesystem) so the kernel keeps "
                   "counting across agent restarts; 'none' disables pinning (default: "
                   f"{DEFAULT_PIN_ROOT}/<node-name>, or none with --netns)")
    p.add_argument("--checkpoint-path", metavar="FILE",
                   help="keep the cumulative counters in this file, rewritten atomically "
                   "after every drain, so a restart or kill -9 neither resets nor loses "
                   "them; 'none' disables (default: "
                   f"{DEFAULT_CHECKPOINT_PATH} when its directory exists, none with --netns)")
    p.add_argument("--cleanup", action="store_true",
                   help="remove what released agents left (our tc filters and the pins "
                   "under --pin-path) and exit")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def agent_pod(args: argparse.Namespace) -> tuple[str, str] | None:
    """``(namespace, name)`` of the agent's own pod from ``--pod-namespace``/``--pod-name``,
    or None when either is unset or empty (the ring then holds every Node)."""
    if args.pod_name and args.pod_namespace:
        return args.pod_namespace, args.pod_name
    return None


def _validate(args: argparse.Namespace) -> None:
    if not args.node_name:
        raise InputError("required (or set NODE_NAME)", source="--node-name")
    if not args.interval > 0:
        raise InputError(f"must be > 0, got {args.interval:g}", source="--interval")
    # NaN passes every "< 0" check and infinity is no interval: --hold-unresolved-seconds
    # nan held bytes forever (never exported), --final-linger-seconds inf or nan crashed
    # time.sleep() after the final export, --interval inf exported once
    for flag, value in (("--interval", args.interval),
                        ("--final-linger-seconds", args.final_linger_seconds),
                        ("--sync-timeout-seconds", args.sync_timeout_seconds),
                        ("--hold-unresolved-seconds", args.hold_unresolved_seconds)):
        if not math.isfinite(value) or value > MAX_SECONDS:
            raise InputError(f"must be a number of seconds up to {MAX_SECONDS:g}, got {value:g}",
                             source=flag)
    if args.final_linger_seconds < 0:
        raise InputError("must be >= 0", source="--final-linger-seconds")
    if args.sync_timeout_seconds < 0:
        raise InputError("must be >= 0", source="--sync-timeout-seconds")
    if args.hold_unresolved_seconds < 0:
        raise InputError("must be >= 0", source="--hold-unresolved-seconds")
    if not args.series_retention >= 0:  # also NaN
        raise InputError(f"must be >= 0 (0: never expire), got {args.series_retention:g}",
                         source="--series-retention")
    if args.locality_replicas < 0:
        raise InputError(f"must be >= 0 (0: every Service), got {args.locality_replicas}",
                         source="--locality-replicas")
    ex.parse_address(args.metrics_address)
    if args.netns is not None and (not args.netns or "/" in args.netns
                                   or args.netns in (".", "..")):
        raise InputError(f"expected a name under /run/netns, got {args.netns!r}", source="--netns")
    if args.netns is not None and not os.path.exists(f"/run/netns/{args.netns}"):
        raise InputError(f"no network namespace /run/netns/{args.netns}", source="--netns")


class Stopper:
    """SIGTERM/SIGINT -> a stop flag that wakes the loop at once, whichever thread the kernel
    delivers the signal to.

    Python runs signal handlers in the main thread, but the kernel may deliver the signal
    to any thread (the HTTP server's, BCC's); a main thread blocked in a timed wait is then
    not interrupted and would notice only when its timeout ends (a whole interval). The
    C-level handler writes to :func:`signal.set_wakeup_fd` from whatever thread it runs in,
    so :meth:`wait` selects on that socket instead.
    """

    def __init__(self) -> None:
        import socket

        self.event = threading.Event()
        self.signal: int | None = None
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._previous = {sig: signal.signal(sig, self._handler)
                          for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handler(self, signum: int, _frame: object) -> None:
        self.signal = signum  # no logging here: the handler may interrupt a log call
        self.event.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True as soon as a stop signal arrived."""
        import select

        deadline = time.monotonic() + max(0.0, timeout)
        while not self.event.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select([self._r], [], [], min(left, 1.0))
            if readable:
                try:
                    self._r.recv(4096)
                except BlockingIOError:
                    pass
        return self.event.is_set()

    def close(self) -> None:
        """Restore the previous handlers and wakeup fd."""
        signal.set_wakeup_fd(self._old_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._r.close()
        self._w.close()


def pin_path_for(args: argparse.Namespace) -> tuple[str | None, bool]:
    """Resolve ``--pin-path``: ``(path or None, explicit)``.

    Default: ``/sys/fs/bpf/zonemeter/<node-name>`` on a real node; none with ``--netns``
    (the lab and the demo run many throw-away nodes with reused names: a later run must
    never drain an earlier run's pinned counters). ``--pin-path none`` disables pinning.
    """
    if args.pin_path is not None:
        if args.pin_path.lower() == "none":
            return None, True
        return args.pin_path, True
    if args.netns is not None:
        return None, False
    return f"{DEFAULT_PIN_ROOT}/{args.node_name}", False


def checkpoint_path_for(args: argparse.Namespace) -> str | None:
    """Resolve ``--checkpoint-path``: the file, or None (no checkpoint).

    Default: :data:`agent.checkpoint.DEFAULT_CHECKPOINT_PATH` when its directory exists
    (the DaemonSet mounts it from the host); none with ``--netns`` (the lab's throw-away
    nodes, as for ``--pin-path``). ``none`` disables it.

    Raises:
        InputError: an explicit path whose directory does not exist and cannot be made.
    """
    value = getattr(args, "checkpoint_path", None)
    if value is not None:
        if value.lower() == "none":
            return None
        directory = os.path.dirname(os.path.abspath(value))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as err:
            raise InputError(f"cannot create directory {directory}: {err.strerror}",
                             source="--checkpoint-path") from None
        return str(value)
    if args.netns is not None or not os.path.isdir(os.path.dirname(DEFAULT_CHECKPOINT_PATH)):
        return None
    return DEFAULT_CHECKPOINT_PATH


def cleanup(args: argparse.Namespace) -> int:
    """``zonemeter agent --cleanup``: remove our tc filters (in ``--netns`` or the host
    namespace), the pins under the resolved ``--pin-path`` and the checkpoint at the
    resolved ``--checkpoint-path`` (the counters start from zero after a reinstall);
    print what was removed as one JSON line; exit 0.

    Raises:
        InputError: a malformed pin path, or one that is not on a BPF filesystem.
        RuntimeFailure: a filter or pin could not be removed, or an agent still runs on
            the pin path (it holds the pin lock).
    """
    from agent.datapath import Datapath

    if not args.node_name and args.pin_path is None and args.netns is None:
        raise InputError("required to find the default pin path (or give --pin-path)",
                         source="--node-name")
    if args.netns is not None and not os.path.exists(f"/run/netns/{args.netns}"):
        raise InputError(f"no network namespace /run/netns/{args.netns}", source="--netns")
    path, _ = pin_path_for(args)
    checkpoint = checkpoint_path_for(args)
    lock = _lock_for_cleanup(path)
    removed: list[str] = []
    try:
        res = Datapath.cleanup(path, args.netns)
        for name in (checkpoint, f"{checkpoint}.tmp") if checkpoint is not None else ():
            try:
                os.unlink(name)
                removed.append(name)
            except FileNotFoundError:
                pass
            except OSError as err:
                raise RuntimeFailure(f"cannot remove checkpoint {name}: {err.strerror}") from None
    finally:
        if lock is not None:
            os.close(lock)
    print(json.dumps({"msg": "cleanup done", "pin_path": path, "netns": args.netns,
                      "filters_removed": [f"{n}/{side}" for n, side in res.filters],
                      "pins_removed": list(res.pins), "checkpoint_removed": removed}))
    return 0


def _lock_for_cleanup(path: str | None) -> int | None:
    """Take the pin directory's lock (the one a running agent holds for its lifetime)
    without waiting, so ``--cleanup`` never removes the filters and pins of an agent that
    is still running: it would go on exporting as if attached while counting nothing.

    Returns:
        the locked fd (close it to release), or None when there is no pin directory.

    Raises:
        InputError: a malformed pin path.
        RuntimeFailure: an agent holds the lock.
    """
    from agent.datapath import check_pin_path, lock_pins

    if path is None:
        return None
    check_pin_path(path)
    if not os.path.isdir(path):
        return None
    try:
        return lock_pins(path, 0.0)
    except RuntimeFailure:
        raise RuntimeFailure(
            f"an agent is running on the pins in {path}: stop it before --cleanup (its "
            "filters and tables would vanish under it)") from None


def run(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM/SIGINT; returns 0 after the final export.

    Must run in the main thread (signal handlers).

    Raises:
        InputError: bad flags, snapshot, CIDR file, version or gates (exit 2).
        RuntimeFailure: the datapath cannot load, or the metrics address cannot be bound
            (exit 1).
    """
    if getattr(args, "cleanup", False):
        return cleanup(args)
    stopper = Stopper()
    try:
        return _run(args, stopper)
    finally:
        stopper.close()


def _run(args: argparse.Namespace, stop: Stopper) -> int:
    from agent.datapath import Datapath, DatapathConfig
    from agent.hints import KubeVersion, parse_feature_gates, parse_proxy_flag
    from agent.k8s.source import open_metadata

    _validate(args)
    gates = parse_feature_gates(args.feature_gates)
    proxy_version = parse_proxy_flag(args.kube_proxy_version)
    if args.kubernetes_version is not None:  # flag errors before any I/O
        KubeVersion.parse(args.kubernetes_version, gates)
    exclude = _patterns(args.exclude_interfaces, "--exclude-interfaces")
    include = _patterns(args.interface_patterns, "--interface-patterns")
    scope = _patterns(args.cgroup_scope_netns, "--cgroup-scope-netns")
    uplinks = _patterns(args.uplink_interfaces, "--uplink-interfaces")
    pin_path, explicit = pin_path_for(args)
    no_bpffs = False
    if pin_path is not None and not explicit:
        from agent.datapath import on_bpf_fs

        if not on_bpf_fs(pin_path):  # default only: an explicit path must be on bpffs
            no_bpffs, pin_path = True, None
    config = DatapathConfig(netns=args.netns, interface_patterns=include, exclude_patterns=exclude,
                            flow_capacity=args.flow_capacity, pin_path=pin_path, attach=args.attach,
                            hook=args.hook, scope_netns=scope, scope_cgroup=args.cgroup_scope_cgroup,
                            cgroup_root=args.cgroup_root,
                            uplink_patterns=uplinks, entry_hops=args.entry_hops == "on")
    config.validate()
    setup_logging(args.log_level)
    node = args.node_name

    source = open_metadata(snapshot=args.snapshot, kubeconfig=args.kubeconfig,
                           zone_cidrs=args.zone_cidrs,
                           pod_node=node if args.pod_scope == "node" else None,
                           pod_cidrs=parse_pod_cidrs(args.pod_cidrs))
    try:
        if args.snapshot is not None and source.cache.node(node) is None:
            raise InputError(f"node {node!r} is not in the snapshot", source=args.snapshot,
                             field="--node-name")
        require_pod_ranges(source.cache)  # a snapshot's Nodes are listed: before any attach
        version, version_source = model_version(args, source)
        hints = HintModel(source.cache, version, gates, kube_proxy_version=proxy_version,
                          version_source=version_source)
        log.info("hint model versions", extra={"fields": {
            "kubernetes_version": version, "source": version_source,
            "kube_proxy_version": proxy_version or "auto"}})
        exporter = ex.Exporter()
        checkpoint, restore = _open_checkpoint(args, source.cache, hints, exporter)
        attached = threading.Event()
        readiness = ex.make_readiness(attached.is_set, source.cache.synced)
        try:
            server = ex.start_server(exporter, args.metrics_address, readiness,
                                     flows_remote=args.flows_allow_remote)
        except OSError as err:
            raise RuntimeFailure(f"--metrics-address {args.metrics_address}: {err}") from None
        try:
            log.info("starting", extra={"fields": {
                "node": node, "metadata": source.origin, "netns": args.netns,
                "metrics": server.url, "interval_seconds": args.interval}})
            if no_bpffs:
                log.warning("no BPF filesystem at %s: flow tables are not pinned, what the "
                            "kernel counts after the last drain dies with the agent",
                            DEFAULT_PIN_ROOT)
            dp = Datapath(config)
            try:
                loop = AgentLoop(node, dp, source.cache, hints, exporter, interval=args.interval,
                                 hold_unresolved_seconds=args.hold_unresolved_seconds,
                                 series_retention=args.series_retention,
                                 checkpoint=checkpoint, restore=restore,
                                 locality_replicas=args.locality_replicas,
                                 agent_pod=agent_pod(args), heap=HeapFreezer())
                # Live cluster: attach only once the endpoints are known, else Service bytes
                # counted meanwhile would be classified as non-Service (and dropped as
                # client copies on the other side); attach anyway after the timeout.
                _wait_synced(source.cache, stop, args.sync_timeout_seconds)
                if stop.event.is_set():
                    # stopped before it attached, perhaps before its metadata was ever
                    # listed (a restart during an API outage): a drain now would attribute
                    # with an empty cache (every Service byte endpoint_without_service).
                    # Nothing of this agent is attached; pinned programs keep counting for
                    # the next agent, which drains with its metadata
                    log.info("stopped before attaching: nothing drained", extra={"fields": {
                        "signal": stop.signal, "pinned": pin_path is not None}})
                    dp.release()
                    return 0
                warn_unknown_node(source.cache, node)
                require_pod_ranges(source.cache)
                loop.sync_endpoints()
                dp.watch()
                attached.set()
                log.info("datapath attached", extra={"fields": {
                    "interfaces": list(dp.attached()), "attach_mode": dp.attach_mode,
                    "hook": dp.hook, "requested": config.hook, "why": dp.hook_reason}})
                poll = (source.poll_snapshot if source.snapshot_path is not None
                        else release_poll(source.cache))
                _serve(loop, stop, args.interval, poll)
                log.info("stopping", extra={"fields": {"signal": stop.signal,
                                                       "pinned": pin_path is not None}})
                attached.clear()
                if pin_path is None:
                    # Final: stop counting first (watcher stopped, filters removed), then
                    # drain what the tables hold, so every byte the kernel counted is
                    # exported.
                    dp.close()
                    res = loop.tick()
                else:
                    # Pinned: drain and export, then hand over: filters and pinned tables
                    # stay, the kernel keeps counting, the next agent drains the rest.
                    res = loop.tick()
                    dp.release()
                held = loop.flush_held()
                log.info("final export", extra={"fields": {
                    "deltas": res.deltas, "bytes": res.bytes, "held_bytes_released": held,
                    "linger_seconds": args.final_linger_seconds}})
            finally:
                dp.close()
            if args.final_linger_seconds > 0:
                time.sleep(args.final_linger_seconds)
        finally:
            server.close()
    finally:
        source.stop()
    log.info("stopped")
    return 0


def _open_checkpoint(args: argparse.Namespace, cache: ClusterMetadata, hints: HintModel,
                     exporter: Any) -> tuple[Checkpointer | None, Any]:
    """Open ``--checkpoint-path`` and read it; export the restored counters at once, so
    the first scrape of a restarted agent already sees them (never a reset).

    Returns:
        ``(Checkpointer or None, Checkpoint or None)`` for :class:`AgentLoop`.
    """
    from agent.attribution import Attributor
    from agent.datapath.abi import LAYOUT_VERSION
    from agent.k8s import MetadataAdapter
    from agent.loop import build_snapshot, restore_attributor
    from agent.records import CoverageState

    path = checkpoint_path_for(args)
    if path is None:
        return None, None
    checkpoint = Checkpointer(path, args.node_name, LAYOUT_VERSION)
    restore = checkpoint.load()
    # built as AgentLoop builds its own (expiry on: its counts are restored too)
    probe = Attributor(args.node_name, MetadataAdapter(cache), hints,
                       hold_unresolved_seconds=args.hold_unresolved_seconds,
                       series_retention=args.series_retention)
    restore_attributor(probe, checkpoint, restore)
    if restore is not None and sum(checkpoint.discarded.values()) > sum(restore.discarded.values()):
        restore = None  # its attribution state was malformed: discarded just now
    coverage = None
    if restore is not None and restore.coverage:  # the hook counters continue as well
        counted, carried, unseen = restore.coverage
        coverage = CoverageState(counted, carried, unseen)
    exporter.update(build_snapshot(probe.totals(), table=None, attached=0, synced=cache.synced(),
                                   duration=0.0, at=time.time(), interval=args.interval,
                                   checkpoint_discarded=checkpoint.discarded, coverage=coverage))
    log.info("checkpoint", extra={"fields": {
        "path": path, "restored": restore is not None,
        "seq": restore.seq if restore is not None else 0}})
    return checkpoint, restore


def model_version(args: argparse.Namespace, source: Any) -> tuple[str, str]:
    """The control-plane version for the hint model, and where it came from.

    ``--kubernetes-version`` wins; else the ``version.json`` beside ``--snapshot``, or the
    live API server's ``/version``; else :data:`agent.hints.DEFAULT_VERSION`. A reported
    version outside the covered range is logged once as a warning and the nearest covered
    version is used; an unreachable ``/version`` is logged and the default is used.

    Returns:
        ``("1.X", source)`` with source ``flag``, ``snapshot``, ``cluster`` or ``default``.

    Raises:
        InputError: a malformed ``version.json`` beside the snapshot.
    """
    from agent.hints.versions import choose_version
    from agent.k8s.version import server_version, snapshot_version

    reported: str | None = None
    kind = "cluster"
    if args.kubernetes_version is None:
        if args.snapshot is not None:
            reported, kind = snapshot_version(args.snapshot), "snapshot"
        elif getattr(source, "api", None) is not None:
            try:
                reported = server_version(source.api)
            except RuntimeFailure as err:
                log.warning("%s: the hint model assumes Kubernetes %s (give --kubernetes-version "
                            "to choose)", err, DEFAULT_VERSION)
    what = "the snapshot's version.json" if kind == "snapshot" else "the API server"
    version, src, note = choose_version(args.kubernetes_version, reported, kind, what)
    if note is not None:
        log.warning("%s", note)
    return version, src


def warn_unknown_node(cache: ClusterMetadata, node: str) -> bool:
    """Log a warning when the Nodes are listed and ``node`` is not among them (a
    ``--node-name`` that is the host name rather than ``spec.nodeName``): no endpoint would
    count as local, so Service traffic would be counted as workload traffic, and every
    zone of this node would be unknown, with nothing else saying why.

    Returns:
        True when the warning was logged.
    """
    if not cache.synced().get("nodes") or cache.node(node) is not None:
        return False
    log.warning("node %r is not among the cluster's Nodes: --node-name (NODE_NAME) must be "
                "the Node's name (spec.nodeName of its pods); until it appears, no endpoint "
                "counts as local and this node's zone is unknown", node,
                extra={"fields": {"node": node, "nodes": cache.counts()["nodes"]}})
    return True


def parse_pod_cidrs(text: str | None) -> tuple[IPNetwork, ...]:
    """``--pod-cidrs`` as networks (comma-separated, host bits must be zero).

    Raises:
        InputError: a value that is not a network (names it).
    """
    out: list[IPNetwork] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part))
        except ValueError as err:
            raise InputError(f"not a network: {err}", source="--pod-cidrs") from None
    return tuple(out)


def require_pod_ranges(cache: ClusterMetadata) -> None:
    """``--pod-scope node`` needs pod ranges once the Nodes are listed: without any, another
    node's pod would resolve as an external address and be counted in both directions here
    while its own node counts its egress (docs/metadata.md, "Pod scope").

    Raises:
        InputError: node scope, Nodes listed, no Node declares podCIDRs and no --pod-cidrs.
    """
    if not cache.synced().get("nodes"):
        return
    for problem in cache.pod_scope_problems():
        if problem.startswith("no pod range"):
            raise InputError(f"{problem}; give --pod-cidrs or use --pod-scope cluster",
                             source="--pod-scope node")


def _wait_synced(cache: ClusterMetadata, stop: Stopper, timeout: float) -> None:
    """Block until every metadata resource is synced, a stop signal, or ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not all(cache.synced().values()):
        if time.monotonic() >= deadline:
            stale = sorted(r for r, ok in cache.synced().items() if not ok)
            log.warning("metadata not synced, attaching anyway",
                        extra={"fields": {"unsynced": stale, "waited_seconds": timeout}})
            return
        if stop.wait(0.1):
            return


#: how often a ``--snapshot`` file (one stat() call) or the live cache's address releases
#: are checked between ticks, seconds
SNAPSHOT_POLL_SECONDS = 0.25


def release_poll(cache: ClusterMetadata) -> Callable[[Callable[[], object]], bool]:
    """Live cluster: a poll for :meth:`AgentLoop.poll_metadata` that runs a tick as soon as
    the watch reports a pod giving up an address (``ClusterMetadata.released``).

    The drain then happens while the old owner is the address's last tenant (grace
    cache), so its last bytes are its own unless a new pod takes the address within the
    poll period plus the watch latency; without it, every byte of the address drained at
    the next regular tick would go to a new owner that appeared meanwhile.
    """
    last = [cache.released()]

    def poll(before_apply: Callable[[], object]) -> bool:
        now = cache.released()
        if now == last[0]:
            return False
        last[0] = now
        before_apply()
        return True

    return poll


def _serve(loop: AgentLoop, stop: Stopper, interval: float,
           poll: Callable[[Callable[[], object]], bool] | None = None) -> None:
    """Tick at once, then every ``interval`` seconds (fixed schedule) until ``stop``.

    With ``poll`` (snapshot mode) the file is checked every :data:`SNAPSHOT_POLL_SECONDS`
    between ticks and a change is applied at once (:meth:`AgentLoop.poll_metadata`).
    """
    start = time.monotonic()
    n = 0
    while True:
        res = loop.tick()
        log.debug("interval", extra={"fields": {
            "deltas": res.deltas, "bytes": res.bytes, "services_evaluated": res.services_evaluated,
            "duration_seconds": round(res.duration_seconds, 6)}})
        if res.duration_seconds > interval:
            log.warning("interval work took longer than the interval",
                        extra={"fields": {"duration_seconds": res.duration_seconds}})
        n += 1
        next_at = start + n * interval
        now = time.monotonic()
        if next_at <= now:  # fell behind: skip the missed ticks, keep the phase
            n = int((now - start) // interval) + 1
            next_at = start + n * interval
        while True:
            left = next_at - time.monotonic()
            if poll is None:
                if stop.wait(left):
                    return
                break
            if stop.wait(min(left, SNAPSHOT_POLL_SECONDS)):
                return
            if time.monotonic() >= next_at:
                break
            try:
                loop.poll_metadata(poll)
            except Exception as err:  # noqa: BLE001 - keep serving with the old metadata
                loop.log_once("poll:" + type(err).__name__, "snapshot poll failed", exc=err)
