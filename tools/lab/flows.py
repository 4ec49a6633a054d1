"""Traffic from the lab's side: start clients in pod namespaces and collect their results.

The client and server processes are :mod:`tools.lab.traffic`; this module starts them
(``ip netns exec``) and turns their JSON line into :class:`FlowResult`.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.errors import InputError, RuntimeFailure
from tools.lab.netns import LabNamespaces, netns_mod
from tools.lab.proc import ROOT, child_env, in_cgroup

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: the client name of :meth:`tools.lab.netns.LabNamespaces.build_outside`'s peer (not a pod
#: name: pod names are DNS subdomains)
OUTSIDE = "@outside"

#: IP + transport header bytes of one UDP datagram, per family
UDP_OVERHEAD = {4: 20 + 8, 6: 40 + 8}


@dataclass(frozen=True, slots=True)
class FlowResult:
    """Outcome of one :meth:`Lab.run_flow`.

    Attributes:
        client: client pod name (or :data:`OUTSIDE`, or an outside peer's ``outside/<name>``).
        dst: destination address (pod IP, node IP or ClusterIP); several separated by commas
            for a client that balances itself.
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
            raise RuntimeFailure(f"traffic client {self._args} overran {self._deadline:.0f}s") from None
        if self._proc.returncode != 0:
            raise RuntimeFailure(f"traffic client {self._args} failed: {err.strip()[-500:]}")
        data = json.loads(out.strip().splitlines()[-1])
        client, dst, port, proto = self._args
        return FlowResult(client=client, dst=dst, port=port, proto=proto, ok=data["ok"],
                          failed=data["failed"], errors=tuple(data["errors"]),
                          request_payload_bytes=data["request_payload_bytes"],
                          response_payload_bytes=data["response_payload_bytes"],
                          elapsed_seconds=data["elapsed_seconds"])


class LabTraffic(LabNamespaces):
    """Request/response clients run inside the lab (part of :class:`tools.lab.Lab`)."""

    def start_flow(self, client_pod: str, dst_ip: str | IPAddress | Sequence[str | IPAddress], port: int,
                   proto: str = "tcp", request_bytes: int = 100, response_bytes: int = 100,
                   count: int = 1, rate: float | None = None, timeout: float = 5.0,
                   reuse: bool = False) -> FlowHandle:
        """Start a client in ``client_pod``'s namespace; see :meth:`run_flow`."""
        app = None  # the pod's cgroup (tools/lab/proc.py, "pod cgroups")
        if client_pod == OUTSIDE:
            if self.outside_netns not in netns_mod().listnetns():
                raise InputError("the lab has no outside peer (build_outside)", obj="flow", field="client")
            ns, client = self.outside_netns, OUTSIDE
        elif client_pod.startswith("outside/"):
            peer = self.topology.peer(client_pod)
            ns, client = self.peer_netns(peer.name), peer.key
        else:
            pod = self.topology.pod(client_pod)
            ns, client = self.pod_netns(pod.name), pod.name
            app = self.pod_cgroup(pod.name)
        texts = [str(a) for a in dst_ip] if isinstance(dst_ip, (list, tuple)) else str(dst_ip).split(",")
        try:
            dsts = [ipaddress.ip_address(t.strip()) for t in texts]
        except ValueError:
            raise InputError(f"not an IP address: {dst_ip!r}", obj="flow", field="dst_ip") from None
        if not dsts or (reuse and len(dsts) > 1) or len({d.version for d in dsts}) > 1:
            raise InputError("give one address, or several of one family without reuse", obj="flow",
                             field="dst_ip")
        dst = dsts[0]
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
        argv = ["ip", "netns", "exec", ns, sys.executable, "-m",
                "tools.lab.traffic", "client", "--proto", proto, "--dst", ",".join(str(d) for d in dsts),
                "--port", str(port), "--request-bytes", str(request_bytes),
                "--response-bytes", str(response_bytes), "--count", str(count),
                "--timeout", str(timeout)]
        if rate:
            argv += ["--rate", str(rate)]
        if reuse:
            argv.append("--reuse")
        budget = timeout * 3 + (count / rate if rate else count * timeout) + 10
        proc = subprocess.Popen(in_cgroup(app, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, cwd=ROOT, env=child_env())
        return FlowHandle(proc, client, ",".join(str(d) for d in dsts), port, proto, budget)

    def run_flow(self, client_pod: str, dst_ip: str | IPAddress | Sequence[str | IPAddress], port: int,
                 proto: str = "tcp", request_bytes: int = 100, response_bytes: int = 100,
                 count: int = 1, rate: float | None = None, timeout: float = 5.0,
                 reuse: bool = False) -> FlowResult:
        """Run ``count`` real request/response exchanges from inside ``client_pod``.

        Args:
            client_pod: client pod name (a host-network pod runs in its node's namespace),
                :data:`OUTSIDE` for the peer of ``build_outside``, or ``outside/<name>`` for
                an outside peer of the topology.
            dst_ip: a pod IP, node IP or ClusterIP of this lab; several (a sequence, or text
                separated by commas): exchange ``i`` goes to the ``i mod n``-th, a client
                that balances itself (not with ``reuse``).
            port: destination port (Service port for a ClusterIP, node port for a node IP).
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
