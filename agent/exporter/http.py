"""The agent's HTTP side: ``/metrics``, ``/healthz``, ``/readyz`` and ``/flows`` (WSGI, one thread)."""

from __future__ import annotations

import functools
import gzip
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import choose_encoder, generate_latest, gzip_accepted
from prometheus_client.openmetrics import exposition as om

from agent.errors import InputError, ZonemeterError

if TYPE_CHECKING:
    from agent.exporter.collector import Exporter

__all__ = ["MetricsServer", "Readiness", "build_time", "make_app", "make_readiness", "parse_address",
           "start_server"]

#: what a readiness check may raise and still mean "not ready" (a cache or datapath call
#: that failed); anything else is a bug and answers 500
READINESS_ERRORS: tuple[type[Exception], ...] = (LookupError, OSError, RuntimeError, ValueError,
                                                 ZonemeterError)

Readiness = Callable[[], tuple[bool, str]]


def make_readiness(datapath_attached: Callable[[], bool],
                   metadata_synced: Callable[[], Mapping[str, bool]]) -> Readiness:
    """Return the ``/readyz`` check: ready only when the datapath is attached and every
    metadata resource is synced; the text says which condition fails.

    Args:
        datapath_attached: True once the datapath programs are loaded and attached.
        metadata_synced: ``{resource: synced}`` (e.g. ``ClusterMetadata.synced``).
    """
    def check() -> tuple[bool, str]:
        problems = []
        if not datapath_attached():
            problems.append("datapath not attached")
        state = metadata_synced()
        stale = sorted(r for r, ok in state.items() if not ok)
        if not state:
            problems.append("metadata not started")
        elif stale:
            problems.append("metadata not synced: " + ", ".join(stale))
        if problems:
            return False, "not ready: " + "; ".join(problems)
        return True, "ready: datapath attached, metadata synced (" + ", ".join(sorted(state)) + ")"
    return check


def parse_address(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[V6]:PORT`` (``--metrics-address``).

    Raises:
        InputError: malformed address or port out of range.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"expected HOST:PORT, got {value!r}", source="--metrics-address")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        pass


def _is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback peers."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


def make_app(exporter: Exporter, readiness: Readiness, *,
             flows_remote: bool = False) -> Callable[..., Iterable[bytes]]:
    """Return the WSGI app: ``/metrics`` (prometheus_client), ``/healthz``, ``/readyz``,
    ``/flows?top=N`` (JSON, N default 20, at most 1000).

    ``/flows`` carries pod names and peer IPs, so it answers only loopback peers unless
    ``flows_remote`` is set (403 otherwise): with ``hostNetwork`` the metrics port is
    reachable from every pod, and per-pair detail is for ``zonemeter top`` run on the node
    (``kubectl exec`` into the agent pod). See docs/security.md.
    """
    metrics_app = make_wsgi_app(exporter.registry())

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            fast = _fast_metrics(exporter, environ)
            if fast is None:  # what only the library writes: prometheus_client's own app
                out: Iterable[bytes] = metrics_app(environ, start_response)
                return out
            start_response("200 OK", fast[0])
            return [fast[1]]

        def reply(status: str, body: bytes, ctype: str = "text/plain; charset=utf-8") -> list[bytes]:
            start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
            return [body]

        if path == "/healthz":
            return reply("200 OK", b"ok\n")
        if path == "/readyz":
            try:
                ok, text = readiness()
            except READINESS_ERRORS as err:  # a failing check means not ready
                ok, text = False, f"not ready: readiness check failed: {err}"
            return reply("200 OK" if ok else "503 Service Unavailable", (text + "\n").encode())
        if path == "/flows":
            if not flows_remote and not _is_loopback(str(environ.get("REMOTE_ADDR", ""))):
                return reply("403 Forbidden",
                             b"/flows answers loopback only (run zonemeter top on the node, "
                             b"or start the agent with --flows-allow-remote)\n")
            qs = parse_qs(environ.get("QUERY_STRING", ""))
            try:
                top = min(max(int(qs.get("top", ["20"])[0]), 0), 1000)
            except ValueError:
                return reply("400 Bad Request", b"top must be an integer\n")
            body = json.dumps(exporter.flows(top), sort_keys=True).encode()
            return reply("200 OK", body, "application/json")
        return reply("404 Not Found", b"not found: try /metrics, /healthz, /readyz, /flows\n")

    return app


def _fast_metrics(exporter: Exporter, environ: dict[str, Any]
                  ) -> tuple[list[tuple[str, str]], bytes] | None:
    """``(headers, body)`` of a ``GET /metrics`` answered with :meth:`Exporter.render` (the
    library's text, written once per snapshot, so the second Prometheus of an HA pair costs
    nothing), with the content type and gzip encoding prometheus_client's app would choose
    for the request (``choose_encoder``, ``gzip_accepted``); None when the library's own app
    answers: another method, a ``name[]`` filter, the ``dots`` name escaping, or a format
    it may add."""
    if environ.get("REQUEST_METHOD", "GET") != "GET" or "name[]" in parse_qs(
            environ.get("QUERY_STRING", "")):
        return None
    encoder, ctype = choose_encoder(environ.get("HTTP_ACCEPT", ""))
    func, kw = (encoder.func, encoder.keywords) if isinstance(encoder, functools.partial) else (
        encoder, {})
    if kw.get("escaping", om.UNDERSCORES) == om.DOTS:  # rewrites "_" in every name
        return None
    if func is generate_latest:
        body = exporter.render()
    elif func is om.generate_latest and kw.get("version", "1.0.0") == "1.0.0":
        body = exporter.render(openmetrics=True)
    else:
        return None
    headers = [("Content-Type", ctype)]
    if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        body = gzip.compress(body)
        headers.append(("Content-Encoding", "gzip"))
    return headers, body


class MetricsServer:
    """The HTTP server thread (see :func:`start_server`).

    Attributes:
        host, port: where it listens (port resolved when 0 was asked).
    """

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:11808``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_server(exporter: Exporter, address: str = "0.0.0.0:11808",
                 readiness: Readiness | None = None, *,
                 flows_remote: bool = False) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz``, ``/readyz``, ``/flows`` on ``address`` in a thread.

    Args:
        exporter: the collector to expose.
        address: ``HOST:PORT`` (``[::]:11808`` for IPv6; port 0 picks a free one).
        readiness: see :func:`make_readiness`; default: always ready.
        flows_remote: let non-loopback peers read ``/flows`` (see :func:`make_app`).

    Raises:
        InputError: malformed address.
        OSError: the address cannot be bound.
    """
    host, port = parse_address(address)
    check = readiness or (lambda: (True, "ready"))

    class Server(_ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, make_app(exporter, check, flows_remote=flows_remote), server_class=Server,
                         handler_class=_QuietHandler)
    return MetricsServer(server)


def build_time() -> float:
    """Seconds since the epoch (for ``ExportSnapshot.generated_at``)."""
    return time.time()
