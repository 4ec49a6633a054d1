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
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import InputError, RuntimeFailure
from tools.lab import groundtruth, kubeproxy
from tools.lab import snapshot as lab_snapshot
from tools.lab.topology import Node, Pod, Service, Topology, resolve_target_port

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: where lab state files live (one JSON per prefix)
DEFAULT_STATE_DIR = Path(os.environ.get("ZONEMETER_LAB_STATE", "/run/zonemeter/lab"))
#: repository root: traffic subprocesses import ``tools.lab.traffic`` from here
_ROOT = Path(__file__).resolve().parents[2]
_PREFIX = re.compile(r"^[a-z][a-z0-9]{1,8}$")
#: pod default gateways (bound to the host veth's MAC by a permanent neighbour entry)
GATEWAY4 = ipaddress.IPv4Address("169.254.1.1")
GATEWAY6 = ipaddress.IPv6Address("fe80::1")
#: IP + transport header bytes of one UDP datagram, per family
UDP_OVERHEAD = {4: 20 + 8, 6: 40 + 8}
_NUD_PERMANENT = 0x80
_RTNH_F_ONLINK = 4
_OFFLOADS = ("tso", "gso", "gro")
_NODE_SYSCTLS = ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                 "net.ipv4.conf.default.rp_filter=0", "net.ipv6.conf.all.forwarding=1",
                 "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
#: no DAD (addresses usable at once), no router solicitations (no stray packets on the
#: veth); the ephemeral range the topology keeps pod ports out of
_POD_SYSCTLS = ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
                "net.ipv6.conf.all.router_solicitations=0",
                "net.ipv6.conf.default.router_solicitations=0",
                "net.ipv4.ip_local_port_range=32768 60999")


@dataclass(frozen=True, slots=True)
class FlowResult:
    """Outcome of one :meth:`Lab.run_flow`.

    Attributes:
        client: client pod name.
        dst: destination address (pod IP or ClusterIP).
        port: destination port.
        proto: ``tcp`` or ``udp``.
        ok: exchanges completed (full response received).
        failed: exchanges that failed (refused, dropped, timed out).
        errors: up to five error texts.
        request_payload_bytes, response_payload_bytes: application bytes of completed
            exchanges (no headers).
        elapsed_seconds: wall time of the client.
    """

    client: str
    dst: str
    port: int
    proto: str
    ok: int
    failed: int
    errors: tuple[str, ...]
    request_payload_bytes: int
    response_payload_bytes: int
    elapsed_seconds: float


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """One entry of a traffic matrix for :meth:`Lab.run_flows` (fields as in
    :meth:`Lab.run_flow`; ``rate`` in exchanges per second)."""

    client: str
    dst: str
    port: int
    proto: str = "tcp"
    request_bytes: int = 100
    response_bytes: int = 100
    count: int = 1
    rate: float | None = None
    timeout: float = 5.0
    reuse: bool = False


class FlowHandle:
    """A running client started by :meth:`Lab.start_flow`; :meth:`wait` returns its result."""

    def __init__(self, proc: subprocess.Popen[str], client: str, dst: str, port: int,
                 proto: str, deadline_seconds: float) -> None:
        self._proc = proc
        self._args = (client, dst, port, proto)
        self._deadline = deadline_seconds

    @property
    def client(self) -> str:
        """The client pod's name."""
        return self._args[0]

    def done(self) -> bool:
        """True once the client process has exited (:meth:`wait` then returns at once)."""
        return self._proc.poll() is not None

    def stop(self) -> None:
        """End the client early (SIGTERM); :meth:`wait` then raises or reports what it
        completed. Ground truth stays exact: counters only see packets that were sent."""
        if self._proc.poll() is None:
            self._proc.terminate()

    def wait(self) -> FlowResult:
        """Wait for the client to finish and return its :class:`FlowResult`.

        Raises:
            RuntimeFailure: the client crashed or overran its time budget.
        """
        try:
            out, err = self._proc.communicate(timeout=self._deadline)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            raise RuntimeFailure(f"traffic client {self._args} overran {self._deadline:.0f}s")
        if self._proc.returncode != 0:
            raise RuntimeFailure(f"traffic client {self._args} failed: {err.strip()[-500:]}")
        data = json.loads(out.strip().splitlines()[-1])
        client, dst, port, proto = self._args
        return FlowResult(client=client, dst=dst, port=port, proto=proto, ok=data["ok"],
                          failed=data["failed"], errors=tuple(data["errors"]),
                          request_payload_bytes=data["request_payload_bytes"],
                          response_payload_bytes=data["response_payload_bytes"],
                          elapsed_seconds=data["elapsed_seconds"])


def _run(argv: Sequence[str], input: str | None = None, check: bool = True
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeFailure(f"{' '.join(argv[:6])} failed ({proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def _nsexec(ns: str, argv: Sequence[str], input: str | None = None, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", ns, *argv], input=input, check=check)


def _netns_mod() -> Any:
    from pyroute2 import netns
    return netns


def _open_ns(name: str) -> Any:
    from pyroute2 import NetNS
    return NetNS(name)


def list_prefixes(state_dir: Path | str = DEFAULT_STATE_DIR, include_orphans: bool = True
                  ) -> list[str]:
    """Return the prefixes of labs that have a state file in ``state_dir`` and, with
    ``include_orphans``, of every ``<prefix>-fabric`` namespace (any lab on the machine)."""
    found: set[str] = set()
    state_dir = Path(state_dir)
    if state_dir.is_dir():
        found.update(p.stem for p in state_dir.glob("*.json"))
    if not include_orphans:
        return sorted(found)
    for name in _netns_mod().listnetns():
        if name.endswith("-fabric") and _PREFIX.match(name[: -len("-fabric")]):
            found.add(name[: -len("-fabric")])
    return sorted(found)


class Lab:
    """A lab cluster on this machine (see the module docstring for the wiring).

    Args:
        topology: the validated topology.
        prefix: name prefix of every namespace and link (2-9 lowercase letters/digits,
            starting with a letter); default ``zm`` + 4 random hex digits.
        state_dir: where the state file goes.
        server_max_seconds: lifetime of the pod servers (seconds); they stop by themselves
            after it even if nobody calls :meth:`down`.

    Use as a context manager (``with Lab(topo) as lab:``) or call :meth:`up` and
    :meth:`down`. Every method that needs root raises :class:`RuntimeFailure` when a
    command fails.
    """

    def __init__(self, topology: Topology, prefix: str | None = None,
                 state_dir: Path | str = DEFAULT_STATE_DIR,
                 server_max_seconds: float = 3600.0) -> None:
        self.topology = topology
        self.prefix = prefix or f"zm{secrets.token_hex(2)}"
        if not _PREFIX.match(self.prefix):
            raise InputError("must be 2-9 lowercase letters or digits starting with a letter",
                             obj="lab", field=f"prefix {self.prefix!r}")
        self.state_dir = Path(state_dir)
        self.server_max_seconds = server_max_seconds
        #: (service key, node) -> endpoint strings (pod names or addresses); absent = default
        self._overrides: dict[tuple[str, str], tuple[str, ...]] = {}
        self._addr_owner = self._address_index()
        #: pod name -> server pid
        self._servers: dict[str, int] = {}
        #: ground truth of counters folded away by remove_pod (see there)
        self._archived: dict[tuple[str, str, str], tuple[int, int]] = {}
        #: nft counter values at the last removal (gains since then are not archived yet)
        self._baseline: dict[tuple[IPAddress, str, str], tuple[int, int]] = {}

    # ------------------------------------------------------------------ naming

    @property
    def fabric_netns(self) -> str:
        """Name of the fabric namespace (holds the bridge the node uplinks hang off)."""
        return f"{self.prefix}-fabric"

    def node_netns(self, node: str) -> str:
        """Return the network namespace name of ``node``.

        Raises:
            InputError: no such node.
        """
        return f"{self.prefix}-node-{self.topology.node(node).name}"

    def pod_netns(self, pod: str) -> str:
        """Return the network namespace a pod's processes run in (its node's namespace
        for a host-network pod).

        Raises:
            InputError: no such pod.
        """
        p = self.topology.pod(pod)
        return self.node_netns(p.node) if p.host_network else f"{self.prefix}-pod-{p.name}"

    def pod_ip(self, pod: str, family: int = 4) -> IPAddress:
        """Return the pod's address (``family`` 4 or 6); a host-network pod's is its node's.

        Raises:
            InputError: no such pod, or IPv6 in a lab without IPv6.
        """
        return self.topology.pod(pod).address(family)

    def node_ip(self, node: str, family: int = 4) -> IPAddress:
        """Return the node's fabric address (``family`` 4 or 6).

        Raises:
            InputError: no such node, or IPv6 in a lab without IPv6.
        """
        n = self.topology.node(node)
        if family == 6:
            if n.ip6 is None:
                raise InputError("the lab has no IPv6", obj=f"Node {node}", field="ip6")
            return n.ip6
        return n.ip

    def cluster_ip(self, service: str, family: int = 4) -> IPAddress:
        """Return the ClusterIP of ``service`` (``namespace/name`` or unambiguous name).

        Raises:
            InputError: no such Service, or IPv6 in a lab without IPv6.
        """
        s = self.topology.service(service)
        if family == 6:
            if s.cluster_ip6 is None:
                raise InputError("the lab has no IPv6", obj=f"Service {s.key}", field="clusterIP6")
            return s.cluster_ip6
        return s.cluster_ip

    def host_veth(self, pod: str) -> tuple[str, str]:
        """Return ``(node netns name, host-side veth name)`` of a pod.

        Raises:
            InputError: no such pod, or a host-network pod (it has no veth).
        """
        p = self.topology.pod(pod)
        if p.host_network:
            raise InputError("a hostNetwork pod has no veth", obj=f"Pod {pod}", field="hostNetwork")
        return self.node_netns(p.node), f"{self.prefix}p{p.index}"

    def uplink(self, node: str) -> tuple[str, str]:
        """Return ``(node netns name, uplink name)``: the node's link to the fabric."""
        n = self.topology.node(node)
        return self.node_netns(node), f"{self.prefix}u{n.index}"

    def vxlan_device(self, node: str) -> tuple[str, str] | None:
        """Return ``(node netns name, VXLAN device name)`` in vxlan mode, else ``None``."""
        if self.topology.options.mode != "vxlan":
            return None
        return self.node_netns(node), f"{self.prefix}x"

    def all_netns(self) -> list[str]:
        """Return every namespace name this lab creates (fabric, nodes, pods)."""
        names = [self.fabric_netns] + [self.node_netns(n.name) for n in self.topology.nodes]
        names += [self.pod_netns(p.name) for p in self.topology.pods if not p.host_network]
        return names

    @property
    def state_file(self) -> Path:
        """Path of this lab's state file."""
        return self.state_dir / f"{self.prefix}.json"

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Lab":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> "Lab":
        """Build the lab; on any failure tear down what was built and re-raise.

        Returns:
            ``self``.

        Raises:
            RuntimeFailure: not root, the prefix is in use, or a kernel/command error.
        """
        if os.geteuid() != 0:
            raise RuntimeFailure("the lab needs root (network namespaces, iptables)")
        existing = set(_netns_mod().listnetns())
        if any(n.startswith(self.prefix + "-") for n in existing):
            raise RuntimeFailure(f"lab prefix {self.prefix} is in use "
                                 f"(zonemeter lab down --prefix {self.prefix})")
        self._write_state()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Tear the lab down (idempotent). Returns the namespaces removed."""
        return Lab.down_prefix(self.prefix, self.state_dir)

    @staticmethod
    def down_prefix(prefix: str, state_dir: Path | str = DEFAULT_STATE_DIR) -> list[str]:
        """Remove everything of the lab ``prefix``: processes inside its namespaces, the
        namespaces (which removes their links, routes and rules) and its state file.

        Works on a half-built or crashed lab: it looks at the namespaces that exist, not
        at the state file. Never touches the host namespace or another prefix's
        namespaces. Processes are ended only when they run inside one of the prefix's
        namespaces, and never the calling process or its ancestors.

        Returns:
            Names of the namespaces removed (empty when nothing was left).

        Raises:
            InputError: ``prefix`` is not a valid lab prefix.
        """
        if not _PREFIX.match(prefix):
            raise InputError("not a lab prefix", obj="lab", field=f"prefix {prefix!r}")
        netns = _netns_mod()
        mine = sorted(n for n in netns.listnetns() if n.startswith(prefix + "-"))
        protected = _ancestors()
        victims: set[int] = set()
        for name in mine:
            proc = _run(["ip", "netns", "pids", name], check=False)
            victims.update(int(p) for p in proc.stdout.split() if p.isdigit())
        victims -= protected
        _terminate(victims)
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
        return removed

    @classmethod
    def attach(cls, prefix: str, state_dir: Path | str = DEFAULT_STATE_DIR) -> "Lab":
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
                  state_dir=state_dir, server_max_seconds=data.get("server_max_seconds", 3600))
        for item in data.get("endpoint_overrides", []):
            lab._overrides[(item["service"], item["node"])] = tuple(item["endpoints"])
        lab._servers = {str(k): int(v) for k, v in data.get("servers", {}).items()}
        return lab

    def _write_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "prefix": self.prefix,
            "server_max_seconds": self.server_max_seconds,
            "topology": self.topology.to_dict(),
            "servers": self._servers,
            "endpoint_overrides": [{"service": s, "node": n, "endpoints": list(e)}
                                   for (s, n), e in sorted(self._overrides.items())],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.state_file)

    # ------------------------------------------------------------------ building

    def _build(self) -> None:
        topo = self.topology
        opt = topo.options
        netns = _netns_mod()
        for name in self.all_netns():
            netns.create(name)
        # sysctls first: "default" values apply to links created afterwards
        for n in topo.nodes:
            _sysctl(self.node_netns(n.name), _NODE_SYSCTLS)
        for p in topo.pods:
            if not p.host_network:
                _sysctl(self.pod_netns(p.name), _POD_SYSCTLS)
        self._build_fabric()
        for n in topo.nodes:
            self._build_node(n.name)
        for p in topo.pods:
            if not p.host_network:
                self._build_pod(p)
        # offloads off on every lab link: one skb == one wire packet
        for n in topo.nodes:
            links = [self.uplink(n.name)[1]] + [self.host_veth(p.name)[1]
                                                for p in topo.pods_on(n.name)
                                                if not p.host_network]
            if opt.mode == "vxlan":
                links.append(f"{self.prefix}x")
            _disable_offloads(self.node_netns(n.name), links)
        _disable_offloads(self.fabric_netns, [f"{self.prefix}f{n.index}" for n in topo.nodes])
        for p in topo.pods:
            if not p.host_network:
                _disable_offloads(self.pod_netns(p.name), ["eth0"])
        self.program_all_nodes()
        for p in topo.pods:
            if p.ports:
                self._install_ground_truth(p)
        self._start_servers()
        self._write_state()  # with the server pids

    def _build_fabric(self) -> None:
        opt = self.topology.options
        ns = _open_ns(self.fabric_netns)
        try:
            br = f"{self.prefix}br"
            ns.link("add", ifname=br, kind="bridge")
            br_idx = ns.link_lookup(ifname=br)[0]
            ns.link("set", index=br_idx, mtu=opt.mtu, state="up")
            for n in self.topology.nodes:
                fab, up = f"{self.prefix}f{n.index}", f"{self.prefix}u{n.index}"
                ns.link("add", ifname=fab, kind="veth",
                        peer={"ifname": up, "net_ns_fd": self.node_netns(n.name)})
                idx = ns.link_lookup(ifname=fab)[0]
                ns.link("set", index=idx, mtu=opt.mtu, gso_max_segs=1, master=br_idx, state="up")
        finally:
            ns.close()

    def _build_node(self, name: str) -> None:
        topo = self.topology
        opt = topo.options
        node = topo.node(name)
        ns = _open_ns(self.node_netns(name))
        try:
            lo = ns.link_lookup(ifname="lo")[0]
            ns.link("set", index=lo, state="up")
            up = f"{self.prefix}u{node.index}"
            up_idx = ns.link_lookup(ifname=up)[0]
            ns.addr("add", index=up_idx, address=str(node.ip), prefixlen=opt.node_cidr.prefixlen)
            if node.ip6 is not None:
                ns.addr("add", index=up_idx, address=str(node.ip6),
                        prefixlen=opt.node_cidr_v6.prefixlen)
            ns.link("set", index=up_idx, mtu=opt.mtu, gso_max_segs=1, state="up")
            dev_idx = up_idx
            if opt.mode == "vxlan":
                vx = f"{self.prefix}x"
                ns.link("add", ifname=vx, kind="vxlan", vxlan_id=opt.vni, vxlan_link=up_idx,
                        vxlan_local=str(node.ip), vxlan_port=4789)
                dev_idx = ns.link_lookup(ifname=vx)[0]
                ns.link("set", index=dev_idx, mtu=opt.pod_mtu, gso_max_segs=1)
                assert node.overlay_ip is not None
                ns.addr("add", index=dev_idx, address=str(node.overlay_ip),
                        prefixlen=opt.overlay_cidr.prefixlen)
                if node.overlay_ip6 is not None:
                    ns.addr("add", index=dev_idx, address=str(node.overlay_ip6),
                            prefixlen=opt.overlay_cidr_v6.prefixlen)
                ns.link("set", index=dev_idx, state="up")
                for other in topo.nodes:
                    if other.name != name:
                        # flood (ARP/ND, unknown unicast) to every other node's VTEP
                        _nsexec(self.node_netns(name), [
                            "bridge", "fdb", "append", "00:00:00:00:00:00", "dev", vx,
                            "dst", str(other.ip)])
            for other in topo.nodes:
                if other.name == name:
                    continue
                via4 = other.overlay_ip if opt.mode == "vxlan" else other.ip
                ns.route("add", dst=str(other.pod_cidr), gateway=str(via4), oif=dev_idx)
                if other.pod_cidr_v6 is not None:
                    via6 = other.overlay_ip6 if opt.mode == "vxlan" else other.ip6
                    ns.route("add", dst=str(other.pod_cidr_v6), gateway=str(via6), oif=dev_idx)
            # host-network clients need a route to ClusterIPs for OUTPUT DNAT to happen
            ns.route("add", dst=str(opt.service_cidr), oif=up_idx, scope=253)
            if opt.ipv6:
                ns.route("add", dst=str(opt.service_cidr_v6), oif=up_idx)
        finally:
            ns.close()

    def _build_pod(self, pod: Pod) -> None:
        opt = self.topology.options
        node_ns_name, host = self.host_veth(pod.name)
        pod_ns_name = self.pod_netns(pod.name)
        nns = _open_ns(node_ns_name)
        try:
            nns.link("add", ifname=host, kind="veth",
                     peer={"ifname": "eth0", "net_ns_fd": pod_ns_name})
            h_idx = nns.link_lookup(ifname=host)[0]
            nns.link("set", index=h_idx, mtu=opt.pod_mtu, gso_max_segs=1, state="up")
            host_mac = nns.get_links(h_idx)[0].get_attr("IFLA_ADDRESS")
            nns.route("add", dst=f"{pod.ip}/32", oif=h_idx, scope=253)
            if pod.ip6 is not None:
                nns.route("add", dst=f"{pod.ip6}/128", oif=h_idx)
        finally:
            nns.close()
        pns = _open_ns(pod_ns_name)
        try:
            lo = pns.link_lookup(ifname="lo")[0]
            pns.link("set", index=lo, state="up")
            e_idx = pns.link_lookup(ifname="eth0")[0]
            pns.link("set", index=e_idx, mtu=opt.pod_mtu, gso_max_segs=1)
            pns.addr("add", index=e_idx, address=str(pod.ip), prefixlen=32)
            if pod.ip6 is not None:
                pns.addr("add", index=e_idx, address=str(pod.ip6), prefixlen=128)
            pns.link("set", index=e_idx, state="up")
            pns.neigh("add", dst=str(GATEWAY4), lladdr=host_mac, ifindex=e_idx,
                      state=_NUD_PERMANENT)
            pns.route("add", dst="0.0.0.0/0", gateway=str(GATEWAY4), oif=e_idx,
                      flags=_RTNH_F_ONLINK)
            if pod.ip6 is not None:
                pns.neigh("add", dst=str(GATEWAY6), lladdr=host_mac, ifindex=e_idx,
                          state=_NUD_PERMANENT)
                pns.route("add", dst="::/0", gateway=str(GATEWAY6), oif=e_idx)
            pod_mac = pns.get_links(e_idx)[0].get_attr("IFLA_ADDRESS")
        finally:
            pns.close()
        # static neighbours both ways: no ARP/ND between pod and node, so the veth carries
        # only the pods' own IP packets (interface counters can then check the ground truth)
        nns = _open_ns(node_ns_name)
        try:
            for addr in (pod.ip, pod.ip6):
                if addr is not None:
                    nns.neigh("add", dst=str(addr), lladdr=pod_mac, ifindex=h_idx,
                              state=_NUD_PERMANENT)
        finally:
            nns.close()

    def _install_ground_truth(self, pod: Pod) -> None:
        text = groundtruth.render(pod.index, [(pp.protocol, pp.port) for pp in pod.ports])
        _nsexec(self.pod_netns(pod.name), ["nft", "-f", "-"], input=text)

    def _start_servers(self, pods: Iterable[Pod] | None = None) -> None:
        procs: list[tuple[Pod, subprocess.Popen[str]]] = []
        for pod in self.topology.pods if pods is None else pods:
            if not pod.ports:
                continue
            argv = ["ip", "netns", "exec", self.pod_netns(pod.name), sys.executable, "-m",
                    "tools.lab.traffic", "server", "--max-seconds", str(self.server_max_seconds)]
            for pp in pod.ports:
                argv += ["--listen", f"{pp.protocol.lower()}:{pp.port}"]
            # `ip netns exec` execs the command: the pid is the server's
            procs.append((pod, subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                text=True, cwd=_ROOT, env=_child_env(), start_new_session=True)))
        for pod, proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            proc.stdout.close()
            if line != "ready":
                raise RuntimeFailure(f"server of pod {pod.name} did not start: {line or 'exited'}")
            self._servers[pod.name] = proc.pid

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
                _netns_mod().create(ns)
                _sysctl(ns, _POD_SYSCTLS)
                self._build_pod(pod)
                _disable_offloads(ns, ["eth0"])
                _disable_offloads(self.node_netns(pod.node), [self.host_veth(pod.name)[1]])
            if pod.ports:
                self._install_ground_truth(pod)
                self._start_servers([pod])
            self.program_all_nodes()
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
            if pid is not None and _is_lab_server(pid):
                _terminate({pid})
            _nsexec(self.node_netns(pod.node), ["nft", "delete", "table", "inet",
                                                 groundtruth.table_name(pod.index)], check=False)
            return
        ns = self.pod_netns(pod.name)
        if ns in _netns_mod().listnetns():
            proc = _run(["ip", "netns", "pids", ns], check=False)
            _terminate({int(p) for p in proc.stdout.split() if p.isdigit()} - _ancestors())
            _netns_mod().remove(ns)

    def _save_if_running(self) -> None:
        if self.state_file.exists():
            self._write_state()

    # ------------------------------------------------------------------ kube-proxy

    def default_endpoints(self, service: str, node: str) -> tuple[str, ...]:
        """Return the endpoint pods kube-proxy on ``node`` uses before any override: every
        endpoint, or only ``node``'s own under ``internalTrafficPolicy: Local``.

        Source: kube-proxy ``pkg/proxy/topology.go`` ``CategorizeEndpoints`` (without
        hints; the caller programs hint-filtered sets with :meth:`set_service_endpoints`).
        """
        svc = self.topology.service(service)
        if svc.internal_traffic_policy == "Local":
            return tuple(e for e in svc.endpoints if self.topology.pod(e).node == node)
        return svc.endpoints

    def service_endpoints(self, service: str, node: str) -> tuple[str, ...]:
        """Return the endpoints (pod names or addresses) ``node``'s proxy currently uses."""
        svc = self.topology.service(service)
        self.topology.node(node)
        return self._overrides.get((svc.key, node), self.default_endpoints(service, node))

    def set_service_endpoints(self, service: str, node: str,
                              endpoints: Iterable[str] | None) -> None:
        """Program what kube-proxy on ``node`` selects for ``service`` and apply it now.

        Args:
            service: ``namespace/name`` (or an unambiguous name).
            node: node name.
            endpoints: pod names or addresses (the target port comes from the Service;
                an address needs a numeric targetPort); ``[]`` makes the ClusterIP DROP
                (``internalTrafficPolicy: Local``) or REJECT (otherwise); ``None``
                restores :meth:`default_endpoints`.

        Raises:
            InputError: unknown Service, node or endpoint.
            RuntimeFailure: iptables-restore failed.
        """
        self.set_node_endpoints(node, {service: endpoints})

    def set_node_endpoints(self, node: str,
                           services: Mapping[str, Iterable[str] | None]) -> None:
        """Like :meth:`set_service_endpoints` for several Services of one node, applied in
        one iptables-restore per family."""
        self.topology.node(node)
        for service, endpoints in services.items():
            svc = self.topology.service(service)
            if endpoints is None:
                self._overrides.pop((svc.key, node), None)
                continue
            eps = tuple(str(e) for e in endpoints)
            for e in eps:
                self._endpoint_address(svc, e, 4)  # validates
            self._overrides[(svc.key, node)] = eps
        self.program_node(node)
        if self.state_file.exists():
            self._write_state()

    def proxy_rules(self, node: str) -> list[kubeproxy.ProxyRule]:
        """Return the ClusterIP rules ``node``'s proxy has (both families)."""
        rules: list[kubeproxy.ProxyRule] = []
        for svc in self.topology.services:
            chosen = self.service_endpoints(svc.key, node)
            for family, cip in ((4, svc.cluster_ip), (6, svc.cluster_ip6)):
                if cip is None:
                    continue
                for sp in svc.ports:
                    eps = []
                    for e in chosen:
                        resolved = self._endpoint_address(svc, e, family, sp)
                        if resolved is not None:
                            eps.append(resolved)
                    rules.append(kubeproxy.ProxyRule(
                        service=svc.key, port_name=sp.name or "", cluster_ip=cip, port=sp.port,
                        protocol=sp.protocol, endpoints=tuple(eps),
                        local_policy=svc.internal_traffic_policy == "Local"))
        return rules

    def program_proxies(self, select: Callable[[Service, Node], Iterable[str] | None]) -> None:
        """Program every node's proxy from a model of kube-proxy's endpoint selection.

        ``select(service, node)`` returns the endpoints kube-proxy on ``node`` would use
        (pod names or addresses; ``[]`` = none, so DROP or REJECT), or ``None`` for
        :meth:`default_endpoints`. A node with ``ignoreHints: true`` is not asked: it
        keeps the default, i.e. every endpoint (a data plane that ignores hints), still
        honouring ``internalTrafficPolicy: Local`` (kube-proxy ``CategorizeEndpoints``
        applies that policy before and independently of hints).
        """
        for node in self.topology.nodes:
            choice: dict[str, Iterable[str] | None] = {}
            for svc in self.topology.services:
                choice[svc.key] = None if node.ignore_hints else select(svc, node)
            self.set_node_endpoints(node.name, choice)

    def program_node(self, node: str) -> None:
        """(Re)write ``node``'s nat and filter tables from :meth:`proxy_rules`.

        Raises:
            RuntimeFailure: iptables-restore failed.
        """
        rules = self.proxy_rules(node)
        ns = self.node_netns(node)
        _nsexec(ns, ["iptables-restore", "-w"], input=kubeproxy.render(rules, 4))
        if self.topology.options.ipv6:
            _nsexec(ns, ["ip6tables-restore", "-w"], input=kubeproxy.render(rules, 6))

    def program_all_nodes(self) -> None:
        """Program every node's proxy (see :meth:`program_node`)."""
        for n in self.topology.nodes:
            self.program_node(n.name)

    def _endpoint_address(self, svc: Service, endpoint: str, family: int,
                          sp: Any = None) -> tuple[IPAddress, int] | None:
        sp = sp or svc.ports[0]
        try:
            addr = ipaddress.ip_address(endpoint)
        except ValueError:
            pod = self.topology.pod(endpoint)  # raises InputError naming the pod
            if pod.ip6 is None and family == 6:
                return None
            return pod.address(family), resolve_target_port(pod, sp)
        if isinstance(sp.target_port, str):
            raise InputError("an address endpoint needs a numeric targetPort",
                             obj=f"Service {svc.key}", field="ports.targetPort")
        if addr.version != family:
            return None
        return addr, sp.target_port

    # ------------------------------------------------------------------ traffic

    def start_flow(self, client_pod: str, dst_ip: str | IPAddress, port: int,
                   proto: str = "tcp", request_bytes: int = 100, response_bytes: int = 100,
                   count: int = 1, rate: float | None = None, timeout: float = 5.0,
                   reuse: bool = False) -> FlowHandle:
        """Start a client in ``client_pod``'s namespace; see :meth:`run_flow`."""
        pod = self.topology.pod(client_pod)
        try:
            dst = ipaddress.ip_address(str(dst_ip))
        except ValueError:
            raise InputError(f"not an IP address: {dst_ip!r}", obj="flow", field="dst_ip") from None
        if proto not in ("tcp", "udp"):
            raise InputError(f"must be tcp or udp, got {proto!r}", obj="flow", field="proto")
        if not 1 <= port <= 65535:
            raise InputError(f"must be 1-65535, got {port}", obj="flow", field="port")
        if request_bytes < 8 or response_bytes < 0 or count < 1:
            raise InputError("request_bytes >= 8, response_bytes >= 0 and count >= 1 required",
                             obj="flow", field="request_bytes")
        if proto == "udp":
            limit = self.topology.options.pod_mtu - UDP_OVERHEAD[dst.version]
            if max(request_bytes, response_bytes) > limit:
                raise InputError(f"UDP payload above {limit} bytes would be fragmented (the "
                                 "ground truth counts wire packets)", obj="flow",
                                 field="request_bytes/response_bytes")
        argv = ["ip", "netns", "exec", self.pod_netns(pod.name), sys.executable, "-m",
                "tools.lab.traffic", "client", "--proto", proto, "--dst", str(dst),
                "--port", str(port), "--request-bytes", str(request_bytes),
                "--response-bytes", str(response_bytes), "--count", str(count),
                "--timeout", str(timeout)]
        if rate:
            argv += ["--rate", str(rate)]
        if reuse:
            argv.append("--reuse")
        budget = timeout * 3 + (count / rate if rate else count * timeout) + 10
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, cwd=_ROOT, env=_child_env())
        return FlowHandle(proc, pod.name, str(dst), port, proto, budget)

    def run_flow(self, client_pod: str, dst_ip: str | IPAddress, port: int,
                 proto: str = "tcp", request_bytes: int = 100, response_bytes: int = 100,
                 count: int = 1, rate: float | None = None, timeout: float = 5.0,
                 reuse: bool = False) -> FlowResult:
        """Run ``count`` real request/response exchanges from inside ``client_pod``.

        Args:
            client_pod: client pod name (a host-network pod runs in its node's namespace).
            dst_ip: a pod IP, node IP or ClusterIP of this lab.
            port: destination port (Service port for a ClusterIP).
            proto: ``tcp`` or ``udp``.
            request_bytes: application bytes per request (>= 8).
            response_bytes: application bytes per response.
            count: exchanges (TCP: one connection each unless ``reuse``).
            rate: exchanges per second, or ``None`` for back to back.
            timeout: per-exchange timeout (seconds).
            reuse: TCP: one connection for all; UDP: one socket (one DNAT choice).

        Returns:
            :class:`FlowResult`. When it returns, every packet of the exchanges has
            passed the server's counters (TCP closes with SO_LINGER; UDP waits for each
            response), except exchanges that failed.

        Raises:
            InputError: unknown pod, bad address/port/size (UDP above the MTU).
            RuntimeFailure: the client process failed.
        """
        return self.start_flow(client_pod, dst_ip, port, proto, request_bytes, response_bytes,
                               count, rate, timeout, reuse).wait()

    def run_flows(self, flows: Iterable[FlowSpec]) -> list[FlowResult]:
        """Run several clients at the same time (a traffic matrix) and wait for all.

        Returns:
            One :class:`FlowResult` per spec, in order.

        Raises:
            InputError: a bad spec (nothing is started then).
            RuntimeFailure: a client process failed (the others are still waited for).
        """
        specs = list(flows)
        handles = []
        try:
            for f in specs:
                handles.append(self.start_flow(f.client, f.dst, f.port, f.proto, f.request_bytes,
                                               f.response_bytes, f.count, f.rate, f.timeout,
                                               f.reuse))
        except InputError:
            for h in handles:
                h.wait()
            raise
        results: list[FlowResult] = []
        failure: RuntimeFailure | None = None
        for h in handles:
            try:
                results.append(h.wait())
            except RuntimeFailure as err:
                failure = failure or err
        if failure:
            raise failure
        return results

    # ------------------------------------------------------------------ ground truth

    def _address_index(self) -> dict[IPAddress, str]:
        owner: dict[IPAddress, str] = {}
        topo = self.topology
        for n in topo.nodes:
            host_pods = [p.name for p in topo.pods_on(n.name) if p.host_network]
            name = host_pods[0] if len(host_pods) == 1 else f"node/{n.name}"
            for a in (n.ip, n.ip6, n.overlay_ip, n.overlay_ip6):
                if a is not None:
                    owner[a] = name
        for p in topo.pods:
            if not p.host_network:
                owner[p.ip] = p.name
                if p.ip6 is not None:
                    owner[p.ip6] = p.name
        return owner

    def client_name(self, address: IPAddress) -> str:
        """Return the pod owning ``address``; for node addresses the node's only
        host-network pod, else ``node/<name>``; for any other address ``ip/<address>``."""
        return self._addr_owner.get(address, f"ip/{address}")

    def ground_truth_counters(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Return ``{(client pod, server pod, "request"|"response"): (L3 bytes, packets)}``
        from the nftables counters in every server pod's namespace (IPv4 and IPv6 summed).

        Raises:
            RuntimeFailure: nft failed.
        """
        out: dict[tuple[str, str, str], tuple[int, int]] = dict(self._archived)
        for key, (b, p) in self._since_baseline(self._raw_counters()).items():
            ob, op = out.get(key, (0, 0))
            out[key] = (ob + b, op + p)
        return out

    def _raw_counters(self) -> dict[tuple[IPAddress, str, str], tuple[int, int]]:
        """``{(peer address, server pod, direction): (bytes, packets)}`` as nft has them."""
        out: dict[tuple[IPAddress, str, str], tuple[int, int]] = {}
        for pod in self.topology.pods:
            if not pod.ports:
                continue
            proc = _nsexec(self.pod_netns(pod.name),
                           ["nft", "-j", "list", "table", "inet", groundtruth.table_name(pod.index)])
            for (addr, direction), bp in groundtruth.parse(proc.stdout).items():
                out[(addr, pod.name, direction)] = bp
        return out

    def _since_baseline(self, raw: Mapping[tuple[IPAddress, str, str], tuple[int, int]]
                        ) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Counter gains since the last removal, keyed by the addresses' current owners."""
        out: dict[tuple[str, str, str], tuple[int, int]] = {}
        for (addr, server, direction), (b, p) in raw.items():
            bb, bp = self._baseline.get((addr, server, direction), (0, 0))
            if b - bb <= 0 and p - bp <= 0:
                continue
            key = (self.client_name(addr), server, direction)
            ob, op = out.get(key, (0, 0))
            out[key] = (ob + b - bb, op + p - bp)
        return out

    def ground_truth(self) -> dict[tuple[str, str, str], int]:
        """Return ``{(client pod, server pod, "request"|"response"): L3 bytes}``.

        L3 bytes: IP header included, every packet (TCP handshake, ACK, FIN; UDP header),
        counted in the server's namespace where addresses are the real ones (after DNAT).
        Pairs with no traffic are absent.

        Raises:
            RuntimeFailure: nft failed.
        """
        return {k: b for k, (b, _) in self.ground_truth_counters().items()}

    def reset_ground_truth(self) -> None:
        """Zero every ground-truth counter (and forget removed pods' archived counts).

        Raises:
            RuntimeFailure: nft failed.
        """
        self._archived.clear()
        self._baseline.clear()
        self._reset_counters()

    def _reset_counters(self) -> None:
        for pod in self.topology.pods:
            if pod.ports:
                _nsexec(self.pod_netns(pod.name), ["nft", "-f", "-"],
                        input=groundtruth.render_reset(pod.index))

    # ------------------------------------------------------------------ snapshot

    def snapshot(self, hints: lab_snapshot.HintsFn | None = None) -> dict[str, Any]:
        """Return the lab's Nodes, Pods, Services and EndpointSlices as a kubectl-style
        ``List`` (see :mod:`tools.lab.snapshot`); ``hints(service)`` supplies EndpointSlice
        hints per endpoint pod."""
        return lab_snapshot.build(self.topology, hints)

    def write_snapshot(self, path: Path | str,
                       hints: lab_snapshot.HintsFn | None = None) -> Path:
        """Write :meth:`snapshot` as JSON to ``path`` (for ``zonemeter agent --snapshot``)."""
        return lab_snapshot.write(self.topology, path, hints)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """Return a JSON-able description: prefix, mode, namespaces present/missing,
        nodes with addresses, pods with addresses and veths, Services with ClusterIPs and
        the endpoints each node's proxy selects."""
        present = set(_netns_mod().listnetns())
        topo = self.topology
        return {
            "prefix": self.prefix,
            "mode": topo.options.mode,
            "ipv6": topo.options.ipv6,
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
                          "endpointsByNode": {n.name: list(self.service_endpoints(s.key, n.name))
                                              for n in topo.nodes}}
                         for s in topo.services],
        }


# ---------------------------------------------------------------- helpers


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                      else "")
    return env


def _sysctl(ns: str, settings: Sequence[str]) -> None:
    """Apply ``key=value`` sysctls inside ``ns`` (writes /proc/sys there; no procps needed)."""
    script = "; ".join(
        f"printf '%s' '{value}' > /proc/sys/{key.replace('.', '/')}"
        for key, _, value in (item.partition("=") for item in settings))
    _nsexec(ns, ["sh", "-e", "-c", script])


def _disable_offloads(ns: str, links: Sequence[str]) -> None:
    script = "; ".join(f"ethtool -K {link} {' off '.join(_OFFLOADS)} off 2>/dev/null || true"
                       for link in links)
    _nsexec(ns, ["sh", "-c", script])
    # verify: a feature the driver refused to turn off would break the ground truth
    for link in links:
        out = _nsexec(ns, ["ethtool", "-k", link]).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("tcp-segmentation-offload", "generic-segmentation-offload",
                               "generic-receive-offload") and value.strip().startswith("on"):
                raise RuntimeFailure(f"cannot turn off {key.strip()} on {link} in {ns}")


def _ancestors() -> set[int]:
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    return pids


def _terminate(pids: set[int], grace: float = 2.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace
    alive = set(pids)
    while alive and time.monotonic() < end:
        for pid in list(alive):
            try:
                os.kill(pid, 0)
                # reap our own children so they do not linger as zombies
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                if _is_zombie(pid):
                    alive.discard(pid)
            except ProcessLookupError:
                alive.discard(pid)
        time.sleep(0.02)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _is_lab_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"tools.lab.traffic\0server" in fh.read()
    except OSError:
        return False


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
