"""A TCP relay from the host's loopback into a lab network namespace.

The lab's control plane listens only inside its own network namespace; processes of the host
namespace (the agents, ``zonemeter explain``, ``kubectl`` run by a user) reach it through this
relay without any address, route or link being added to the host namespace: the listening
socket is bound on ``127.0.0.1`` while the process is still in the host namespace, then the
process enters the target namespace (``setns(2)`` with ``CLONE_NEWNET``) and every connection
it makes from then on is made from there. A socket keeps the namespace it was created in
(``socket(7)``, net/socket.c ``sock_create`` takes ``current->nsproxy->net_ns``).

Because the process itself then lives in the lab's namespace, ``zonemeter lab down`` ends it
with the namespace's other processes.

Usage::

    python -m tools.kube.relay --netns zm1a2b-cp --to 192.168.100.254:6443
    # prints "port 41235" once listening on 127.0.0.1:41235, then relays until killed
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000  # include/uapi/linux/sched.h


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    t.start()
    _pump(client, upstream)
    t.join()
    client.close()
    upstream.close()


def main(argv: list[str] | None = None) -> int:
    """Listen on 127.0.0.1 (host namespace), enter ``--netns``, relay to ``--to`` until killed.

    Prints ``port N`` on stdout once listening. Exit code 2 when the namespace or the address
    is invalid.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--netns", required=True, help="name under /run/netns")
    ap.add_argument("--to", required=True, help="host:port inside that namespace")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    a = ap.parse_args(argv)
    host, _, port = a.to.rpartition(":")
    if not host or not port.isdigit():
        print(f"relay: --to {a.to!r}: expected host:port", file=sys.stderr)
        return 2
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", a.port))
    listener.listen(64)
    try:
        fd = os.open(f"/run/netns/{a.netns}", os.O_RDONLY)
    except OSError as e:
        print(f"relay: network namespace {a.netns!r}: {e.strerror}", file=sys.stderr)
        return 2
    # os.setns is Python 3.12+; libc's setns(2) does the same on 3.11
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        print(f"relay: setns {a.netns}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 2
    os.close(fd)
    print(f"port {listener.getsockname()[1]}", flush=True)
    target = (host.strip("[]"), int(port))
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, target), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
