"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) inside a network namespace.

The binaries are the ones ``tools/kube/build.sh`` builds from their Go modules into
``/var/cache/zonemeter/{kube,etcd}/<version>/``. Everything runs inside a network namespace the
caller already created (``ip netns exec NS ...``), never in the host's: etcd listens on the
namespace's loopback only, kube-apiserver on every address of the namespace.

Usage::

    cp = ControlPlane("zm-cp", "10.250.0.10", "10.96.0.0/16", Path("/tmp/cp"))
    cp.start()                      # certificates, keys, processes; waits for /readyz
    cp.kubectl("get", "endpointslices", "-A", "-o", "yaml")
    print(cp.kubeconfig)            # admin kubeconfig (system:masters client certificate)
    cp.stop()

or as a context manager (``with ControlPlane(...) as cp:``). From the command line::

    python -m tools.kube.controlplane --netns zm-cp --address 10.250.0.10 \\
        --service-cidr 10.96.0.0/16 --workdir /tmp/cp     # runs until SIGINT/SIGTERM

Certificates and keys come from the ``openssl`` CLI (Debian's openssl package): one CA, the
apiserver's serving certificate, client certificates for the admin, kube-proxy and
kube-controller-manager, and the service-account signing key pair. They are lab credentials,
valid for two days, written with mode 0600 under the work directory.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

CACHE_ROOT = Path(os.environ.get("ZONEMETER_CACHE", "/var/cache/zonemeter"))
_HERE = Path(__file__).resolve().parent

#: Controllers kube-controller-manager runs: the EndpointSlice controller and what it needs to
#: work as in a cluster (service accounts and their tokens for --use-service-account-credentials,
#: namespace deletion, garbage collection of owned slices). Not nodelifecycle: no kubelet runs,
#: so it would mark every Node NotReady and taint it.
CONTROLLERS = ("endpointslice", "serviceaccount", "serviceaccount-token", "namespace", "garbagecollector")

APISERVER_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
KCM_PORT = 10257


class ControlPlaneError(RuntimeError):
    """The control plane could not be set up or did not become ready (message names the part)."""


def pinned_kube_version() -> str:
    """The Kubernetes release ``tools/kube/build.sh`` builds by default.

    Returns:
        The ``k8s.io/kubernetes`` version required by the committed ``tools/kube/go.mod``,
        e.g. ``"v1.37.2"``; ``$ZONEMETER_KUBE_VERSION`` overrides it.

    Raises:
        ControlPlaneError: tools/kube/go.mod names no k8s.io/kubernetes version.
    """
    env = os.environ.get("ZONEMETER_KUBE_VERSION")
    if env:
        return env
    m = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", (_HERE / "go.mod").read_text(), re.M)
    if not m:
        raise ControlPlaneError("tools/kube/go.mod: no k8s.io/kubernetes requirement")
    return m.group(1)


@dataclass(frozen=True, slots=True)
class Binaries:
    """Paths of the built components of one Kubernetes release and its etcd."""

    kube_version: str
    etcd_version: str
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_proxy: Path
    kubectl: Path

    @classmethod
    def find(cls, kube_version: str | None = None, cache: Path = CACHE_ROOT) -> Binaries:
        """Locate the binaries ``tools/kube/build.sh`` cached for a release.

        Args:
            kube_version: e.g. ``"v1.37.2"``; default :func:`pinned_kube_version`.
            cache: the cache root (``$ZONEMETER_CACHE``, default ``/var/cache/zonemeter``).

        Returns:
            The binaries; the etcd version is the one the build stamp of that release records.

        Raises:
            ControlPlaneError: the release is not built (names the missing file and the command).
        """
        kv = kube_version or pinned_kube_version()
        kdir = cache / "kube" / kv
        stamp = kdir / ".stamp"
        hint = f"build them with: KUBE_VERSION={kv} bash tools/kube/build.sh"
        if not stamp.is_file():
            raise ControlPlaneError(f"Kubernetes {kv} is not built ({stamp} missing); {hint}")
        fields = dict(line.split(" ", 1) for line in stamp.read_text().splitlines() if " " in line)
        ev = fields.get("etcd", "")
        b = cls(kv, ev, cache / "etcd" / ev / "etcd", kdir / "kube-apiserver",
                kdir / "kube-controller-manager", kdir / "kube-proxy", kdir / "kubectl")
        for p in (b.etcd, b.kube_apiserver, b.kube_controller_manager, b.kube_proxy, b.kubectl):
            if not os.access(p, os.X_OK):
                raise ControlPlaneError(f"{p} is missing or not executable; {hint}")
        return b


def kubernetes_service_ip(service_cidr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """ClusterIP of the ``default/kubernetes`` Service for a ``--service-cluster-ip-range``.

    Rule from kube-apiserver (pkg/controlplane/services.go, ServiceIPRange): the first address
    after the network address of the primary (first) range.

    Args:
        service_cidr: one CIDR or a comma-separated dual-stack pair, e.g. ``"10.96.0.0/16,fd00::/108"``.

    Returns:
        The address, e.g. ``IPv4Address('10.96.0.1')``.

    Raises:
        ControlPlaneError: the range is not a CIDR.
    """
    first = service_cidr.split(",")[0].strip()
    try:
        net = ipaddress.ip_network(first, strict=True)
    except ValueError as e:
        raise ControlPlaneError(f"service_cidr {service_cidr!r}: {e}") from None
    return net.network_address + 1


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie; a zombie child of ours is reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state != "Z":
        return True
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return False


def _run(cmd: list[str], *, cwd: Path | None = None, input: str | None = None) -> str:
    p = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, text=True)
    if p.returncode != 0:
        raise ControlPlaneError(f"{cmd[0]} {' '.join(cmd[1:3])}... failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return p.stdout


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager running in one network namespace.

    Args:
        netns: name of an existing network namespace (``ip netns``); its loopback is brought up.
        address: an address of that namespace the apiserver advertises (``--advertise-address``)
            and serves on, e.g. ``"10.250.0.10"``; it is in the serving certificate's SANs.
        service_cidr: ``--service-cluster-ip-range`` of apiserver and controller manager (one
            CIDR or a dual-stack pair); its first address (the ``kubernetes`` Service) is a SAN too.
        workdir: directory for certificates, kubeconfigs, etcd data and logs (created).
        binaries: the components; default :meth:`Binaries.find` for the pinned release.
        extra_apiserver_args: appended to kube-apiserver's command line.

    Raises:
        ControlPlaneError: ``address`` or ``service_cidr`` is malformed, or the release is not built.
    """

    def __init__(self, netns: str, address: str, service_cidr: str, workdir: Path, *,
                 binaries: Binaries | None = None, extra_apiserver_args: tuple[str, ...] = ()) -> None:
        try:
            self.address = ipaddress.ip_address(address)
        except ValueError as e:
            raise ControlPlaneError(f"address {address!r}: {e}") from None
        self.netns = netns
        self.service_cidr = service_cidr
        self.service_ip = kubernetes_service_ip(service_cidr)
        self.workdir = Path(workdir)
        self.binaries = binaries or Binaries.find()
        self.extra_apiserver_args = extra_apiserver_args
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._pids: dict[str, int] = {}
        self._argv: dict[str, list[str]] = {}
        self._ready: dict[str, list[str]] = {}

    # -- paths -----------------------------------------------------------------------------
    @property
    def pki(self) -> Path:
        """Directory of the CA, certificates and keys."""
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client certificate in ``system:masters``), usable inside the namespace."""
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        """The apiserver's URL, e.g. ``https://10.250.0.10:6443``."""
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"https://{host}:{APISERVER_PORT}"

    def log(self, component: str) -> Path:
        """Log file of ``component`` (``etcd``, ``kube-apiserver``, ``kube-controller-manager``)."""
        return self.workdir / f"{component}.log"

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout_s: float = 180.0) -> None:
        """Generate credentials, start the three components in order, wait until they serve.

        Args:
            timeout_s: for each of etcd and kube-apiserver to become ready (seconds); the machine
                may be loaded, and the apiserver's first start installs every bootstrap object.

        Raises:
            ControlPlaneError: the namespace does not exist, a tool failed, or a component exited or
                did not become ready in time (the message names it and the tail of its log). Whatever
                was started is stopped before the error is raised.
        """
        if not Path(f"/run/netns/{self.netns}").exists():
            raise ControlPlaneError(f"network namespace {self.netns!r} does not exist (ip netns add {self.netns})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            _run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
            self._make_pki()
            self._start_etcd(timeout_s)
            self._start_apiserver(timeout_s)
            self._start_controller_manager(timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the components in reverse order: SIGTERM, then SIGKILL after ``grace_s`` seconds."""
        for name in reversed(list(self._procs)):
            p = self._procs.pop(name)
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(grace_s)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def detach(self) -> None:
        """Forget the started components without stopping them: they run on after this process
        exits (``zonemeter lab up``), and whoever removes their namespace ends them
        (``zonemeter lab down``). :meth:`stop` then stops nothing."""
        self._procs.clear()

    def restart(self, component: str, timeout_s: float = 180.0) -> None:
        """Stop one component (SIGTERM) and start it again with the same flags and data.

        Works on a detached control plane too (:meth:`stop_component`, :meth:`start_component`).

        Args:
            component: ``etcd``, ``kube-apiserver`` or ``kube-controller-manager``.
            timeout_s: for it to be ready again (seconds).

        Raises:
            ControlPlaneError: it was not started, or did not become ready again.
        """
        self.stop_component(component)
        self.start_component(component, timeout_s)

    def _record(self, component: str) -> dict[str, object]:
        """What :meth:`_spawn` and :meth:`_wait` wrote to ``<workdir>/<component>.json``."""
        try:
            return json.loads((self.workdir / f"{component}.json").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            raise ControlPlaneError(f"{component!r}: not started (no {self.workdir / (component + '.json')})") from None

    def stop_component(self, component: str, grace_s: float = 10.0) -> None:
        """Stop one component: SIGTERM, SIGKILL after ``grace_s`` seconds; returns once it exited.

        The process id comes from ``<workdir>/<component>.json`` (written when it was started),
        so this works on a :meth:`detach`-ed control plane and from another ``ControlPlane``
        object for the same work directory (``Lab.control_plane()``).

        Raises:
            ControlPlaneError: it was never started in this work directory.
        """
        pid = int(str(self._record(component)["pid"]))
        p = self._procs.pop(component, None)
        if p is not None:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(grace_s)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            return
        if not _alive(pid):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + grace_s
            time.sleep(0.1)

    def start_component(self, component: str, timeout_s: float = 180.0) -> None:
        """Start one stopped component again with the flags and data of its first start, and
        wait until it is ready (the same probe as :meth:`start`).

        Raises:
            ControlPlaneError: it was never started here, or it exited or was not ready in time.
        """
        rec = self._record(component)
        argv = [str(a) for a in rec["argv"]]  # type: ignore[attr-defined]
        ready = [str(a) for a in rec.get("ready") or []]  # type: ignore[attr-defined]
        self._spawn(component, argv)
        self._wait(component, timeout_s, ready)

    def compact_etcd(self) -> int:
        """Write one key to etcd and compact its history up to that write (physically).

        Through etcd's gRPC gateway (``POST /v3/kv/put``, ``POST /v3/kv/compaction``, etcd's
        api/etcdserverpb/rpc.proto) on the namespace's loopback: every revision before the
        returned one is gone, so a watch from an older resourceVersion that reaches etcd is
        answered ``410 Gone`` ("required revision has been compacted"), and kube-apiserver's
        watch cache, started after this, holds nothing older either.

        Returns:
            The revision compacted to (etcd's ``header.revision`` of the write).

        Raises:
            ControlPlaneError: etcd did not answer (message has the probe's stderr).
        """
        script = (
            "import base64,json,sys,urllib.request\n"
            "def post(path, body):\n"
            "    r = urllib.request.Request(sys.argv[1] + path, data=json.dumps(body).encode(), method='POST')\n"
            "    return json.load(urllib.request.urlopen(r, timeout=10))\n"
            "b = lambda s: base64.b64encode(s.encode()).decode()\n"
            "rev = int(post('/v3/kv/put', {'key': b('/zonemeter-lab/compact'), 'value': b('x')})"
            "['header']['revision'])\n"
            "post('/v3/kv/compaction', {'revision': rev, 'physical': True})\n"
            "print(rev)\n")
        out = _run(["ip", "netns", "exec", self.netns, sys.executable, "-c", script,
                    f"http://127.0.0.1:{ETCD_CLIENT_PORT}"])
        return int(out.strip())

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each component started by the last :meth:`start` (kept after :meth:`stop`)."""
        return dict(self._pids)

    def running(self) -> dict[str, bool]:
        """Whether each started component's process is alive, by component name."""
        return {n: p.poll() is None for n, p in self._procs.items()}

    # -- client ----------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the release's kubectl inside the namespace with the admin kubeconfig.

        Args:
            args: kubectl arguments, e.g. ``("get", "nodes", "-o", "json")``.
            input: text for kubectl's stdin (``apply -f -``).
            check: raise on a non-zero exit.

        Returns:
            The completed process (text stdout and stderr).

        Raises:
            ControlPlaneError: kubectl exited non-zero and ``check`` is set (message has its stderr).
        """
        cmd = ["ip", "netns", "exec", self.netns, str(self.binaries.kubectl),
               f"--kubeconfig={self.kubeconfig}", *args]
        p = subprocess.run(cmd, input=input, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    # -- credentials -----------------------------------------------------------------------
    def _make_pki(self) -> None:
        d = self.pki
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        ssl = ["openssl"]
        if not shutil.which("openssl"):
            raise ControlPlaneError("openssl not found (Debian package openssl)")
        days = "2"
        # the cluster CA, and the front-proxy CA kube-apiserver's request-header authentication
        # trusts (a separate CA, as kubeadm makes: certs/certlist.go, KubeadmCertFrontProxyCA)
        for ca, cn in (("ca", "zonemeter-lab-ca"), ("front-proxy-ca", "zonemeter-lab-front-proxy-ca")):
            _run([*ssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                  "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", days, "-subj", f"/CN={cn}",
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], cwd=d)
        # service-account token signing key (RS256, what kube-apiserver signs with by default)
        _run([*ssl, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key"], cwd=d)
        _run([*ssl, "pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"], cwd=d)
        sans = [f"IP:{self.address}", "IP:127.0.0.1", f"IP:{self.service_ip}", "DNS:localhost",
                "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local"]
        self._sign("apiserver", "/CN=kube-apiserver", "serverAuth", sans)
        # Users the bootstrap RBAC policy knows: system:masters (admin) and
        # system:kube-controller-manager (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go).
        self._sign("admin", "/O=system:masters/CN=zonemeter-admin", "clientAuth", [])
        self._sign("kube-controller-manager", "/CN=system:kube-controller-manager", "clientAuth", [])
        # kube-proxy's user: the bootstrap policy binds system:node-proxier to it
        self._sign("kube-proxy", "/CN=system:kube-proxy", "clientAuth", [])
        self._sign("front-proxy-client", "/CN=front-proxy-client", "clientAuth", [], ca="front-proxy-ca")
        for f in d.iterdir():
            os.chmod(f, 0o600)
        self._write_kubeconfig(self.kubeconfig, "admin", self.server)
        # the controller manager talks to the apiserver over the namespace's loopback
        self._write_kubeconfig(self.workdir / "kube-controller-manager.kubeconfig", "kube-controller-manager",
                               f"https://127.0.0.1:{APISERVER_PORT}")

    def client_kubeconfig(self, path: Path, user: str, server: str | None = None) -> Path:
        """Write a kubeconfig for one of the client certificates :meth:`start` made.

        Args:
            path: where to write it (mode 0600).
            user: ``admin``, ``kube-controller-manager`` or ``kube-proxy``.
            server: the apiserver URL as the user reaches it; default :attr:`server`.

        Returns:
            ``path``.

        Raises:
            ControlPlaneError: no such client certificate (not started, or an unknown user).
        """
        if not (self.pki / f"{user}.crt").is_file():
            raise ControlPlaneError(f"no client certificate for {user!r} in {self.pki}")
        self._write_kubeconfig(path, user, server or self.server)
        return path

    def token_kubeconfig(self, path: Path, namespace: str, account: str, server: str | None = None,
                         duration: str = "48h") -> Path:
        """Write a kubeconfig holding a token the apiserver issues for a ServiceAccount.

        The token comes from the TokenRequest API (``kubectl create token``), as a projected
        service-account token of a Pod would.

        Args:
            path: where to write it (mode 0600).
            namespace, account: the ServiceAccount (it must exist).
            server: the apiserver URL as the user reaches it; default :attr:`server`.
            duration: the token's lifetime (a Go duration, e.g. ``"48h"``).

        Returns:
            ``path``.

        Raises:
            ControlPlaneError: the token request failed (no such account).
        """
        token = self.kubectl("create", "token", account, "-n", namespace, f"--duration={duration}").stdout.strip()
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: zonemeter-lab\n  cluster:\n    server: {server or self.server}\n"
            f"    certificate-authority: {self.pki / 'ca.crt'}\n"
            f"users:\n- name: {account}\n  user:\n    token: {token}\n"
            f"contexts:\n- name: {account}@zonemeter-lab\n  context:\n    cluster: zonemeter-lab\n"
            f"    user: {account}\n"
            f"current-context: {account}@zonemeter-lab\n")
        os.chmod(path, 0o600)
        return path

    def _sign(self, name: str, subject: str, usage: str, sans: list[str], ca: str = "ca") -> None:
        d = self.pki
        _run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
              "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject], cwd=d)
        ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
               f"extendedKeyUsage={usage}"]
        if sans:
            ext.append("subjectAltName=" + ",".join(sans))
        (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _run(["openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
              "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt"], cwd=d)

    def _write_kubeconfig(self, path: Path, user: str, server: str) -> None:
        p = self.pki
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: zonemeter-lab\n  cluster:\n    server: {server}\n"
            f"    certificate-authority: {p / 'ca.crt'}\n"
            f"users:\n- name: {user}\n  user:\n    client-certificate: {p / (user + '.crt')}\n"
            f"    client-key: {p / (user + '.key')}\n"
            f"contexts:\n- name: {user}@zonemeter-lab\n  context:\n    cluster: zonemeter-lab\n    user: {user}\n"
            f"current-context: {user}@zonemeter-lab\n")
        os.chmod(path, 0o600)

    # -- components ------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log(name), "ab")  # noqa: SIM115 - owned by the child from here on
        try:
            # `ip netns exec` execs the binary after setns: the pid is the component's
            p = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self._procs[name] = p
        self._pids[name] = p.pid
        self._argv[name] = argv
        (self.workdir / f"{name}.json").write_text(json.dumps({"pid": p.pid, "argv": argv}))
        return p

    def _tail(self, name: str, n: int = 15) -> str:
        try:
            lines = self.log(name).read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def _wait(self, name: str, timeout_s: float, ready: list[str]) -> None:
        """Poll ``ready`` (a command run in the namespace) until it succeeds or ``name`` exits."""
        self._ready[name] = ready
        rec = self.workdir / f"{name}.json"
        rec.write_text(json.dumps({**json.loads(rec.read_text()), "ready": ready}))
        p = self._procs[name]
        deadline = time.monotonic() + timeout_s
        while True:
            if p.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {p.returncode}; last log lines "
                                        f"({self.log(name)}):\n{self._tail(name)}")
            r = subprocess.run(["ip", "netns", "exec", self.netns, *ready], capture_output=True, text=True)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{name} not ready after {timeout_s:.0f} s ({r.stderr.strip()[-300:]}); "
                                        f"last log lines ({self.log(name)}):\n{self._tail(name)}")
            time.sleep(0.5)

    def _start_etcd(self, timeout_s: float) -> None:
        client = f"http://127.0.0.1:{ETCD_CLIENT_PORT}"
        peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
        self._spawn("etcd", [
            str(self.binaries.etcd), "--name=zonemeter", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=zonemeter={peer}", "--initial-cluster-state=new",
            # a lab database on a shared, loaded machine: fsync latency would only slow tests down
            "--unsafe-no-fsync", "--log-level=warn",
        ])
        # kube-apiserver's etcd health check reads the same endpoint (GET /health)
        self._wait_http("etcd", timeout_s, f"{client}/health")

    def _wait_http(self, name: str, timeout_s: float, url: str) -> None:
        # Python itself runs the probe inside the namespace: no curl needed.
        probe = [sys.executable, "-c",
                 "import sys,urllib.request;"
                 "r=urllib.request.urlopen(sys.argv[1],timeout=2);"
                 "sys.exit(0 if r.status==200 and b'true' in r.read() else 1)", url]
        self._wait(name, timeout_s, probe)

    def _start_apiserver(self, timeout_s: float) -> None:
        p = self.pki
        bind = "::" if self.address.version == 6 else "0.0.0.0"
        self._spawn("kube-apiserver", [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--advertise-address={self.address}", f"--bind-address={bind}", f"--secure-port={APISERVER_PORT}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true", "--profiling=false", "--v=1",
            *self.extra_apiserver_args,
        ])
        self._wait("kube-apiserver", timeout_s,
                   [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", "get", "--raw=/readyz"])

    def _start_controller_manager(self, timeout_s: float) -> None:
        p = self.pki
        kc = self.workdir / "kube-controller-manager.kubeconfig"
        self._spawn("kube-controller-manager", [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={KCM_PORT}",
            f"--controllers={','.join(CONTROLLERS)}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
            f"--service-cluster-ip-range={self.service_cidr}", "--leader-elect=false", "--v=1",
        ])
        # its /healthz needs no credentials beyond what the authorization kubeconfig allows; a
        # started controller manager is one whose secure port answers
        probe = [sys.executable, "-c",
                 "import ssl,sys,urllib.request;c=ssl._create_unverified_context();"
                 "r=urllib.request.urlopen(sys.argv[1],timeout=2,context=c);"
                 "sys.exit(0 if r.status==200 else 1)", f"https://127.0.0.1:{KCM_PORT}/healthz"]
        self._wait("kube-controller-manager", timeout_s, probe)


def main(argv: list[str] | None = None) -> int:
    """Run a control plane in a namespace until SIGINT/SIGTERM (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--netns", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--service-cidr", required=True)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--kube-version", default=None)
    a = ap.parse_args(argv)
    try:
        cp = ControlPlane(a.netns, a.address, a.service_cidr, a.workdir, binaries=Binaries.find(a.kube_version))
        cp.start()
    except ControlPlaneError as e:
        print(f"controlplane: {e}", file=sys.stderr)
        return 2
    print(f"controlplane: ready at {cp.server} (Kubernetes {cp.binaries.kube_version}, etcd "
          f"{cp.binaries.etcd_version}); KUBECONFIG={cp.kubeconfig} ip netns exec {cp.netns} "
          f"{cp.binaries.kubectl} get endpointslices -A", flush=True)
    stop = False

    def on_signal(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop and all(cp.running().values()):
        time.sleep(0.5)
    dead = [n for n, alive in cp.running().items() if not alive]
    cp.stop()
    if dead:
        print(f"controlplane: {', '.join(dead)} exited; logs in {a.workdir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
