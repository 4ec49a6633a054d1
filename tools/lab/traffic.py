"""Traffic generator of the lab: request/response servers and clients, TCP and UDP.

Run inside a lab network namespace (the lab does this for you)::

    ip netns exec NS python -m tools.lab.traffic server --listen tcp:8080 --listen udp:5353
    ip netns exec NS python -m tools.lab.traffic client --proto tcp --dst 10.96.0.10 \\
        --port 80 --request-bytes 1000 --response-bytes 20000 --count 10

Wire protocol (application payload, both protocols): a request is ``request_bytes``
bytes whose first 8 bytes are two big-endian unsigned 32-bit integers, the request's own
length and the response length the client wants; the rest is filler. The server answers
with exactly that many bytes.

* TCP: one connection per exchange unless ``--reuse`` (then the top bit of the response
  length in every request but the last asks the server to keep the connection open).
  After the last response the server closes its side first; the client reads to end of
  stream, then closes with ``SO_LINGER`` so that ``close()`` returns only after the server acknowledged the
  client's FIN. When the client process exits, every packet of its connections has
  therefore passed the server's netfilter hooks, which makes the lab's ground truth
  readable without waiting.
* UDP: one datagram each way per exchange (a fresh socket, hence a fresh source port and a
  fresh DNAT choice, per exchange unless ``--reuse``). Sizes must fit the path MTU: the
  lab refuses larger ones, since IP fragments would be reassembled before the netfilter
  INPUT hook and the counters would no longer see wire packets.

Both sides are bounded: the client by ``--count`` and ``--timeout`` (seconds), the server
by ``--max-seconds``. The client prints one JSON object (see :func:`run_client`).

``--dst`` may list several addresses separated by commas: exchange ``i`` goes to the
``i mod n``-th, a client that balances itself (a mesh sidecar, gRPC client balancing, a
headless Service's DNS answers, a load balancer spreading over its targets), in equal shares.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

HEADER = struct.Struct("!II")
#: smallest request: the header itself (bytes)
MIN_REQUEST_BYTES = HEADER.size
_CHUNK = 65536


def _request_payload(request_bytes: int, response_bytes: int) -> bytes:
    return HEADER.pack(request_bytes, response_bytes) + b"z" * (request_bytes - HEADER.size)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        chunk = sock.recv(min(n, _CHUNK))
        if not chunk:
            raise ConnectionError("peer closed early")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


# ---------------------------------------------------------------- server


def _serve_tcp(conn: socket.socket) -> None:
    """Serve exchanges on one connection. A request whose response length has the top bit
    set asks to keep the connection open; any other is the last one: the server answers,
    closes its side first (HTTP/1.0 style) and waits for the client's FIN."""
    try:
        conn.settimeout(30)
        while True:
            head = conn.recv(HEADER.size, socket.MSG_WAITALL)
            if len(head) < HEADER.size:
                break  # client went away
            req_len, resp_len = HEADER.unpack(head)
            if req_len > HEADER.size:
                _recv_exact(conn, req_len - HEADER.size)
            conn.sendall(b"r" * (resp_len & 0x7FFFFFFF))
            if not resp_len & 0x80000000:
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(_CHUNK):  # wait for the client's FIN
                    pass
                break
    except OSError:
        pass
    finally:
        conn.close()


def _bind(proto: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", port))
    if proto == "tcp":
        sock.listen(512)
    return sock


def _tcp_loop(srv: socket.socket) -> None:
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_tcp, args=(conn,), daemon=True).start()


def _udp_loop(srv: socket.socket) -> None:
    while True:
        data, peer = srv.recvfrom(_CHUNK)
        if len(data) < HEADER.size:
            continue
        req_len, resp_len = HEADER.unpack_from(data)
        if req_len != len(data):
            continue
        srv.sendto(b"r" * (resp_len & 0x7FFFFFFF), peer)


def run_server(listen: list[tuple[str, int]], max_seconds: float) -> None:
    """Serve request/response exchanges on every ``(proto, port)`` for ``max_seconds``.

    Binds ``[::]`` dual-stack, so IPv4 and IPv6 clients both reach it. Prints ``ready``
    on stdout once every socket is bound, then points stdout/stderr at /dev/null so the
    parent may go away. Exits with status 1 at once if a port cannot be bound.
    """
    try:
        socks = [(proto, _bind(proto, port)) for proto, port in listen]
    except OSError as err:
        print(f"error {err}", flush=True)
        sys.exit(1)
    threads = []
    for proto, sock in socks:
        t = threading.Thread(target=_tcp_loop if proto == "tcp" else _udp_loop, args=(sock,),
                             daemon=True)
        t.start()
        threads.append(t)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        if not all(t.is_alive() for t in threads):
            sys.exit(1)
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


# ---------------------------------------------------------------- client


def _family(dst: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in dst else socket.AF_INET


def _tcp_exchange(dst: str, port: int, req: bytes, resp_len: int, timeout: float) -> int:
    with socket.socket(_family(dst), socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        # close() blocks until our FIN is acknowledged (see module docstring)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, int(timeout) + 1))
        sock.connect((dst, port))
        sock.sendall(req)
        got = 0
        while True:
            chunk = sock.recv(_CHUNK)
            if not chunk:
                break
            got += len(chunk)
        if got != resp_len:
            raise ConnectionError(f"short response: {got} of {resp_len} bytes")
        return got


def run_client(proto: str, dst: str, port: int, request_bytes: int, response_bytes: int,
               count: int, rate: float | None, timeout: float, reuse: bool) -> dict[str, Any]:
    """Run ``count`` request/response exchanges to ``dst:port`` and return a summary.

    Args:
        proto: ``"tcp"`` or ``"udp"``.
        dst: destination address (pod IP, node IP or ClusterIP), IPv4 or IPv6 text; several
            separated by commas: exchange ``i`` goes to the ``i mod n``-th (round robin;
            not with ``reuse``).
        port: destination port.
        request_bytes: application bytes per request (>= 8, header included).
        response_bytes: application bytes per response.
        count: exchanges to run.
        rate: exchanges per second (evenly paced), or ``None`` for back to back.
        timeout: per-exchange socket timeout and overall budget factor (seconds); the run
            stops after ``timeout * 2 + count / rate`` seconds at most.
        reuse: TCP: one connection for all exchanges; UDP: one socket (one source port).

    Returns:
        ``{"ok": int, "failed": int, "errors": [str] (first 5), "request_payload_bytes":
        int, "response_payload_bytes": int, "elapsed_seconds": float}``; payload bytes are
        application bytes of completed exchanges.
    """
    start = time.monotonic()
    budget = timeout * 2 + (count / rate if rate else count * timeout)
    ok = failed = 0
    errors: list[str] = []
    flag = 0x80000000 if (reuse and proto == "tcp") else 0
    req = _request_payload(request_bytes, response_bytes | flag)
    last_req = _request_payload(request_bytes, response_bytes)
    persistent: socket.socket | None = None
    targets = dst.split(",")
    if reuse and len(targets) > 1:
        raise ValueError("reuse keeps one connection: give one destination")
    try:
        for i in range(count):
            dst = targets[i % len(targets)]
            if rate:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if time.monotonic() - start > budget:
                failed += count - i
                errors.append("time budget exhausted")
                break
            try:
                if proto == "tcp" and not reuse:
                    _tcp_exchange(dst, port, req, response_bytes, timeout)
                elif proto == "tcp":
                    if persistent is None:
                        persistent = socket.socket(_family(dst), socket.SOCK_STREAM)
                        persistent.settimeout(timeout)
                        persistent.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                              struct.pack("ii", 1, int(timeout) + 1))
                        persistent.connect((dst, port))
                    last = i == count - 1
                    persistent.sendall(last_req if last else req)
                    _recv_exact(persistent, response_bytes)
                    if last:  # the server closes first; wait for its FIN, then close
                        while persistent.recv(_CHUNK):
                            pass
                        persistent.close()
                        persistent = None
                else:
                    if persistent is None or not reuse:
                        if persistent is not None:
                            persistent.close()
                        persistent = socket.socket(_family(dst), socket.SOCK_DGRAM)
                        persistent.settimeout(timeout)
                        persistent.connect((dst, port))
                    persistent.send(req)
                    data = persistent.recv(_CHUNK)
                    if len(data) != response_bytes:
                        raise ConnectionError(f"short response: {len(data)} of {response_bytes}")
                ok += 1
            except OSError as err:
                failed += 1
                if len(errors) < 5:
                    errors.append(f"{type(err).__name__}: {err}")
                if persistent is not None and proto == "tcp":
                    persistent.close()
                    persistent = None
    finally:
        if persistent is not None:
            persistent.close()
    return {
        "ok": ok,
        "failed": failed,
        "errors": errors,
        "request_payload_bytes": ok * request_bytes,
        "response_payload_bytes": ok * response_bytes,
        "elapsed_seconds": round(time.monotonic() - start, 6),
    }


# ---------------------------------------------------------------- main


def _listen_spec(text: str) -> tuple[str, int]:
    proto, _, port = text.partition(":")
    if proto not in ("tcp", "udp") or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected tcp:PORT or udp:PORT, got {text!r}")
    return proto, int(port)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tools.lab.traffic``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m tools.lab.traffic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    srv = sub.add_parser("server", help="serve exchanges on the given ports")
    srv.add_argument("--listen", type=_listen_spec, action="append", required=True)
    srv.add_argument("--max-seconds", type=float, default=3600.0)
    cli = sub.add_parser("client", help="run exchanges and print a JSON summary")
    cli.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    cli.add_argument("--dst", required=True)
    cli.add_argument("--port", type=int, required=True)
    cli.add_argument("--request-bytes", type=int, default=100)
    cli.add_argument("--response-bytes", type=int, default=100)
    cli.add_argument("--count", type=int, default=1)
    cli.add_argument("--rate", type=float, default=None)
    cli.add_argument("--timeout", type=float, default=5.0)
    cli.add_argument("--reuse", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "server":
        run_server(args.listen, args.max_seconds)
        return 0
    if args.request_bytes < MIN_REQUEST_BYTES:
        parser.error(f"--request-bytes must be at least {MIN_REQUEST_BYTES}")
    result = run_client(args.proto, args.dst, args.port, args.request_bytes,
                        args.response_bytes, args.count, args.rate, args.timeout, args.reuse)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
