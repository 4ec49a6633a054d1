"""API fan-out: N agents' metadata watchers against a real kube-apiserver with a churning cluster.

Starts the real control plane (etcd, kube-apiserver, kube-controller-manager built by
tools/kube/build.sh; :class:`tools.kube.controlplane.ControlPlane`) in a network namespace of
its own, as tests/fixtures/controlplane.py does; the bench process enters that namespace
(``setns``) so every client it starts talks to the apiserver there, never through the host's.
Then, as a kubelet and a user would (kwok-style, as tools/lab/kube.py plays the kubelet):

* ``--nodes`` Nodes in three zones with ``spec.podCIDRs`` and a kubelet's status (addresses,
  capacity, conditions, nodeInfo, 25 images), reported again every ``--node-status-period``
  seconds (kubelet ``nodeStatusReportFrequency``, 5 min: only heartbeat times change);
* one Service (two ports; a quarter with ``trafficDistribution: PreferClose``) and one
  ReplicaSet per ``--pods-per-service`` pods, in 50 namespaces;
* ``--pods`` Pods bound to the Nodes, owned by their ReplicaSet, made Running and Ready through
  the status subresource; their EndpointSlices are written by the real EndpointSlice controller.

Then, for each ``--scopes`` entry (``none``: no watcher, the apiserver's cost of the churn
alone; ``cluster``; ``node``), ``--watchers`` processes each run the agent's own metadata
watch (:class:`agent.k8s.watch.MetadataWatcher` into :class:`agent.k8s.cache.ClusterMetadata`,
with deploy/daemonset's ServiceAccount token, ``--pod-scope`` as given, each named after a
different Node), one process per watcher so each one's RSS and CPU are its own. Once all are
synced the churn runs for ``--windows`` windows of ``--window`` seconds: ``--churn`` pod
replacements a second, each as a kubelet and a ReplicaSet controller write it (graceful
delete, terminated status, final delete; create, Pending, Running not Ready, Ready: seven pod
events per replacement for a watcher that sees the pod), plus the Node status reports.

Measured per window: CPU (``/proc/PID/stat`` utime+stime) and RSS (``/proc/PID/status``) of
kube-apiserver, etcd, kube-controller-manager and each watcher; the bytes each watcher
received, counted in the watcher process at the TLS socket (every ``recv_into``/``recv``/``read``
of an ``ssl.SSLSocket``: HTTP headers, chunk framing and bodies, decrypted), cross-checked by
an nftables counter on the apiserver's packets to the watchers (IP bytes, TLS and TCP/IP
headers included); each watcher's time from start to all four resources synced.

Usage (root; the Kubernetes binaries built by tools/setup.sh):
    .venv/bin/python -m bench.bench_fanout                       # 1,000 nodes, 20,000 pods, 50 watchers
    .venv/bin/python -m bench.bench_fanout --nodes 100 --pods 2000 --watchers 5 --window 20   # quick
    .venv/bin/python -m bench.bench_fanout -o json > fanout.json
    .venv/bin/python -m bench.bench_fanout --extrapolate fanout.json --to-nodes 5000 --to-pods 150000

Figures go to BENCHMARKS.md (*API fan-out*).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import ssl
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ZONES = ("zone-a", "zone-b", "zone-c")
NAMESPACES = 50
APISERVER_ADDRESS = "10.250.0.10"
SERVICE_CIDR = "10.96.0.0/16"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------ /proc readings


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------------------------------ the watcher process


class _ByteCount:
    """Bytes read from TLS sockets in this process (thread-safe), in all and by thread name
    (the watcher runs one thread per resource: ``watch-pods``, ``watch-nodes``, ...)."""

    def __init__(self) -> None:
        self.n = 0
        self.by_thread: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, k: int) -> None:
        name = threading.current_thread().name
        with self._lock:
            self.n += k
            self.by_thread[name] = self.by_thread.get(name, 0) + k


def _count_tls_reads(counter: _ByteCount) -> None:
    """Wrap ``ssl.SSLSocket``'s read calls so every decrypted byte this process receives is
    counted (urllib3 reads responses through ``socket.SocketIO.readinto`` -> ``recv_into``)."""
    orig_recv_into, orig_recv = ssl.SSLSocket.recv_into, ssl.SSLSocket.recv

    def recv_into(self: ssl.SSLSocket, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        n = orig_recv_into(self, buffer, nbytes, flags)
        counter.add(n)
        return n

    def recv(self: ssl.SSLSocket, buflen: int = 1024, flags: int = 0) -> bytes:
        b = orig_recv(self, buflen, flags)
        counter.add(len(b))
        return b

    ssl.SSLSocket.recv_into = recv_into  # type: ignore[method-assign]
    ssl.SSLSocket.recv = recv  # type: ignore[method-assign]


def watcher_main(args: argparse.Namespace) -> int:
    """One agent's metadata watch; writes its counters to ``--stats`` every second."""
    started = time.time()
    counter = _ByteCount()
    _count_tls_reads(counter)
    import kubernetes  # noqa: F401 - what the agent imports, before the baseline RSS
    import prometheus_client  # noqa: F401

    from agent.k8s.cache import ClusterMetadata, MetadataSettings
    from agent.k8s.client import build_api_client
    from agent.k8s.watch import MetadataWatcher

    pod_node = args.node if args.pod_scope == "node" else None
    base_rss = rss_mib(os.getpid())
    cache = ClusterMetadata(MetadataSettings(pod_node=pod_node))
    watcher = MetadataWatcher(build_api_client(args.kubeconfig), cache, pod_node=pod_node)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watcher.start()
    synced_at: float | None = None
    full_reevaluations = ticks = 0
    last_tick = time.monotonic()
    out = Path(args.stats)
    while not stop.wait(1.0):
        if synced_at is None and all(cache.synced().values()):
            synced_at = time.time()
        if synced_at is not None and time.monotonic() - last_tick >= 10.0:
            # what an agent's tick asks of the cache: a full hint re-evaluation when a Node changed
            last_tick = time.monotonic()
            ticks += 1
            full_reevaluations += cache.take_dirty().all
        stats = {w: vars(x.stats) | {"unknown_types": sorted(x.stats.unknown_types)}
                 for w, x in watcher.watchers.items()}
        with counter._lock:
            by_thread = dict(counter.by_thread)
        doc = {"pid": os.getpid(), "started": started, "synced_at": synced_at, "bytes": counter.n,
               "bytes_by_resource": {k.removeprefix("watch-"): v for k, v in by_thread.items()},
               "base_rss_mib": base_rss, "counts": cache.counts(), "ticks": ticks,
               "full_reevaluations": full_reevaluations, "watch": stats}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(out)
    watcher.stop()
    return 0


# ------------------------------------------------------------------------ the apiserver client


class Api:
    """A small HTTPS client of the apiserver for the writer (admin client certificate); JSON in,
    status and JSON out. urllib3 directly: the official client would build a model object of
    every answer, several times the CPU of the request itself."""

    def __init__(self, server: str, pki: Path, pool: int = 32) -> None:
        import urllib3

        self.server = server
        self.http = urllib3.PoolManager(num_pools=2, maxsize=pool, block=True, retries=False,
                                        cert_file=str(pki / "admin.crt"), key_file=str(pki / "admin.key"),
                                        ca_certs=str(pki / "ca.crt"), timeout=urllib3.Timeout(10, 120))
        self.requests = 0
        self.errors: dict[int, int] = {}

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             ok: tuple[int, ...] = (200, 201, 202)) -> tuple[int, Any]:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(6):
            r = self.http.request(method, self.server + path, body=data, headers=headers, preload_content=True)
            self.requests += 1
            if r.status in ok:
                return r.status, json.loads(r.data) if r.data else None
            self.errors[r.status] = self.errors.get(r.status, 0) + 1
            if r.status == 429 or r.status >= 500:  # APF or a busy apiserver: back off
                time.sleep(0.2 * 2 ** attempt)
                continue
            return r.status, None
        return r.status, None

    def merge(self, path: str, body: Any) -> tuple[int, Any]:
        return self.call("PATCH", path, body, "application/merge-patch+json")


# ------------------------------------------------------------------------ the cluster


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _h(n: int, k: int = 10) -> str:
    return "".join(random.Random(n).choices(string.ascii_lowercase + string.digits, k=k))


@dataclass
class Cluster:
    """The objects the bench wrote and the state the churn needs."""

    nodes: int
    pods: int
    per_service: int
    node_names: list[str] = field(default_factory=list)
    services: list[tuple[str, str, str, str]] = field(default_factory=list)  # ns, name, rs, rs uid
    live: dict[str, tuple[str, str, int, str]] = field(default_factory=dict)  # pod -> ns, node idx, svc, ip
    free: list[list[int]] = field(default_factory=list)  # per node: free host numbers of its podCIDR
    lock: threading.Lock = field(default_factory=threading.Lock)

    def node_name(self, k: int) -> str:
        return f"ip-172-20-{k // 256}-{k % 256}.zonemeter.internal"

    @staticmethod
    def pod_cidr(k: int) -> str:
        return f"10.{128 + k // 256}.{k % 256}.0/24"

    @staticmethod
    def node_ip(k: int) -> str:
        return f"172.20.{k // 256}.{k % 256}"

    def pod_ip(self, k: int, host: int) -> str:
        return f"10.{128 + k // 256}.{k % 256}.{host}"


def node_object(c: Cluster, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Node as created, its status as the kubelet reports it)."""
    name, zone = c.node_name(k), ZONES[k % 3]
    labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
              "beta.kubernetes.io/instance-type": "m6i.2xlarge", "kubernetes.io/arch": "amd64",
              "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/region": "region-1",
              "topology.kubernetes.io/zone": zone, "failure-domain.beta.kubernetes.io/zone": zone,
              "failure-domain.beta.kubernetes.io/region": "region-1", "nodegroup": f"ng-{zone}"}
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"podCIDR": c.pod_cidr(k), "podCIDRs": [c.pod_cidr(k)],
                     "providerID": f"aws:///{zone}/i-{_h(k, 17)}"}}
    now = _now()
    status = {
        "addresses": [{"type": "InternalIP", "address": c.node_ip(k)}, {"type": "Hostname", "address": name},
                      {"type": "InternalDNS", "address": name}],
        "allocatable": {"cpu": "7910m", "ephemeral-storage": "95491281146", "hugepages-1Gi": "0",
                        "hugepages-2Mi": "0", "memory": "31482800Ki", "pods": "58"},
        "capacity": {"cpu": "8", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                     "memory": "32408496Ki", "pods": "58"},
        "conditions": heartbeat_conditions(now),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "images": [{"names": [f"registry.example.com/team-{i}/image-{i}@sha256:{_h(i, 64)}",
                              f"registry.example.com/team-{i}/image-{i}:v1.{i}.0"], "sizeBytes": 10_000_000 * (i + 1)}
                   for i in range(25)],
        "nodeInfo": {"architecture": "amd64", "bootID": _h(k + 1, 36), "containerRuntimeVersion": "containerd://1.7.27",
                     "kernelVersion": "6.1.0-28-cloud-amd64", "kubeProxyVersion": "", "kubeletVersion": "v1.37.2",
                     "machineID": _h(k + 2, 32), "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12",
                     "systemUUID": _h(k + 3, 36)}}
    return node, status


def heartbeat_conditions(now: str) -> list[dict[str, Any]]:
    conds = [("MemoryPressure", "False", "KubeletHasSufficientMemory"),
             ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
             ("PIDPressure", "False", "KubeletHasSufficientPID"), ("Ready", "True", "KubeletReady")]
    return [{"type": t, "status": s, "reason": r, "message": f"kubelet: {r}", "lastHeartbeatTime": now,
             "lastTransitionTime": "2026-12-01T00:00:00Z"} for t, s, r in conds]


def pod_object(c: Cluster, name: str, svc: int, k: int) -> dict[str, Any]:
    ns, sname, rs, rs_uid = c.services[svc]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "generateName": f"{rs}-",
                     "labels": {"app": sname, "pod-template-hash": rs.rsplit("-", 1)[1], "team": ns,
                                "version": "v1.2.3"},
                     "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z",
                                     "prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": rs_uid,
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": c.node_name(k), "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
                 "containers": [{
                     "name": "app", "image": f"registry.example.com/{ns}/{sname}:v1.2.3",
                     "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                               {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                     "env": [{"name": "LOG_LEVEL", "value": "info"},
                             {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                             {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                     "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
                     "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10}}]}}


def pod_status(c: Cluster, k: int, ip: str | None, stage: str, started: str) -> dict[str, Any]:
    """The status a kubelet reports at ``stage``: pending, running (not ready), ready, terminated."""
    now = _now()
    ready = stage == "ready"
    conds = [{"type": "PodReadyToStartContainers", "status": "False" if stage == "pending" else "True"},
             {"type": "Initialized", "status": "True"},
             {"type": "Ready", "status": "True" if ready else "False"},
             {"type": "ContainersReady", "status": "True" if ready else "False"},
             {"type": "PodScheduled", "status": "True"}]
    for cd in conds:
        cd["lastProbeTime"] = None  # type: ignore[assignment]
        cd["lastTransitionTime"] = now
    if stage == "pending":
        state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
    elif stage == "terminated":
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now,
                                "containerID": f"containerd://{_h(hash(started) + k, 64)}"}}
    else:
        state = {"running": {"startedAt": started}}
    st: dict[str, Any] = {
        "phase": "Pending" if stage == "pending" else "Running", "conditions": conds,
        "hostIP": c.node_ip(k), "hostIPs": [{"ip": c.node_ip(k)}], "startTime": started, "qosClass": "Burstable",
        "containerStatuses": [{"name": "app", "image": "registry.example.com/app:v1.2.3",
                               "imageID": f"registry.example.com/app@sha256:{_h(k, 64)}", "ready": ready,
                               "restartCount": 0, "started": stage in ("running", "ready"), "state": state,
                               **({"containerID": f"containerd://{_h(k + 7, 64)}"} if stage != "pending" else {})}]}
    if ip is not None and stage != "pending":
        st["podIP"], st["podIPs"] = ip, [{"ip": ip}]
    return st


def build_cluster(api: Api, c: Cluster, workers: int, log: Any) -> dict[str, float]:
    """Write Namespaces, Nodes (+status), ReplicaSets, Services, Pods (+status); returns timings."""
    times: dict[str, float] = {}
    pool = concurrent.futures.ThreadPoolExecutor(workers)

    def each(fn: Any, items: list[Any], what: str) -> None:
        t0 = time.monotonic()
        for f in concurrent.futures.as_completed([pool.submit(fn, x) for x in items]):
            f.result()
        times[what] = time.monotonic() - t0
        log(f"{what}: {len(items)} in {times[what]:.0f} s")

    each(lambda i: api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": f"team-{i}"}}, ok=(201, 409)),
         list(range(NAMESPACES)), "namespaces")

    def mk_node(k: int) -> None:
        node, status = node_object(c, k)
        api.call("POST", "/api/v1/nodes", node, ok=(201,))
        api.merge(f"/api/v1/nodes/{node['metadata']['name']}/status", {"status": status})

    c.node_names = [c.node_name(k) for k in range(c.nodes)]
    each(mk_node, list(range(c.nodes)), "nodes")
    n_svc = max(1, c.pods // c.per_service)
    c.services = [(f"team-{i % NAMESPACES}", f"svc-{i}", f"svc-{i}-{_h(i, 10)}", "") for i in range(n_svc)]

    def mk_svc(i: int) -> None:
        ns, name, rs, _ = c.services[i]
        spec: dict[str, Any] = {"selector": {"app": name},
                                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                                          {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"}]}
        if i % 4 == 0:
            spec["trafficDistribution"] = "PreferClose"
        api.call("POST", f"/api/v1/namespaces/{ns}/services",
                 {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec},
                 ok=(201,))
        h = rs.rsplit("-", 1)[1]
        tmpl = {"metadata": {"labels": {"app": name, "pod-template-hash": h}},
                "spec": {"containers": [{"name": "app", "image": f"registry.example.com/{ns}/{name}:v1.2.3"}]}}
        _, got = api.call("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets",
                          {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": rs, "namespace": ns},
                           "spec": {"replicas": c.per_service,
                                    "selector": {"matchLabels": {"app": name, "pod-template-hash": h}},
                                    "template": tmpl}}, ok=(201,))
        c.services[i] = (ns, name, rs, got["metadata"]["uid"])

    # the ServiceAccount admission plugin needs each namespace's default account first
    deadline = time.monotonic() + 120
    for i in range(NAMESPACES):
        while api.call("GET", f"/api/v1/namespaces/team-{i}/serviceaccounts/default", ok=(200,))[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("no default ServiceAccounts after 120 s (serviceaccount controller)")
            time.sleep(0.3)
    each(mk_svc, list(range(n_svc)), "services+replicasets")
    per_node = -(-c.pods // c.nodes)
    c.free = [list(range(2, 255)) for _ in range(c.nodes)]
    for f in c.free:
        random.Random(len(f)).shuffle(f)
    plan = []
    for i in range(c.pods):
        k = i // per_node
        svc = i % n_svc
        plan.append((f"{c.services[svc][2]}-{_h(i + 1_000_000, 5)}", svc, k))
    each(lambda p: start_pod(api, c, *p, stages=("ready",)), plan, "pods")
    pool.shutdown()
    return times


def start_pod(api: Api, c: Cluster, name: str, svc: int, k: int,
              stages: tuple[str, ...] = ("pending", "running", "ready")) -> None:
    """Create a pod bound to node ``k`` and report ``stages`` through its status, as its kubelet."""
    ns = c.services[svc][0]
    with c.lock:
        host = c.free[k].pop()
    ip = c.pod_ip(k, host)
    status, _ = api.call("POST", f"/api/v1/namespaces/{ns}/pods", pod_object(c, name, svc, k), ok=(201,))
    if status != 201:
        with c.lock:
            c.free[k].append(host)
        return
    started = _now()
    for st in stages:
        api.merge(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": pod_status(c, k, ip, st, started)})
    with c.lock:
        c.live[name] = (ns, str(k), svc, ip)  # type: ignore[assignment]


def replace_pod(api: Api, c: Cluster, rng: random.Random) -> bool:
    """One pod replacement: the old pod ends as a kubelet ends it, a new one of the same
    ReplicaSet starts on the same node (the ReplicaSet controller's create, then the kubelet)."""
    with c.lock:
        if not c.live:
            return False
        name = rng.choice(list(c.live))
        ns, ks, svc, ip = c.live.pop(name)
    k = int(ks)
    base = f"/api/v1/namespaces/{ns}/pods/{name}"
    api.call("DELETE", base, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 30})
    api.merge(base + "/status", {"status": pod_status(c, k, ip, "terminated", _now())})
    api.call("DELETE", base, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}, ok=(200, 404))
    with c.lock:
        c.free[k].insert(0, int(ip.rsplit(".", 1)[1]))
    start_pod(api, c, f"{c.services[svc][2]}-{uuid.uuid4().hex[:5]}", svc, k)
    return True


class Churn:
    """Pod replacements at ``rate`` a second and Node status reports every ``node_period`` s
    per node, until stopped; counts what it did."""

    def __init__(self, api: Api, c: Cluster, rate: float, node_period: float, workers: int = 24) -> None:
        self.api, self.c, self.rate, self.node_period = api, c, rate, node_period
        self.pool = concurrent.futures.ThreadPoolExecutor(workers)
        self.stop = threading.Event()
        self.replacements = 0
        self.node_reports = 0
        self.behind = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._pods, daemon=True),
                         threading.Thread(target=self._nodes, daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _pods(self) -> None:
        rng = random.Random(7)
        pending: list[concurrent.futures.Future[bool]] = []
        t = time.monotonic()
        while not self.stop.is_set():
            t += 1.0 / self.rate
            pending = [f for f in pending if not f.done()]
            if len(pending) > 4 * self.rate:  # the apiserver falls behind: do not queue without end
                self.behind += 1
            else:
                pending.append(self.pool.submit(self._one, rng))
            self.stop.wait(max(0.0, t - time.monotonic()))

    def _one(self, rng: random.Random) -> bool:
        ok = replace_pod(self.api, self.c, rng)
        with self._lock:
            self.replacements += ok
        return ok

    def _nodes(self) -> None:
        if self.node_period <= 0:
            return
        k = 0
        t = time.monotonic()
        while not self.stop.is_set():
            t += self.node_period / self.c.nodes
            name = self.c.node_name(k % self.c.nodes)
            self.pool.submit(self.api.merge, f"/api/v1/nodes/{name}/status",
                             {"status": {"conditions": heartbeat_conditions(_now())}})
            self.node_reports += 1
            k += 1
            self.stop.wait(max(0.0, t - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        for th in self._threads:
            th.join()
        self.pool.shutdown(wait=True)


# ------------------------------------------------------------------------ measuring


def nft(*rules: str) -> None:
    subprocess.run(["nft", "-f", "-"], input="\n".join(rules) + "\n", text=True, check=True)


def nft_bytes() -> dict[str, int]:
    """Bytes of the apiserver's packets (IP level), by counter: to the watchers, to everyone."""
    out = json.loads(subprocess.run(["nft", "-j", "list", "table", "inet", "zmfanout"], capture_output=True,
                                    text=True, check=True).stdout)
    got = {}
    for item in out["nftables"]:
        rule = item.get("rule")
        if rule:
            name = rule.get("comment")
            cnt = next((e["counter"] for e in rule["expr"] if "counter" in e), None)
            if name and cnt:
                got[name] = int(cnt["bytes"])
    return got


def summary(values: list[float]) -> dict[str, float]:
    """median, min, max, p10, p90 of ``values`` (rounded to 4 significant places)."""
    if not values:
        return {}
    v = sorted(values)
    q = statistics.quantiles(v, n=10) if len(v) >= 2 else [v[0]] * 9

    def r(x: float) -> float:
        return float(f"{x:.4g}")

    return {"median": r(statistics.median(v)), "min": r(v[0]), "p10": r(q[0]), "p90": r(q[-1]),
            "max": r(v[-1]), "n": len(v)}


@dataclass
class Watchers:
    procs: list[subprocess.Popen[bytes]]
    stats: list[Path]
    spawned: list[float]

    def read(self) -> list[dict[str, Any]]:
        out = []
        for p in self.stats:
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                out.append({})
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_watchers(n: int, scope: str, c: Cluster, kubeconfig: Path, workdir: Path) -> Watchers:
    procs, stats, spawned = [], [], []
    for i in range(n):
        node = c.node_name(i * c.nodes // n)
        st = workdir / f"watcher-{scope}-{i}.json"
        st.unlink(missing_ok=True)
        spawned.append(time.time())
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "bench.bench_fanout", "--watcher", "--kubeconfig", str(kubeconfig),
             "--pod-scope", scope, "--node", node, "--stats", str(st)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(workdir / f"watcher-{scope}-{i}.log", "wb")))  # noqa: SIM115 - the child's
        stats.append(st)
    return Watchers(procs, stats, spawned)


def measure_scope(scope: str, a: argparse.Namespace, cp: Any, api: Api, c: Cluster, kubeconfig: Path,
                  workdir: Path, log: Any) -> dict[str, Any]:
    """One scope: start its watchers (none for ``none``), wait for sync, churn, measure windows."""
    res: dict[str, Any] = {"scope": scope}
    comps = {n: cp.pids[n] for n in ("kube-apiserver", "etcd", "kube-controller-manager")}
    w: Watchers | None = None
    if scope != "none":
        w = start_watchers(a.watchers, scope, c, kubeconfig, workdir)
    try:
        return _measure(scope, a, api, c, w, comps, res, workdir, log)
    finally:
        if w is not None:
            w.stop()


def _measure(scope: str, a: argparse.Namespace, api: Api, c: Cluster, w: Watchers | None, comps: dict[str, int],
             res: dict[str, Any], workdir: Path, log: Any) -> dict[str, Any]:
    if w is not None:
        deadline = time.monotonic() + a.sync_timeout
        while True:
            docs = w.read()
            done = sum(1 for d in docs if d.get("synced_at"))
            dead = [i for i, p in enumerate(w.procs) if p.poll() is not None]
            if dead:
                raise RuntimeError(f"watchers exited: {dead} (logs in {workdir})")
            if done == len(docs) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        res["synced"] = done
        res["sync_seconds"] = summary([d["synced_at"] - s for d, s in zip(docs, w.spawned, strict=True)
                                       if d.get("synced_at")])
        res["pods_in_cache"] = summary([d["counts"]["pods"] for d in docs if d])
        log(f"{scope}: {done}/{a.watchers} watchers synced, median {res['sync_seconds'].get('median')} s")
        time.sleep(a.settle)
    churn = Churn(api, c, a.churn, a.node_status_period, workers=max(24, int(6 * a.churn)))
    churn.start()
    time.sleep(a.settle)  # the churn in steady state before the first window
    windows = []
    for i in range(a.windows):
        t0, r0, n0 = time.monotonic(), churn.replacements, nft_bytes()
        cpu0 = {n: cpu_seconds(p) for n, p in comps.items()}
        d0 = w.read() if w else []
        wc0 = [cpu_seconds(p.pid) for p in w.procs] if w else []
        time.sleep(a.window)
        dt = time.monotonic() - t0
        cpu1 = {n: cpu_seconds(p) for n, p in comps.items()}
        d1 = w.read() if w else []
        wc1 = [cpu_seconds(p.pid) for p in w.procs] if w else []
        n1 = nft_bytes()
        win = {"seconds": round(dt, 1), "replacements_per_s": round((churn.replacements - r0) / dt, 2),
               "load_1m": os.getloadavg()[0],
               "cpu_cores": {n: round((cpu1[n] - cpu0[n]) / dt, 3) for n in comps},
               "rss_mib": {n: round(rss_mib(p), 1) for n, p in comps.items()},
               "apiserver_out_bytes_per_s": round((n1["all"] - n0["all"]) / dt),
               "to_watchers_ip_bytes_per_s": round((n1["watchers"] - n0["watchers"]) / dt)}
        if w:
            win["watcher_bytes_per_s"] = [round((b.get("bytes", 0) - a_.get("bytes", 0)) / dt) for a_, b in
                                          zip(d0, d1, strict=True)]
            win["watcher_cpu_cores"] = [round((y - x) / dt, 4) for x, y in zip(wc0, wc1, strict=True)]
            win["watcher_rss_mib"] = [round(rss_mib(p.pid), 1) for p in w.procs]
            win["watcher_events"] = [sum(v["events"] for v in b.get("watch", {}).values())
                                     - sum(v["events"] for v in a_.get("watch", {}).values())
                                     for a_, b in zip(d0, d1, strict=True)]
            win["watcher_bytes_per_s_by_resource"] = {
                r: [round((b.get("bytes_by_resource", {}).get(r, 0) - a_.get("bytes_by_resource", {}).get(r, 0)) / dt)
                    for a_, b in zip(d0, d1, strict=True)]
                for r in ("pods", "nodes", "services", "endpointslices")}
        windows.append(win)
        log(f"{scope}: window {i + 1}/{a.windows}: apiserver {win['cpu_cores']['kube-apiserver']} cores, "
            f"{win['replacements_per_s']} replacements/s, load {win['load_1m']:.1f}")
    churn.close()
    res["windows"] = windows
    res["replacements_per_s"] = summary([x["replacements_per_s"] for x in windows])
    res["node_reports"] = churn.node_reports
    res["churn_behind"] = churn.behind
    for comp in comps:
        res[f"{comp}_cpu_cores"] = summary([x["cpu_cores"][comp] for x in windows])
        res[f"{comp}_rss_mib"] = summary([x["rss_mib"][comp] for x in windows])
    res["apiserver_out_bytes_per_s"] = summary([x["apiserver_out_bytes_per_s"] for x in windows])
    res["to_watchers_ip_bytes_per_s"] = summary([x["to_watchers_ip_bytes_per_s"] for x in windows])
    if w:
        flat = lambda key: [v for x in windows for v in x[key]]  # noqa: E731
        res["watcher_bytes_per_s"] = summary(flat("watcher_bytes_per_s"))
        res["watcher_bytes_per_s_by_resource"] = {
            r: summary([v for x in windows for v in x["watcher_bytes_per_s_by_resource"][r]])
            for r in ("pods", "nodes", "services", "endpointslices")}
        # per pod replacement of the cluster, what one watcher receives (pods and slices)
        by = [x["watcher_bytes_per_s_by_resource"] for x in windows]
        res["watcher_bytes_per_replacement"] = summary([
            (b["pods"][i] + b["endpointslices"][i]) / x["replacements_per_s"]
            for x, b in zip(windows, by, strict=True) if x["replacements_per_s"] for i in range(len(w.procs))])
        res["watcher_cpu_cores"] = summary(flat("watcher_cpu_cores"))
        res["watcher_rss_mib"] = summary(windows[-1]["watcher_rss_mib"])
        res["watcher_events_per_s"] = summary([e / x["seconds"] for x in windows for e in x["watcher_events"]])
        docs = w.read()
        res["watcher_base_rss_mib"] = summary([d["base_rss_mib"] for d in docs if d])
        res["full_reevaluations_per_tick"] = summary([d["full_reevaluations"] / max(1, d["ticks"])
                                                      for d in docs if d])
        res["relists"] = sum(v["relists"] for d in docs if d for v in d["watch"].values())
        res["watch_errors"] = sum(v["errors"] for d in docs if d for v in d["watch"].values())
        # the counter in the watchers (decrypted) against the apiserver's IP bytes to them
        tls = sum(sum(x["watcher_bytes_per_s"]) for x in windows)
        ipb = sum(x["to_watchers_ip_bytes_per_s"] for x in windows)
        res["ip_over_tls_bytes"] = round(ipb / tls, 3) if tls else None
        res["throttled"] = sum(v.get("throttled", 0) for d in docs if d for v in d["watch"].values())
    return res


def object_sizes(api: Api) -> dict[str, float]:
    """Median JSON size in bytes of the objects as the apiserver serves them (first page)."""
    out = {}
    for kind, path in (("pod", "/api/v1/pods?limit=200"), ("node", "/api/v1/nodes?limit=200"),
                       ("service", "/api/v1/services?limit=200"),
                       ("endpointslice", "/apis/discovery.k8s.io/v1/endpointslices?limit=200")):
        _, doc = api.call("GET", path)
        items = (doc or {}).get("items") or []
        if items:
            out[kind] = statistics.median(len(json.dumps(o, separators=(",", ":"))) for o in items)
    return out


def wait_slices(api: Api, c: Cluster, log: Any, timeout: float = 900) -> float:
    """Until the EndpointSlice controller lists every pod as a ready endpoint; returns seconds."""
    t0 = time.monotonic()
    while True:
        ready, token = 0, ""
        while True:
            _, doc = api.call("GET", "/apis/discovery.k8s.io/v1/endpointslices?limit=500"
                              + (f"&continue={token}" if token else ""))
            for sl in (doc or {}).get("items") or []:
                ready += sum(1 for e in sl.get("endpoints") or [] if (e.get("conditions") or {}).get("ready"))
            token = ((doc or {}).get("metadata") or {}).get("continue") or ""
            if not token:
                break
        if ready >= c.pods:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"EndpointSlices list {ready} ready endpoints of {c.pods} after {timeout:.0f} s")
        log(f"endpointslices: {ready}/{c.pods} ready endpoints")
        time.sleep(5)


def enter_netns(name: str) -> None:
    """Move this process (its only thread so far) into network namespace ``name``: every thread
    and child started later is inside it (setns(2) moves the calling thread; clone copies it)."""
    from pyroute2.netns import setns

    setns(name, flags=0)


def main_bench(a: argparse.Namespace) -> int:
    from tools.kube.controlplane import Binaries, ControlPlane

    if os.geteuid() != 0:
        print("bench_fanout: needs root (network namespace, nftables)", file=sys.stderr)
        return 2
    if threading.active_count() != 1:
        print("bench_fanout: threads started before setns", file=sys.stderr)
        return 1
    binaries = Binaries.find()
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    netns = f"zmbench-fanout-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="zm-fanout-"))
    subprocess.run(["ip", "netns", "add", netns], check=True)
    result: dict[str, Any] = {
        "params": {k: v for k, v in vars(a).items() if k not in ("watcher", "stats", "kubeconfig", "node")},
        "kubernetes": binaries.kube_version, "etcd": binaries.etcd_version, "cpus": os.cpu_count(),
        "load_1m_start": os.getloadavg()[0], "python": sys.version.split()[0],
        "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip()}
    cp = None
    try:
        for cmd in (["addr", "add", f"{APISERVER_ADDRESS}/32", "dev", "lo"], ["link", "set", "lo", "up"]):
            subprocess.run(["ip", "-n", netns, *cmd], check=True)
        enter_netns(netns)
        nft("table inet zmfanout {", " chain out { type filter hook output priority 0;",
            f'  tcp sport 6443 ip daddr {APISERVER_ADDRESS} counter comment "watchers"',
            '  tcp sport 6443 counter comment "all"', " }", "}")
        cp = ControlPlane(netns, APISERVER_ADDRESS, SERVICE_CIDR, workdir / "cp", binaries=binaries)
        cp.start()
        log(f"control plane ready ({binaries.kube_version}, etcd {binaries.etcd_version})")
        cp.kubectl("apply", "-k", str(ROOT / "deploy" / "daemonset" / "agent"))
        kubeconfig = cp.token_kubeconfig(workdir / "agent.kubeconfig", "zonemeter", "zonemeter-agent")
        # the writer on the namespace's loopback, so the nftables counter to APISERVER_ADDRESS
        # sees the watchers only (kube-controller-manager uses 127.0.0.1 too)
        api = Api("https://127.0.0.1:6443", cp.pki)
        c = Cluster(a.nodes, a.pods, a.pods_per_service)
        result["build_seconds"] = build_cluster(api, c, a.writers, log)
        result["slices_seconds"] = round(wait_slices(api, c, log), 1)
        result["object_bytes"] = object_sizes(api)
        log(f"cluster ready: {result['object_bytes']}")
        result["scopes"] = [measure_scope(s, a, cp, api, c, kubeconfig, workdir, log) for s in a.scopes]
        result["writer_errors"] = api.errors
        result["load_1m_end"] = os.getloadavg()[0]
    finally:
        if cp is not None:
            cp.stop()
        subprocess.run(["ip", "netns", "del", netns], check=False)
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if a.output == "json":
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


def print_table(r: dict[str, Any]) -> None:
    p = r["params"]
    print(f"{p['nodes']} nodes, {p['pods']} pods, {p['pods'] // p['pods_per_service']} Services, {p['watchers']} "
          f"watchers, churn {p['churn']} replacements/s, Node status every {p['node_status_period']} s; "
          f"Kubernetes {r['kubernetes']}, {r['cpus']} CPUs, load {r['load_1m_start']:.1f} -> {r['load_1m_end']:.1f}")
    print(f"object sizes (median JSON bytes): {r['object_bytes']}")
    fmt = "{:<34}" + "{:>22}" * len(r["scopes"])
    print(fmt.format("", *[s["scope"] for s in r["scopes"]]))

    def row(label: str, key: str, scale: float = 1.0, unit: str = "") -> None:
        cells = []
        for s in r["scopes"]:
            v = s.get(key)
            cells.append(f"{v['median'] * scale:.4g} ({v['min'] * scale:.3g}-{v['max'] * scale:.3g}){unit}"
                         if v else "-")
        print(fmt.format(label, *cells))

    row("apiserver CPU (cores)", "kube-apiserver_cpu_cores")
    row("apiserver RSS (MiB)", "kube-apiserver_rss_mib")
    row("etcd CPU (cores)", "etcd_cpu_cores")
    row("kcm CPU (cores)", "kube-controller-manager_cpu_cores")
    row("apiserver out (MB/s)", "apiserver_out_bytes_per_s", 1e-6)
    row("to watchers, IP (MB/s)", "to_watchers_ip_bytes_per_s", 1e-6)
    row("per watcher received (kB/s)", "watcher_bytes_per_s", 1e-3)
    for res in ("pods", "nodes", "endpointslices"):
        cells = []
        for s in r["scopes"]:
            v = (s.get("watcher_bytes_per_s_by_resource") or {}).get(res)
            cells.append(f"{v['median'] / 1e3:.4g} ({v['min'] / 1e3:.3g}-{v['max'] / 1e3:.3g})" if v else "-")
        print(fmt.format(f"  of which {res} (kB/s)", *cells))
    row("per watcher kB per replacement", "watcher_bytes_per_replacement", 1e-3)
    row("per watcher events/s", "watcher_events_per_s")
    row("per watcher CPU (cores)", "watcher_cpu_cores")
    row("per watcher RSS (MiB)", "watcher_rss_mib")
    row("per watcher RSS at start (MiB)", "watcher_base_rss_mib")
    row("time to sync (s)", "sync_seconds")
    row("replacements/s achieved", "replacements_per_s")


def extrapolate(r: dict[str, Any], nodes: int, pods: int, churn: float | None = None) -> dict[str, Any]:
    """What one run's per-event figures mean for a cluster of ``nodes`` and ``pods``, ``churn``
    pod replacements a second (None: the same churn per pod as the run's ``--churn`` per its
    pods), the same Node status period, one agent
    per node, objects of the sizes measured, Services of ``--pods-per-service`` pods.

    Per agent: bytes a second = replacements a second x (pod + EndpointSlice bytes one
    watcher received per replacement) + Node status reports a second x the Node bytes per
    report, each the median over the run's watchers and windows. The API server: egress =
    agents x that; its CPU for it at the run's cores per byte sent to the watchers (its CPU
    with watchers, less the no-watcher phase's CPU scaled to the same churn, over the bytes
    to the watchers). Initial list per agent: every object it lists at the measured sizes.
    """
    p = r["params"]
    scale = pods / p["pods"]
    sizes = r["object_bytes"]
    services = pods // p["pods_per_service"]
    none = next((s for s in r["scopes"] if s["scope"] == "none"), None)
    out: dict[str, Any] = {"nodes": nodes, "pods": pods, "services": services}
    for s in r["scopes"]:
        if s["scope"] == "none":
            continue
        reps = [x["replacements_per_s"] for x in s["windows"]]
        by = [x["watcher_bytes_per_s_by_resource"] for x in s["windows"]]
        per_rep = statistics.median((b["pods"][i] + b["endpointslices"][i]) / rr
                                    for rr, b in zip(reps, by, strict=True) if rr for i in range(len(b["pods"])))
        reports = p["nodes"] / p["node_status_period"] if p["node_status_period"] else 0
        per_report = statistics.median(v / reports for b in by for v in b["nodes"]) if reports else 0
        rate = p["churn"] * scale if churn is None else churn
        agent_bps = rate * per_rep + (nodes / p["node_status_period"] if p["node_status_period"] else 0) * per_report
        cpu_per_byte = statistics.median(c / b for x in s["windows"]
                                         for c, b in zip(x["watcher_cpu_cores"], x["watcher_bytes_per_s"], strict=True)
                                         if b)
        api = statistics.median(x["cpu_cores"]["kube-apiserver"] for x in s["windows"])
        churn_cost = (statistics.median(x["cpu_cores"]["kube-apiserver"] for x in none["windows"])
                      / statistics.median(x["replacements_per_s"] for x in none["windows"])) if none else 0.0
        fanout = statistics.median(x["to_watchers_ip_bytes_per_s"] for x in s["windows"])
        cores_per_byte = max(0.0, api - churn_cost * statistics.median(reps)) / fanout if fanout else 0.0
        listed = (pods / nodes if s["scope"] == "node" else pods) * sizes["pod"] + nodes * sizes["node"] + \
            services * (sizes["endpointslice"] + sizes["service"])
        out[s["scope"]] = {
            "replacements_per_s": round(rate, 1),
            "bytes_per_replacement_per_agent": round(per_rep), "bytes_per_node_report_per_agent": round(per_report),
            "agent_bytes_per_s": round(agent_bps), "apiserver_egress_bytes_per_s": round(agent_bps * nodes),
            "agent_cpu_cores": round(agent_bps * cpu_per_byte, 4),
            "apiserver_cores_per_mb_s": round(cores_per_byte * 1e6, 4),
            "apiserver_watch_cores": round(agent_bps * nodes * cores_per_byte, 1),
            "initial_list_bytes_per_agent": round(listed), "initial_list_bytes_all_agents": round(listed * nodes)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Figures: BENCHMARKS.md, API fan-out.")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--pods-per-service", type=int, default=10)
    ap.add_argument("--watchers", type=int, default=50)
    ap.add_argument("--churn", type=float, default=10.0, help="pod replacements per second")
    ap.add_argument("--node-status-period", type=float, default=300.0,
                    help="seconds between two status reports of one Node (0: none)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds per measured window")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds of churn before the first window")
    ap.add_argument("--sync-timeout", type=float, default=900.0)
    ap.add_argument("--scopes", type=lambda s: s.split(","), default=["none", "cluster", "node"])
    ap.add_argument("--writers", type=int, default=16, help="writer threads while building the cluster")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ap.add_argument("--extrapolate", metavar="RESULT.json",
                    help="no run: what a run's JSON (-o json) means at --to-nodes/--to-pods")
    ap.add_argument("--to-nodes", type=int, default=5000)
    ap.add_argument("--to-pods", type=int, default=150000)
    ap.add_argument("--to-churn", type=float, default=None,
                    help="pod replacements per second there (default: the run's churn per pod)")
    ap.add_argument("--watcher", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    ap.add_argument("--pod-scope", default="cluster", help=argparse.SUPPRESS)
    ap.add_argument("--node", help=argparse.SUPPRESS)
    ap.add_argument("--stats", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.watcher:
        return watcher_main(a)
    if a.extrapolate:
        print(json.dumps(extrapolate(json.loads(Path(a.extrapolate).read_text()), a.to_nodes, a.to_pods,
                                     a.to_churn), indent=1))
        return 0
    if any(s not in ("none", "cluster", "node") for s in a.scopes):
        ap.error("--scopes: none, cluster, node")
    return main_bench(a)


if __name__ == "__main__":
    sys.exit(main())
