"""The lab on real Kubernetes: control plane, API objects and the real kube-proxy of every node.

With ``kubernetes="real"`` (``zonemeter lab up --kubernetes real``) the lab adds, on top of its
namespaces and links (docs/lab.md):

* ``<prefix>-cp``: the control-plane namespace, on the lab's fabric like a node (veth
  ``<prefix>fc`` on the bridge, ``<prefix>uc`` inside with the last host address of
  ``options.node_cidr``), running etcd, kube-apiserver and kube-controller-manager
  (:class:`tools.kube.controlplane.ControlPlane`, ``--service-cluster-ip-range`` =
  ``options.service_cidr`` [+ ``service_cidr_v6``]) and a relay that lets host-namespace
  clients reach the apiserver on ``127.0.0.1`` (:mod:`tools.kube.relay`).
* API objects the lab writes as a kubelet and a user would: Namespaces; Nodes (zone/region
  labels, ``podCIDR(s)``, then status through the ``status`` subresource: allocatable CPU,
  InternalIP addresses, Ready, ``nodeInfo.kubeletVersion``); Services (the lab's ClusterIPs,
  annotations, ``trafficDistribution``, ``internalTrafficPolicy``); Pods bound to their nodes
  (``spec.nodeName``) with status through the ``status`` subresource (``podIP(s)``,
  ``hostIP``, Ready), as kwok plays the kubelet. The EndpointSlices, and their hints, are
  written by the real EndpointSlice controller: the lab never writes one.
* The real kube-proxy in each node namespace (``--hostname-override`` = the node's name,
  ``--cluster-cidr`` = ``options.pod_cidr`` [+ v6], iptables or nftables mode), watching
  the apiserver as ``system:kube-proxy``. A node with ``ignoreHints: true`` runs the lab's own
  emulation instead (:mod:`tools.lab.kubeproxy`: every endpoint, hints ignored).
* The agents' RBAC from ``deploy/daemonset/agent`` applied with the release's ``kubectl apply
  -k``, and ``agent.kubeconfig`` holding a token of its ServiceAccount (TokenRequest).

Files (certificates, kubeconfigs, logs, etcd data) live in ``<state_dir>/<prefix>-kube/``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.errors import InputError, RuntimeFailure
from tools.lab import snapshot as lab_snapshot
from tools.lab.netns import LabNamespaces, open_ns
from tools.lab.proc import ROOT, child_env, nsexec

#: ``kubernetes`` choices of a lab: our own picture of Kubernetes, or the real components
KUBERNETES_MODES = ("emulated", "real")
#: kube-proxy modes the real kube-proxy runs in (``--proxy-mode``)
PROXY_MODES = ("iptables", "nftables")
#: the agents' ServiceAccount in deploy/daemonset/agent (serviceaccount.yaml)
AGENT_NAMESPACE = "zonemeter"
AGENT_ACCOUNT = "zonemeter-agent"
DEPLOY_AGENT = ROOT / "deploy" / "daemonset" / "agent"
FIELD_MANAGER = "zonemeter-lab"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    """An object of :mod:`tools.lab.snapshot` as a client creates it: no uid, timestamps, status."""
    obj = json.loads(json.dumps(obj))
    for k in ("uid", "creationTimestamp", "resourceVersion"):
        obj["metadata"].pop(k, None)
    obj.pop("status", None)
    return obj


def _status_only(obj: dict[str, Any]) -> dict[str, Any]:
    """apiVersion, kind, name (namespace) and status of an object: a status apply."""
    meta = {"name": obj["metadata"]["name"]}
    if "namespace" in obj["metadata"]:
        meta["namespace"] = obj["metadata"]["namespace"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta, "status": obj["status"]}


class LabKubernetes(LabNamespaces):
    """The real control plane and kube-proxies of a lab (part of :class:`tools.lab.Lab`).

    Attributes set by ``Lab.__init__``: ``kubernetes`` (one of :data:`KUBERNETES_MODES`),
    ``proxy_mode`` (one of :data:`PROXY_MODES`), ``kube_version`` (``None``: the pinned one).
    """

    proxy_mode: str
    kube_version: str | None
    #: 127.0.0.1 port of the relay to the apiserver (0 until started)
    relay_port: int

    # ------------------------------------------------------------------ naming

    @property
    def kube_netns(self) -> str:
        """Name of the control-plane namespace (real mode)."""
        return f"{self.prefix}-cp"

    @property
    def kube_address(self) -> ipaddress.IPv4Address:
        """The apiserver's address on the fabric: the last host address of ``options.node_cidr``."""
        return self.topology.options.node_cidr.broadcast_address - 1

    @property
    def kube_dir(self) -> Path:
        """Certificates, kubeconfigs, logs and etcd data of the real mode."""
        return self.state_dir / f"{self.prefix}-kube"

    @property
    def admin_kubeconfig(self) -> Path:
        """Admin kubeconfig usable from the host namespace (through the relay)."""
        return self.kube_dir / "admin.kubeconfig"

    @property
    def agent_kubeconfig(self) -> Path:
        """Kubeconfig with the agents' ServiceAccount token, usable from the host namespace."""
        return self.kube_dir / "agent.kubeconfig"

    def uses_kube_proxy(self, node: str) -> bool:
        """Whether ``node`` runs the real kube-proxy (real mode, not ``ignoreHints``)."""
        return self.kubernetes == "real" and not self.topology.node(node).ignore_hints

    def control_plane(self) -> Any:
        """The :class:`tools.kube.controlplane.ControlPlane` of this lab (not started by this
        call; its :meth:`kubectl` works while the lab runs).

        Raises:
            InputError: the lab runs the emulated mode.
            RuntimeFailure: the Kubernetes binaries are not built.
        """
        from tools.kube.controlplane import Binaries, ControlPlane, ControlPlaneError

        if self.kubernetes != "real":
            raise InputError("the lab runs emulated Kubernetes (lab up --kubernetes real)",
                             obj=f"lab {self.prefix}", field="kubernetes")
        try:
            binaries = Binaries.find(self.kube_version)
        except ControlPlaneError as e:
            raise RuntimeFailure(str(e)) from None
        opt = self.topology.options
        cidr = str(opt.service_cidr) + (f",{opt.service_cidr_v6}" if opt.ipv6 else "")
        return ControlPlane(self.kube_netns, str(self.kube_address), cidr, self.kube_dir / "cp",
                            binaries=binaries)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the release's kubectl as the lab's admin (inside the control-plane namespace).

        Raises:
            RuntimeFailure: kubectl failed and ``check`` is set (with its stderr).
        """
        from tools.kube.controlplane import ControlPlaneError

        try:
            return self.control_plane().kubectl(*args, input=input, check=check)  # type: ignore[no-any-return]
        except ControlPlaneError as e:
            raise RuntimeFailure(str(e)) from None

    def stop_apiserver(self) -> None:
        """Stop the lab's kube-apiserver (SIGTERM; etcd and the controller manager run on):
        every watch of the agents and kube-proxies breaks and new requests are refused.

        Raises:
            InputError: the lab runs the emulated mode.
            RuntimeFailure: the apiserver was not started by this lab's state directory.
        """
        from tools.kube.controlplane import ControlPlaneError

        try:
            self.control_plane().stop_component("kube-apiserver")
        except ControlPlaneError as e:
            raise RuntimeFailure(str(e)) from None

    def start_apiserver(self, timeout_s: float = 180.0) -> None:
        """Start the stopped kube-apiserver again with the same flags; returns once ``/readyz``
        answers (its watch cache is built anew from etcd).

        Raises:
            InputError: the lab runs the emulated mode.
            RuntimeFailure: it exited or was not ready within ``timeout_s`` seconds.
        """
        from tools.kube.controlplane import ControlPlaneError

        try:
            self.control_plane().start_component("kube-apiserver", timeout_s)
        except ControlPlaneError as e:
            raise RuntimeFailure(str(e)) from None

    def hold_relay(self, held: bool) -> None:
        """Freeze (``SIGSTOP``) or thaw (``SIGCONT``) the relay host-namespace clients reach the
        apiserver through: a partition between the agents and the apiserver that leaves kubectl
        (:meth:`kubectl`, inside the control-plane namespace) and the kube-proxies (their node
        namespaces, straight to the apiserver) working. Frozen, the agents' open watches carry
        nothing and new connections hang; thawed, whatever the apiserver closed meanwhile closes.

        Raises:
            RuntimeFailure: the relay is not running (no ``relay.pid``, or no such process).
        """
        import os
        import signal

        try:
            pid = int((self.kube_dir / "relay.pid").read_text())
            os.kill(pid, signal.SIGSTOP if held else signal.SIGCONT)
        except (OSError, ValueError) as e:
            raise RuntimeFailure(f"relay of lab {self.prefix}: {e}") from None

    def compact_etcd(self) -> int:
        """Compact the lab's etcd up to a fresh write (:meth:`ControlPlane.compact_etcd`).

        Returns:
            The revision compacted to.

        Raises:
            InputError: the lab runs the emulated mode.
            RuntimeFailure: etcd did not answer.
        """
        from tools.kube.controlplane import ControlPlaneError

        try:
            return int(self.control_plane().compact_etcd())
        except ControlPlaneError as e:
            raise RuntimeFailure(str(e)) from None

    # ------------------------------------------------------------------ building

    def _build_kubernetes(self) -> None:
        """Start the control plane, write the API objects, start the kube-proxies (real mode)."""
        from tools.kube.controlplane import ControlPlaneError

        self.kube_dir.mkdir(parents=True, exist_ok=True)
        self._link_control_plane()
        cp = self.control_plane()
        try:
            cp.start()
        except ControlPlaneError as e:
            raise RuntimeFailure(str(e)) from None
        cp.detach()  # they run on after lab up exits; lab down ends them with their namespace
        self._start_relay()
        cp.client_kubeconfig(self.admin_kubeconfig, "admin", self.relay_url)
        self._register_objects()
        self._apply_agent_rbac(cp)
        self.wait_for_slices()
        self._start_kube_proxies(cp)

    @property
    def relay_url(self) -> str:
        """``https://127.0.0.1:<relay port>``: the apiserver as the host namespace reaches it."""
        return f"https://127.0.0.1:{self.relay_port}"

    def _link_control_plane(self) -> None:
        opt = self.topology.options
        fab = open_ns(self.fabric_netns)
        try:
            br = fab.link_lookup(ifname=f"{self.prefix}br")[0]
            outer, inner = f"{self.prefix}fc", f"{self.prefix}uc"
            fab.link("add", ifname=outer, kind="veth", peer={"ifname": inner, "net_ns_fd": self.kube_netns})
            idx = fab.link_lookup(ifname=outer)[0]
            fab.link("set", index=idx, mtu=opt.mtu, master=br, state="up")
        finally:
            fab.close()
        ns = open_ns(self.kube_netns)
        try:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            idx = ns.link_lookup(ifname=inner)[0]
            ns.addr("add", index=idx, address=str(self.kube_address), prefixlen=opt.node_cidr.prefixlen)
            ns.link("set", index=idx, mtu=opt.mtu, state="up")
        finally:
            ns.close()

    def _start_relay(self) -> None:
        from tools.kube.controlplane import APISERVER_PORT

        log = open(self.kube_dir / "relay.log", "ab")  # noqa: SIM115 - the child's from here on
        try:
            p = subprocess.Popen([sys.executable, "-m", "tools.kube.relay", "--netns", self.kube_netns,
                                  "--to", f"{self.kube_address}:{APISERVER_PORT}"],
                                 stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                 cwd=ROOT, env=child_env(), start_new_session=True)
        finally:
            log.close()
        (self.kube_dir / "relay.pid").write_text(f"{p.pid}\n")
        assert p.stdout is not None
        line = p.stdout.readline().split()
        p.stdout.close()
        if len(line) != 2 or line[0] != "port":
            raise RuntimeFailure(f"relay to the apiserver did not start (see {self.kube_dir / 'relay.log'})")
        self.relay_port = int(line[1])

    def _apply(self, objs: list[dict[str, Any]], *flags: str) -> None:
        if objs:
            self.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts",
                         *flags, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))

    def _register_objects(self) -> None:
        """Namespaces, Nodes (+status), Services, Pods (+status), as a kubelet and a user would."""
        topo = self.topology
        version = self.control_plane().binaries.kube_version
        namespaces = sorted({p.namespace for p in topo.pods} | {s.namespace for s in topo.services})
        self._apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces])
        built = lab_snapshot.build(topo)["items"]
        nodes = [o for o in built if o["kind"] == "Node"]
        now = _now()
        for o in nodes:
            st = o["status"]
            st["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                 "message": "zonemeter lab", "lastHeartbeatTime": now, "lastTransitionTime": now}]
            # what a kubelet of the control plane's release reports (kubeProxyVersion: KEP-4004)
            st["nodeInfo"] = {"kubeletVersion": version, "kubeProxyVersion": "", "operatingSystem": "linux",
                              "architecture": "amd64", "containerRuntimeVersion": "zonemeter-lab://1",
                              "kernelVersion": "", "osImage": "zonemeter lab", "machineID": "",
                              "systemUUID": "", "bootID": ""}
        self._apply([_strip(o) for o in nodes])
        # a JSON merge patch per Node, as a kubelet's status update replaces the lists: server-side
        # apply keys status.addresses by type and refuses a dual-stack node's two InternalIPs
        # ("duplicate entries for key [type=\"InternalIP\"]")
        for o in nodes:
            self.kubectl("patch", "node", o["metadata"]["name"], "--subresource=status", "--type=merge",
                         "-p", json.dumps({"status": o["status"]}))
        self._apply([_strip(o) for o in built if o["kind"] == "Service"])
        self._wait_service_accounts(namespaces)
        self._register_pods([o for o in built if o["kind"] == "Pod"])

    def _register_pods(self, pods: list[dict[str, Any]]) -> None:
        """Create Pods bound to their nodes, then report them running and Ready through the
        status subresource, as their kubelet would."""
        now = _now()
        for o in pods:
            o["status"]["startTime"] = now
            o["status"]["conditions"] = [{"type": t, "status": "True", "lastTransitionTime": now}
                                         for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
            o["status"]["containerStatuses"] = [{
                "name": "main", "image": "zonemeter-lab/traffic", "imageID": "", "ready": True,
                "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}]
        self._apply([_strip(o) for o in pods])
        self._apply([_status_only(o) for o in pods], "--subresource=status")

    def _kube_add_pod(self, name: str) -> None:
        """Register a pod the lab just built (real mode; nothing otherwise)."""
        if self.kubernetes != "real":
            return
        built = lab_snapshot.build(self.topology)["items"]
        self._register_pods([o for o in built if o["kind"] == "Pod" and o["metadata"]["name"] == name])

    def _kube_remove_pod(self, namespace: str, name: str, timeout_s: float = 30.0, grace_s: float = 0.5) -> None:
        """Delete a pod's object (real mode) and wait until no real kube-proxy forwards to it any
        more, before the caller removes the pod itself: what graceful termination gives a real
        pod (its endpoints go while it still serves). There is no kubelet to confirm the kill,
        so ``--grace-period=0 --force`` removes the object without a terminating phase; the
        ``grace_s`` seconds after the last kube-proxy dropped it stand in for the grace period.

        Raises:
            RuntimeFailure: kubectl failed, or a kube-proxy still uses the pod after ``timeout_s``.
        """
        if self.kubernetes != "real":
            return
        pod = self.topology.pod(name)
        self.kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
        addrs = {str(a) for a in (pod.ip, pod.ip6) if a is not None}
        deadline = time.monotonic() + timeout_s
        for node in self.topology.nodes:
            if not self.uses_kube_proxy(node.name):
                continue
            while any(e.rsplit(":", 1)[0].strip("[]") in addrs
                      for eps in self.programmed_endpoints(node.name).values() for e in eps):
                if time.monotonic() > deadline:
                    raise RuntimeFailure(f"kube-proxy of node {node.name} still forwards to deleted Pod "
                                         f"{namespace}/{name} after {timeout_s:.0f} s")
                time.sleep(0.2)
        # connections kube-proxy sent there before it dropped the endpoint finish (conntrack
        # keeps their DNAT), as within a real pod's termination grace period
        time.sleep(grace_s)

    def check_real_topology(self) -> None:
        """What the real mode cannot run, refused before anything is built.

        Raises:
            InputError: a Service lists its ``endpoints`` instead of a selector (the real
                EndpointSlice controller writes slices only for Services with a selector);
                a node has ``dataPlane: bypass`` (its socket-LB follows the emulation).
        """
        for n in self.topology.nodes:
            if n.data_plane != "kube-proxy":
                raise InputError("the bypass data plane follows the kube-proxy emulation, not the "
                                 "real kube-proxy (use --kubernetes emulated)",
                                 obj=f"Node {n.name}", field="dataPlane")
        for s in self.topology.services:
            if s.selector is None:
                raise InputError("the real EndpointSlice controller serves only Services with a selector; "
                                 "give selector instead of endpoints (or use --kubernetes emulated)",
                                 obj=f"Service {s.key}", field="endpoints")

    def real_objects(self) -> dict[str, Any]:
        """The apiserver's Nodes, Services, EndpointSlices and Pods as one ``List``
        (``kubectl get nodes,services,endpointslices,pods -A -o json``)."""
        return json.loads(self.kubectl("get", "nodes,services,endpointslices,pods", "-A", "-o", "json").stdout)  # type: ignore[no-any-return]

    def _wait_service_accounts(self, namespaces: list[str], timeout_s: float = 60.0) -> None:
        """The ServiceAccount admission plugin refuses Pods until the serviceaccount controller
        made the namespace's ``default`` account."""
        deadline = time.monotonic() + timeout_s
        for ns in namespaces:
            while self.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeFailure(f"namespace {ns}: no default ServiceAccount after {timeout_s:.0f} s "
                                         "(kube-controller-manager's serviceaccount controller)")
                time.sleep(0.3)

    def _apply_agent_rbac(self, cp: Any) -> None:
        """deploy/daemonset/agent with ``kubectl apply -k`` (its DaemonSet never runs: no kubelet),
        and the agents' kubeconfig with a token of its ServiceAccount."""
        self.kubectl("apply", "-k", str(DEPLOY_AGENT))
        cp.token_kubeconfig(self.agent_kubeconfig, AGENT_NAMESPACE, AGENT_ACCOUNT, server=self.relay_url)

    def node_port(self, service: str, port: int | None = None) -> int:
        """The node port of a ``NodePort`` Service's port (``port``: its Service port number;
        default the first): the topology's ``nodePort``, else the one the real apiserver
        allocated (``spec.ports[].nodePort``).

        Raises:
            InputError: no such Service or port, not a NodePort Service, or no node port in the
                emulated mode (the emulation allocates none).
        """
        svc = self.topology.service(service)
        if svc.type != "NodePort":
            raise InputError("not a NodePort Service", obj=f"Service {svc.key}", field="type")
        sp = next((p for p in svc.ports if port is None or p.port == port), None)
        if sp is None:
            raise InputError(f"no port {port}", obj=f"Service {svc.key}", field="ports")
        if sp.node_port is not None:
            return sp.node_port
        if self.kubernetes != "real":
            raise InputError("no nodePort given, and the emulated mode allocates none",
                             obj=f"Service {svc.key}", field="ports.nodePort")
        real = json.loads(self.kubectl("get", "service", svc.name, "-n", svc.namespace, "-o", "json").stdout)
        return int(next(p["nodePort"] for p in real["spec"]["ports"]
                        if p["port"] == sp.port and p.get("protocol", "TCP") == sp.protocol))

    def real_slices(self) -> list[dict[str, Any]]:
        """Every EndpointSlice on the apiserver (``kubectl get endpointslices -A -o json`` items)."""
        return list(json.loads(self.kubectl("get", "endpointslices", "-A", "-o", "json").stdout)["items"])

    def wait_for_slices(self, timeout_s: float = 60.0) -> None:
        """Until the EndpointSlice controller lists every lab endpoint of every Service as ready
        (and no other).

        Raises:
            RuntimeFailure: not within ``timeout_s`` (names the Services and their counts).
        """
        want = {}
        for s in self.topology.services:
            # a headless Service has no ClusterIP but the lab's families (PreferDualStack)
            families = 2 if s.cluster_ip6 is not None or (s.headless and self.topology.options.ipv6) else 1
            want[(s.namespace, s.name)] = sum(1 + (self.topology.pod(e).ip6 is not None and families == 2)
                                              for e in s.endpoints)
        deadline = time.monotonic() + timeout_s
        while True:
            got: dict[tuple[str, str], int] = {}
            for sl in self.real_slices():
                key = (sl["metadata"]["namespace"], sl["metadata"].get("labels", {}).get("kubernetes.io/service-name"))
                got[key] = got.get(key, 0) + sum(1 for e in sl.get("endpoints") or []
                                                 if (e.get("conditions") or {}).get("ready"))
            missing = {f"{ns}/{n}": (got.get((ns, n), 0), c) for (ns, n), c in want.items() if got.get((ns, n), 0) != c}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"EndpointSlices incomplete after {timeout_s:.0f} s "
                                     f"(Service: (ready endpoints, expected)): {missing}")
            time.sleep(0.3)

    def _start_kube_proxy(self, cp: Any, node: Any) -> tuple[subprocess.Popen[bytes], int]:
        """Start the real kube-proxy of ``node`` in its namespace; returns the process and the
        offset of its log at the start (the log is appended to across restarts)."""
        opt = self.topology.options
        cluster_cidr = str(opt.pod_cidr) + (f",{opt.pod_cidr_v6}" if opt.ipv6 else "")
        server = f"https://{self.kube_address}:6443"
        kc = cp.client_kubeconfig(self.kube_dir / f"kube-proxy-{node.name}.kubeconfig", "kube-proxy", server)
        argv = [str(cp.binaries.kube_proxy), f"--kubeconfig={kc}", f"--hostname-override={node.name}",
                f"--proxy-mode={self.proxy_mode}", f"--cluster-cidr={cluster_cidr}",
                "--detect-local-mode=ClusterCIDR", "--nodeport-addresses=primary",
                # nf_conntrack_max is not per namespace: leave the host's conntrack settings alone
                "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0", "--oom-score-adj=0",
                "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
                # V(4): the proxier logs the node topology labels it took (_topology_taken)
                "--v=4"]
        path = self.kube_dir / f"kube-proxy-{node.name}.log"
        offset = path.stat().st_size if path.exists() else 0
        log = open(path, "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.node_netns(node.name), *argv], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        return proc, offset

    def _topology_taken(self, node: Any, offset: int) -> bool:
        """Whether ``node``'s kube-proxy logged, after ``offset``, that its proxier took the
        node's zone label (``Proxier.OnTopologyChange``, kube-proxy pkg/proxy/iptables and
        nftables ``proxier.go``: "Updated proxier node topology labels")."""
        path = self.kube_dir / f"kube-proxy-{node.name}.log"
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        return any("Updated proxier node topology labels" in ln and f'"{node.zone}"' in ln
                   for ln in text.splitlines())

    def _start_kube_proxies(self, cp: Any, attempts: int = 3, wait_s: float = 10.0) -> None:
        """Start every real kube-proxy and wait until each has rules for every ClusterIP and
        has taken its node's zone.

        kube-proxy 1.37 can miss its node's zone at start: ``NewNodeTopologyConfig`` adds its
        handler to the already synced node informer before the proxier is registered with
        ``RegisterEventHandler`` (cmd/kube-proxy/app/server.go), and
        ``NodeTopologyConfig.handleNodeEvent`` (pkg/proxy/config/config.go) records the labels
        even with no handler and skips every later event carrying the same labels; that
        kube-proxy then ignores every hint until its zone label changes. Seen in the lab under
        load (one node's kube-proxy forwarding a PreferSameZone Service to every zone). Such a
        kube-proxy is restarted, as a node's supervisor would after its health check.

        Raises:
            RuntimeFailure: a kube-proxy wrote no rules in time, or did not take its zone in
                ``attempts`` starts.
        """
        nodes = [n for n in self.topology.nodes if self.uses_kube_proxy(n.name)]
        started = {n.name: self._start_kube_proxy(cp, n) for n in nodes}
        self.wait_kube_proxies()
        for n in nodes:
            if not n.zone:
                continue
            for attempt in range(attempts):
                proc, offset = started[n.name]
                deadline = time.monotonic() + wait_s
                while time.monotonic() < deadline and not self._topology_taken(n, offset):
                    time.sleep(0.2)
                if self._topology_taken(n, offset):
                    break
                if attempt == attempts - 1:
                    raise RuntimeFailure(f"kube-proxy of node {n.name} did not take its zone {n.zone} "
                                         f"in {attempts} starts ({self.kube_dir / f'kube-proxy-{n.name}.log'})")
                print(f"lab: kube-proxy of node {n.name} missed its zone label at start "
                      "(kube-proxy NodeTopologyConfig race); restarting it", file=sys.stderr)
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
                started[n.name] = self._start_kube_proxy(cp, n)
                self.wait_kube_proxies()

    def programmed(self, node: str) -> str:
        """The rules kube-proxy wrote in ``node``'s namespace: ``iptables-save`` (nat and filter,
        both families where the lab has IPv6) or ``nft list ruleset``."""
        ns = self.node_netns(node)
        if self.proxy_mode == "nftables":
            return nsexec(ns, ["nft", "list", "ruleset"]).stdout
        out = nsexec(ns, ["iptables-save"]).stdout
        if self.topology.options.ipv6:
            out += nsexec(ns, ["ip6tables-save"]).stdout
        return out

    def programmed_endpoints(self, node: str) -> dict[tuple[str, str, int], list[str]]:
        """What the proxy of ``node`` sends each ClusterIP:port to, read back from its rules.

        Works on the real kube-proxy's iptables rules (``KUBE-SERVICES`` jumps to a
        ``KUBE-SVC-*``/``KUBE-SVL-*`` chain whose rules, commented ``"<svc> -> ip:port"``, jump to
        the endpoints' ``KUBE-SEP-*``; kube-proxy pkg/proxy/iptables/proxier.go,
        ``syncProxyRules``), on its nftables rules (the ``service-ips`` map sends
        ``ip . proto . port`` to a ``service-*`` chain that jumps to ``endpoint-*__ip/port``
        chains; pkg/proxy/nftables/proxier.go), and on the lab's emulation (same iptables shape).

        Returns:
            ``{(cluster IP, "TCP"|"UDP", port): ["ip:port", ...]}`` sorted; an empty list where
            the proxy drops or rejects (no usable endpoint).

        Raises:
            RuntimeFailure: the rules could not be read.
        """
        ns = self.node_netns(node)
        if self.uses_kube_proxy(node) and self.proxy_mode == "nftables":
            return _parse_nft(nsexec(ns, ["nft", "list", "ruleset"]).stdout)
        # one family at a time: a Service port's chains have the same name in both
        out = _parse_iptables(nsexec(ns, ["iptables-save"]).stdout)
        if self.topology.options.ipv6:
            out.update(_parse_iptables(nsexec(ns, ["ip6tables-save"]).stdout))
        return out

    def wait_kube_proxies(self, timeout_s: float = 60.0) -> None:
        """Until every real kube-proxy has written a rule for every ClusterIP of the lab.

        Raises:
            RuntimeFailure: a kube-proxy did not within ``timeout_s`` (names the node, its log).
        """
        deadline = time.monotonic() + timeout_s
        ips = [str(ip) for s in self.topology.services for ip in (s.cluster_ip, s.cluster_ip6) if ip is not None]
        for node in self.topology.nodes:
            if not self.uses_kube_proxy(node.name):
                continue
            while True:
                text = self.programmed(node.name)
                missing = [ip for ip in ips if ip not in text]
                if not missing:
                    break
                if time.monotonic() > deadline:
                    log = self.kube_dir / f"kube-proxy-{node.name}.log"
                    tail = " | ".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else ""
                    raise RuntimeFailure(f"kube-proxy of node {node.name} has no rule for {', '.join(missing)} "
                                         f"after {timeout_s:.0f} s ({log}: {tail})")
                time.sleep(0.3)

    @staticmethod
    def remove_kube_dir(state_dir: Path, prefix: str) -> None:
        """Delete ``<state_dir>/<prefix>-kube`` (after the processes are gone)."""
        shutil.rmtree(Path(state_dir) / f"{prefix}-kube", ignore_errors=True)

    def kubernetes_status(self) -> dict[str, Any]:
        """``{"mode": ...}``, and in real mode the versions, kube-proxy mode, apiserver URLs and
        kubeconfigs (for ``lab status``)."""
        if self.kubernetes != "real":
            return {"mode": "emulated"}
        cp = self.control_plane()
        return {"mode": "real", "version": cp.binaries.kube_version, "etcd": cp.binaries.etcd_version,
                "proxyMode": self.proxy_mode, "apiserver": cp.server, "relay": self.relay_url,
                "netns": self.kube_netns, "adminKubeconfig": str(self.admin_kubeconfig),
                "agentKubeconfig": str(self.agent_kubeconfig), "kubectl": str(cp.binaries.kubectl),
                "kubeProxyNodes": [n.name for n in self.topology.nodes if self.uses_kube_proxy(n.name)],
                "emulatedProxyNodes": [n.name for n in self.topology.nodes if not self.uses_kube_proxy(n.name)]}


_IPT_SERVICE = re.compile(r"^-A KUBE-SERVICES -d (\S+?)(?:/\d+)? -p (\w+) .*--dport (\d+) (?:.* )?-j (KUBE-SV[CL]-\w+)")
_IPT_NONE = re.compile(r"^-A KUBE-SERVICES -d (\S+?)(?:/\d+)? -p (\w+) .*--dport (\d+) .*-j (?:REJECT|DROP)")
_IPT_ENDPOINT = re.compile(r'^-A (KUBE-SV[CL]-\w+) .*--comment "?[^"]* -> (\S+?)"? .*-j KUBE-SEP-')


def _parse_iptables(text: str) -> dict[tuple[str, str, int], list[str]]:
    """:meth:`LabKubernetes.programmed_endpoints` from ``iptables-save`` text."""
    chains: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _IPT_ENDPOINT.match(line)
        if m:
            chains.setdefault(m.group(1), []).append(m.group(2))
    out: dict[tuple[str, str, int], list[str]] = {}
    for line in text.splitlines():
        m = _IPT_SERVICE.match(line)
        if m:
            out[(m.group(1), m.group(2).upper(), int(m.group(3)))] = sorted(chains.get(m.group(4), []))
            continue
        m = _IPT_NONE.match(line)
        if m:
            out.setdefault((m.group(1), m.group(2).upper(), int(m.group(3))), [])
    return out


_NFT_ELEMENT = re.compile(r"([0-9a-fA-F.:]+) \. (tcp|udp|sctp) \. (\d+)(?: comment \"[^\"]*\")? : "
                          r"(?:goto (service-\S+?)(?=[,\s}]|$)|\w+)")
_NFT_TABLE = re.compile(r"^\s*table (\S+ \S+) \{")
_NFT_CHAIN = re.compile(r"^\s*chain (\S+) \{")
_NFT_MAP = re.compile(r"^\s*map (\S+) \{")
#: an endpoint in a service chain: a DNAT map entry ``0 : ip . port``, a single ``dnat to ip:port``,
#: or (older releases) a jump to an ``endpoint-*__ip/port`` chain
_NFT_DNAT_MAP = re.compile(r"\d+ : ([0-9a-fA-F.:]+) \. (\d+)")
_NFT_DNAT_ONE = re.compile(r"dnat (?:ip6? )?to (?:\[([0-9a-fA-F:]+)\]|([0-9.]+)):(\d+)")
_NFT_ENDPOINT = re.compile(r"goto endpoint-\S+?__(\S+?)/(\d+)(?=[,\s}]|$)")


def _ep(ip: str, port: str) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _parse_nft(text: str) -> dict[tuple[str, str, int], list[str]]:
    """:meth:`LabKubernetes.programmed_endpoints` from ``nft list ruleset`` text (kube-proxy's
    ``ip``/``ip6 kube-proxy`` tables: the ``service-ips`` and ``no-endpoint-services`` maps and
    the ``service-*`` chains, pkg/proxy/nftables/proxier.go ``syncProxyRules``)."""
    # chains are per table: ``ip kube-proxy`` and ``ip6 kube-proxy`` use the same names
    chains: dict[tuple[str, str], list[str]] = {}
    out: dict[tuple[str, str, int], list[str]] = {}
    targets: dict[tuple[str, str, int], tuple[str, str]] = {}
    table = ""
    chain = mapname = None
    for line in text.splitlines():
        if m := _NFT_TABLE.match(line):
            table, chain, mapname = m.group(1), None, None
            continue
        if m := _NFT_CHAIN.match(line):
            chain, mapname = m.group(1), None
            continue
        if m := _NFT_MAP.match(line):
            chain, mapname = None, m.group(1)
            continue
        if chain and chain.startswith("service-"):
            eps = chains.setdefault((table, chain), [])
            eps += [_ep(e.group(1), e.group(2)) for e in _NFT_DNAT_MAP.finditer(line)]
            eps += [_ep(e.group(1) or e.group(2), e.group(3)) for e in _NFT_DNAT_ONE.finditer(line)]
            eps += [_ep(e.group(1), e.group(2)) for e in _NFT_ENDPOINT.finditer(line)]
        elif mapname in ("service-ips", "no-endpoint-services"):
            for e in _NFT_ELEMENT.finditer(line):
                key = (e.group(1), e.group(2).upper(), int(e.group(3)))
                if mapname == "service-ips" and e.group(4):
                    targets[key] = (table, e.group(4))
                else:
                    out.setdefault(key, [])
    for key, target in targets.items():
        out[key] = sorted(chains.get(target, []))
    return out
