"""The lab: a multi-zone Kubernetes data path built from network namespaces.

``Lab(topology).up()`` builds, entirely inside namespaces it creates (names start with
``<prefix>-``; nothing is configured in the host namespace):

* ``<prefix>-fabric``: a bridge ``<prefix>br`` with one veth ``<prefix>f<i>`` per node:
  the switch between nodes (the underlay).
* ``<prefix>-node-<node>`` per node: the node's uplink ``<prefix>u<i>`` (the peer of
  ``<prefix>f<i>``, with the node address), routes to the other nodes' pod CIDRs (flat: via their node
  address; vxlan: through ``<prefix>x``, a VXLAN device over the uplink), the host side
  ``<prefix>p<j>`` of each pod's veth, the kube-proxy emulation (iptables, see
  :mod:`tools.lab.kubeproxy`) and the ground-truth tables of host-network pods.
* ``<prefix>-pod-<pod>`` per pod (not host-network): ``eth0`` with the pod address
  (/32, /128), default route via ``169.254.1.1``/``fe80::1`` bound to the host veth's MAC
  (the Calico pattern: no bridge, one route per pod on the node), a server process on
  every declared port and the ground-truth table (:mod:`tools.lab.groundtruth`).

Every lab link has TSO, GSO and GRO off and ``gso_max_segs`` 1, so that one skb is one
wire packet everywhere, including at the netfilter OUTPUT hook: since Linux 5.x TCP
always builds GSO packets (``sk_setup_caps`` forces ``NETIF_F_GSO``) and segments them
only at the device, so turning the device features off is not enough for a counter at
OUTPUT; ``gso_max_segs`` 1 limits TCP to one MSS per skb (``tcp_tso_segs``). The
ground-truth counters then count wire L3 bytes, and so do the agents' programs.

A state file ``<state_dir>/<prefix>.json`` records the resolved topology and the
endpoint overrides so that another process (``zonemeter lab status|traffic|down``) can
attach to a running lab with :meth:`Lab.attach`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import InputError, RuntimeFailure
from tools.lab import groundtruth
from tools.lab import snapshot as lab_snapshot
from tools.lab.flows import FlowHandle, FlowResult, FlowSpec, LabTraffic
from tools.lab.kube import KUBERNETES_MODES, PROXY_MODES, LabKubernetes
from tools.lab.netns import NODE_SYSCTLS, POD_SYSCTLS, disable_offloads, netns_mod, sysctl
from tools.lab.proc import (
    ROOT,
    ancestors,
    child_env,
    in_cgroup,
    is_lab_server,
    new_pod_cgroup,
    node_cgroup,
    nsexec,
    remove_pod_cgroups,
    run,
    terminate,
)
from tools.lab.proxy import LabProxy
from tools.lab.routes import IPAddress, LabAddressing
from tools.lab.state import DEFAULT_STATE_DIR, PREFIX, LabState, list_prefixes
from tools.lab.topology import Pod, Topology
from tools.lab.truth import LabGroundTruth

__all__ = ["DEFAULT_STATE_DIR", "FlowHandle", "FlowResult", "FlowSpec", "Lab", "list_prefixes"]


class Lab(LabKubernetes, LabAddressing, LabProxy, LabTraffic, LabGroundTruth, LabState):
    """A lab cluster on this machine (see the module docstring for the wiring).

    Args:
        topology: the validated topology.
        prefix: name prefix of every namespace and link (2-9 lowercase letters/digits,
            starting with a letter); default ``zm`` + 4 random hex digits.
        state_dir: where the state file goes.
        server_max_seconds: lifetime of the pod servers (seconds); they stop by themselves
            after it even if nobody calls :meth:`down`.
        kubernetes: ``"emulated"`` (our own picture of Kubernetes: a snapshot file, the
            kube-proxy emulation) or ``"real"`` (etcd, kube-apiserver, kube-controller-manager
            and kube-proxy, see :mod:`tools.lab.kube`).
        proxy_mode: the real kube-proxy's mode, ``"iptables"`` or ``"nftables"``.
        kube_version: the Kubernetes release of the real mode (default: the pinned one).

    Use as a context manager (``with Lab(topo) as lab:``) or call :meth:`up` and
    :meth:`down`. Every method that needs root raises :class:`RuntimeFailure` when a
    command fails.
    """

    def __init__(self, topology: Topology, prefix: str | None = None,
                 state_dir: Path | str = DEFAULT_STATE_DIR,
                 server_max_seconds: float = 3600.0, kubernetes: str = "emulated",
                 proxy_mode: str = "iptables", kube_version: str | None = None) -> None:
        if kubernetes not in KUBERNETES_MODES:
            raise InputError(f"must be one of {', '.join(KUBERNETES_MODES)}", obj="lab",
                             field=f"kubernetes {kubernetes!r}")
        if proxy_mode not in PROXY_MODES:
            raise InputError(f"must be one of {', '.join(PROXY_MODES)}", obj="lab",
                             field=f"kube-proxy mode {proxy_mode!r}")
        self.kubernetes = kubernetes
        self.proxy_mode = proxy_mode
        self.kube_version = kube_version
        self.relay_port = 0
        self.topology = topology
        self.prefix = prefix or f"zm{secrets.token_hex(2)}"
        if not PREFIX.match(self.prefix):
            raise InputError("must be 2-9 lowercase letters or digits starting with a letter",
                             obj="lab", field=f"prefix {self.prefix!r}")
        self.state_dir = Path(state_dir)
        self.server_max_seconds = server_max_seconds
        #: who built the lab, kept in its state file: ``"lab up"`` for ``zonemeter lab up``,
        #: ``"python"`` for the demo, tests and other callers of this class
        self.started_by = "python"
        #: (service key, node) -> endpoint strings (pod names or addresses); absent = default
        self._overrides: dict[tuple[str, str], tuple[str, ...]] = {}
        self._addr_owner = self._address_index()
        #: pod name -> server pid
        self._servers: dict[str, int] = {}
        #: the bypass data plane of the nodes with ``dataPlane: bypass`` (this process's)
        self.bypass: Any = None
        #: ground truth of counters folded away by remove_pod (see there)
        self._archived: dict[tuple[str, str, str], tuple[int, int]] = {}
        #: nft counter values at the last removal (gains since then are not archived yet)
        self._baseline: dict[tuple[IPAddress, str, str], tuple[int, int]] = {}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Lab:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Lab:
        """Build the lab; on any failure tear down what was built and re-raise.

        Returns:
            ``self``.

        Raises:
            RuntimeFailure: not root, the prefix is in use, or a kernel/command error.
        """
        if os.geteuid() != 0:
            raise RuntimeFailure("the lab needs root (network namespaces, iptables)")
        existing = set(netns_mod().listnetns())
        if any(n.startswith(self.prefix + "-") for n in existing):
            raise RuntimeFailure(f"lab prefix {self.prefix} is in use "
                                 f"(zonemeter lab down --prefix {self.prefix})")
        if self.kubernetes == "real":
            self.check_real_topology()
            self.control_plane()  # the binaries are built, or one line naming the build command
        self._write_state()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Tear the lab down (idempotent). Returns the namespaces removed."""
        if self.bypass is not None:
            self.bypass.close()
            self.bypass = None
        return Lab.down_prefix(self.prefix, self.state_dir)

    @staticmethod
    def down_prefix(prefix: str, state_dir: Path | str = DEFAULT_STATE_DIR) -> list[str]:
        """Remove everything of the lab ``prefix``: processes inside its namespaces, the
        namespaces (which removes their links, routes and rules), its pods' cgroups
        (tools/lab/proc.py) and its state file.

        Works on a half-built or crashed lab: it looks at the namespaces that exist, not
        at the state file. Never touches the host namespace or another prefix's
        namespaces. Processes are ended only when they run inside one of the prefix's
        namespaces, and never the calling process or its ancestors.

        Returns:
            Names of the namespaces removed (empty when nothing was left).

        Raises:
            InputError: ``prefix`` is not a valid lab prefix.
        """
        if not PREFIX.match(prefix):
            raise InputError("not a lab prefix", obj="lab", field=f"prefix {prefix!r}")
        netns = netns_mod()
        mine = sorted(n for n in netns.listnetns() if n.startswith(prefix + "-"))
        protected = ancestors()
        victims: set[int] = set()
        for name in mine:
            proc = run(["ip", "netns", "pids", name], check=False)
            victims.update(int(p) for p in proc.stdout.split() if p.isdigit())
        victims -= protected
        terminate(victims)
        remove_pod_cgroups(prefix)
        removed = []
        for name in mine:
            try:
                netns.remove(name)
                removed.append(name)
            except OSError:
                if name not in netns.listnetns():
                    removed.append(name)
        state = Path(state_dir) / f"{prefix}.json"
        state.unlink(missing_ok=True)
        LabKubernetes.remove_kube_dir(Path(state_dir), prefix)
        return removed

    @classmethod
    def attach(cls, prefix: str, state_dir: Path | str = DEFAULT_STATE_DIR) -> Lab:
        """Return a :class:`Lab` for a lab that another process built (from its state file).

        Raises:
            InputError: no state file for ``prefix``.
        """
        path = Path(state_dir) / f"{prefix}.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError("no running lab with this prefix", source=str(path),
                             field="prefix") from None
        lab = cls(Topology.from_dict(data["topology"], source=str(path)), prefix=prefix,
                  state_dir=state_dir, server_max_seconds=data.get("server_max_seconds", 3600),
                  kubernetes=data.get("kubernetes", "emulated"), proxy_mode=data.get("proxy_mode", "iptables"),
                  kube_version=data.get("kube_version"))
        lab.relay_port = int(data.get("relay_port", 0))
        for item in data.get("endpoint_overrides", []):
            lab._overrides[(item["service"], item["node"])] = tuple(item["endpoints"])
        lab._servers = {str(k): int(v) for k, v in data.get("servers", {}).items()}
        return lab

    # ------------------------------------------------------------------ building

    def _build(self) -> None:
        topo = self.topology
        netns = netns_mod()
        for name in self.all_netns():
            netns.create(name)
        # sysctls first: "default" values apply to links created afterwards
        for n in topo.nodes:
            sysctl(self.node_netns(n.name), NODE_SYSCTLS)
        for p in topo.pods:
            if not p.host_network:
                sysctl(self.pod_netns(p.name), POD_SYSCTLS)
        for o in topo.outside:
            sysctl(self.peer_netns(o.name), POD_SYSCTLS)
        self._build_fabric()
        for n in topo.nodes:
            self._build_node(n.name)
        for o in topo.outside:
            self._build_peer(o)
        for n in topo.nodes:
            node_cgroup(self.prefix, n.name, create=True)
        for p in topo.pods:
            if not p.host_network:
                self._build_pod(p)
                new_pod_cgroup(self.prefix, p.node, p.name)
        self._disable_all_offloads()
        self.program_all_nodes()
        for p in topo.pods:
            if p.ports:
                self._install_ground_truth(p)
        for o in topo.outside:
            if o.ports:
                self._install_peer_ground_truth(o)
            self._install_peer_client_truth(o)
        self._start_servers()
        self._start_peer_servers()
        if self.kubernetes == "real":
            self._build_kubernetes()
        bypass = [n.name for n in topo.nodes if n.data_plane == "bypass"]
        if bypass:
            from tools.lab.bypass import BypassDataPlane

            self.bypass = BypassDataPlane(self, nodes=bypass)
        self._write_state()  # with the server pids

    def _start_servers(self, pods: Iterable[Pod] | None = None) -> None:
        self._start_server_processes([(pod.name, self.pod_netns(pod.name), pod.ports)
                                      for pod in (self.topology.pods if pods is None else pods)])

    def _start_peer_servers(self) -> None:
        """Servers of the outside peers that declare ports (a database), keyed ``outside/<name>``."""
        self._start_server_processes([(o.key, self.peer_netns(o.name), o.ports)
                                      for o in self.topology.outside])

    def _start_server_processes(self, servers: Iterable[tuple[str, str, Any]]) -> None:
        procs: list[tuple[str, subprocess.Popen[str]]] = []
        for name, ns, ports in servers:
            if not ports:
                continue
            argv = ["ip", "netns", "exec", ns, sys.executable, "-m",
                    "tools.lab.traffic", "server", "--max-seconds", str(self.server_max_seconds)]
            for pp in ports:
                argv += ["--listen", f"{pp.protocol.lower()}:{pp.port}"]
            # `ip netns exec` execs the command: the pid is the server's
            procs.append((name, subprocess.Popen(
                in_cgroup(self.pod_cgroup(name), argv), stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                text=True, cwd=ROOT, env=child_env(), start_new_session=True)))
        for name, proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            proc.stdout.close()
            if line != "ready":
                raise RuntimeFailure(f"server of {name} did not start: {line or 'exited'}")
            self._servers[name] = proc.pid

    # ------------------------------------------------------------------ pods come and go

    def add_pod(self, spec: Mapping[str, Any]) -> Pod:
        """Create a pod in the running lab (as the topology's ``pods`` entries describe it)
        and start its server; Services whose selector matches it gain it as an endpoint
        (every node is reprogrammed; per-node overrides stay as they are).

        Returns:
            The new :class:`Pod` (addresses resolved; ``ip: auto`` takes the lowest free
            address of its node, which may be one a removed pod had).

        Raises:
            InputError: an invalid spec (named as ``Pod <name>``) or a duplicate name.
            RuntimeFailure: building it failed (what was built for it is removed).
        """
        data = self.topology.to_dict()
        data["pods"].append(dict(spec))
        topo = Topology.from_dict(data, source="add_pod")
        pod = topo.pods[-1]
        old = self.topology
        self.topology = topo
        self._addr_owner = self._address_index()
        try:
            if not pod.host_network:
                ns = self.pod_netns(pod.name)
                netns_mod().create(ns)
                sysctl(ns, POD_SYSCTLS)
                self._build_pod(pod)
                new_pod_cgroup(self.prefix, pod.node, pod.name)
                if not self.topology.options.offloads:
                    disable_offloads(ns, ["eth0"])
                    disable_offloads(self.node_netns(pod.node), [self.host_veth(pod.name)[1]])
            if pod.ports:
                self._install_ground_truth(pod)
                self._start_servers([pod])
            self.program_all_nodes()
            self._kube_add_pod(pod.name)
        except BaseException:
            self._remove_pod_runtime(pod)
            self.topology = old
            self._addr_owner = self._address_index()
            raise
        self._save_if_running()
        return pod

    def remove_pod(self, name: str) -> None:
        """Delete a pod from the running lab: its server, namespace (veth and route go with
        it) or, for a host-network pod, its server and counters in the node namespace.

        Its ground truth is kept: before deleting, what every counter of the lab gained since
        the last removal is folded into an archive (with the pod names addresses had at
        that time) and the counters' values become the new baseline (nothing is zeroed, so
        traffic running meanwhile loses no byte), so :meth:`ground_truth` stays correct
        when a later pod reuses the address. The pod is
        dropped from Services that list it and from per-node endpoint overrides.

        Raises:
            InputError: no such pod.
            RuntimeFailure: a command failed.
        """
        pod = self.topology.pod(name)
        # real mode: the object goes first and the real kube-proxies stop using the pod while it
        # still serves; its counters are read after that, so nothing it served is lost
        self._kube_remove_pod(pod.namespace, pod.name)
        raw = self._raw_counters()
        for key, (b, p) in self._since_baseline(raw).items():
            ob, op = self._archived.get(key, (0, 0))
            self._archived[key] = (ob + b, op + p)
        self._baseline = {k: v for k, v in raw.items() if k[1] != name}
        self._remove_pod_runtime(pod)
        data = self.topology.to_dict()
        data["pods"] = [p for p in data["pods"] if p["name"] != name]
        for svc in data["services"]:
            if "endpoints" in svc:
                svc["endpoints"] = [e for e in svc["endpoints"] if e != name]
        self.topology = Topology.from_dict(data, source="remove_pod")
        self._addr_owner = self._address_index()
        for override, eps in list(self._overrides.items()):
            self._overrides[override] = tuple(e for e in eps if e != name)
        self.program_all_nodes()
        self._save_if_running()

    def _remove_pod_runtime(self, pod: Pod) -> None:
        pid = self._servers.pop(pod.name, None)
        if pod.host_network:
            if pid is not None and is_lab_server(pid):
                terminate({pid})
            nsexec(self.node_netns(pod.node), ["nft", "delete", "table", "inet",
                                                 groundtruth.table_name(pod.index)], check=False)
            return
        ns = self.pod_netns(pod.name)
        if ns in netns_mod().listnetns():
            proc = run(["ip", "netns", "pids", ns], check=False)
            terminate({int(p) for p in proc.stdout.split() if p.isdigit()} - ancestors())
            netns_mod().remove(ns)
        remove_pod_cgroups(self.prefix, pod.name)

    # ------------------------------------------------------------------ snapshot

    def snapshot(self, hints: lab_snapshot.HintsFn | None = None) -> dict[str, Any]:
        """Return the lab's Nodes, Pods, Services and EndpointSlices as a kubectl-style
        ``List`` (see :mod:`tools.lab.snapshot`); ``hints(service)`` supplies EndpointSlice
        hints per endpoint pod. This is the emulated mode's picture; on real Kubernetes the
        apiserver's objects are :meth:`real_objects`."""
        return lab_snapshot.build(self.topology, hints)

    def write_snapshot(self, path: Path | str,
                       hints: lab_snapshot.HintsFn | None = None) -> Path:
        """Write :meth:`snapshot` as JSON to ``path`` (for ``zonemeter agent --snapshot``)."""
        return lab_snapshot.write(self.topology, path, hints)

    def zone_cidr_entries(self, mark_load_balancers: bool = True) -> list[dict[str, Any]]:
        """The ``--zone-cidrs`` entries of the topology's outside peers (docs/metadata.md, *Zone
        CIDR file*): one ``/32`` (``/128``) per address of every peer in a zone, with the zone's
        region; a load balancer's also ``kind: load-balancer`` and its ``type`` when
        ``mark_load_balancers`` (an agent whose parser knows the mark). External peers get
        none: their bytes are ``external``.

        Returns:
            ``[{"cidr", "zone"[, "region"][, "kind", "type"]}]`` in topology order.
        """
        region = {z.name: z.region for z in self.topology.zones}
        out: list[dict[str, Any]] = []
        for o in self.topology.outside:
            if o.zone is None:
                continue
            for a in (o.ip, o.ip6):
                if a is None:
                    continue
                e: dict[str, Any] = {"cidr": f"{a}/{a.max_prefixlen}", "zone": o.zone}
                if region.get(o.zone):
                    e["region"] = region[o.zone]
                if o.kind == "load-balancer" and mark_load_balancers:
                    e["kind"] = "load-balancer"
                    e["type"] = o.lb_type or "other"
                out.append(e)
        return out

    # ------------------------------------------------------------------ status

    def _status_endpoints(self, svc: Any, node: str,
                          programmed: Mapping[str, Mapping[tuple[str, str, int], list[str]]]) -> list[str]:
        """Endpoint pods of ``svc``'s first port that ``node``'s proxy uses: the real kube-proxy's
        rules where it runs, else the emulation's choice."""
        if node not in programmed:
            return list(self.service_endpoints(svc.key, node))
        sp = svc.ports[0]
        addrs = programmed[node].get((str(svc.cluster_ip), sp.protocol, sp.port), [])
        return [self.client_name(ipaddress.ip_address(a.rsplit(":", 1)[0].strip("[]"))) for a in addrs]

    def status(self) -> dict[str, Any]:
        """Return a JSON-able description: prefix, mode, namespaces present/missing,
        nodes with addresses, pods with addresses and veths, Services with ClusterIPs and
        the endpoints each node's proxy selects."""
        present = set(netns_mod().listnetns())
        topo = self.topology
        # in the real mode, what each kube-proxy programmed (read back from its rules)
        programmed = {n.name: self.programmed_endpoints(n.name) for n in topo.nodes
                      if self.uses_kube_proxy(n.name)}
        return {
            "prefix": self.prefix,
            "mode": topo.options.mode,
            "ipv6": topo.options.ipv6,
            "kubernetes": self.kubernetes_status(),
            "netns": {n: n in present for n in self.all_netns()},
            "nodes": [{"name": n.name, "zone": n.zone, "netns": self.node_netns(n.name),
                       "ip": str(n.ip), **({"ip6": str(n.ip6)} if n.ip6 else {}),
                       "podCIDR": str(n.pod_cidr), "ignoreHints": n.ignore_hints}
                      for n in topo.nodes],
            "pods": [{"name": p.name, "namespace": p.namespace, "node": p.node,
                      "netns": self.pod_netns(p.name), "ip": str(p.ip),
                      **({"ip6": str(p.ip6)} if p.ip6 else {}),
                      "hostVeth": None if p.host_network else self.host_veth(p.name)[1],
                      "ports": [f"{pp.port}/{pp.protocol}" for pp in p.ports]}
                     for p in topo.pods],
            "services": [{"service": s.key, "clusterIP": str(s.cluster_ip),
                          **({"clusterIP6": str(s.cluster_ip6)} if s.cluster_ip6 else {}),
                          "ports": [f"{sp.port}->{sp.target_port}/{sp.protocol}"
                                    for sp in s.ports],
                          "endpointsByNode": {n.name: self._status_endpoints(s, n.name, programmed)
                                              for n in topo.nodes}}
                         for s in topo.services],
        }
