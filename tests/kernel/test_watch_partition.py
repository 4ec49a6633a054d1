"""API outage by network partition: the API server's packets stop arriving, no
FIN, no RST. Until the watch notices, the metadata counts as synced while it goes stale.

The watch loop and a tiny API server (list answers, then a watch that stays open and
silent, as a real one between events) run in a child process inside a network namespace
of our own (``zm<hex>``, loopback only); once the watch is open, nftables in that
namespace drops the server's TCP port in both directions. With TCP keepalive on the
client's connections the watch fails within idle + interval x probes; without it the
only bound was the read timeout (timeout_seconds + margin, here 330 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(r'''
    import json, subprocess, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from kubernetes import client
    from agent.k8s.cache import ClusterMetadata
    from agent.k8s.client import build_api_client
    from agent.k8s.watch import ResourceWatcher, WatchSettings

    class Api(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a): pass
        def do_GET(self):
            if "watch=" in self.path:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                time.sleep(600)  # open and silent, like a watch between events
                return
            body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                               "metadata": {"resourceVersion": "5"}, "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    srv.daemon_threads = True
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cache = ClusterMetadata()
    settings = WatchSettings(timeout_seconds=300, read_margin_seconds=30, connect_timeout_seconds=1,
                             backoff_initial_seconds=0.2, backoff_max_seconds=0.5,
                             unsynced_after_seconds=2)
    api = build_api_client(host=f"http://127.0.0.1:{port}", keepalive=KEEPALIVE)
    stop = threading.Event()
    w = ResourceWatcher(client.CoreV1Api(api).list_pod_for_all_namespaces, "pods", cache,
                        settings, stop)
    threading.Thread(target=w.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not (cache.synced()["pods"] and w.stats.watches >= 1):
        assert time.monotonic() < deadline, "never synced"
        time.sleep(0.05)
    time.sleep(0.5)
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=f"""
        table inet zmpart {{
            chain in {{ type filter hook input priority 0; policy accept;
                        tcp dport {port} drop; tcp sport {port} drop; }}
        }}""")
    t0 = time.monotonic()
    first_error = unsynced = None
    while time.monotonic() - t0 < BUDGET:
        if first_error is None and w.stats.errors:
            first_error = time.monotonic() - t0
        if not cache.synced()["pods"]:
            unsynced = time.monotonic() - t0
            break
        time.sleep(0.05)
    print(json.dumps({"first_error": first_error, "unsynced": unsynced,
                      "last_error": w.stats.last_error}))
''')


def _run_in_netns(keepalive: tuple[int, int, int], budget: float) -> dict[str, Any]:
    ns = "zm" + os.urandom(3).hex() + "part"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        code = f"KEEPALIVE = {keepalive!r}\nBUDGET = {budget!r}\n" + CHILD
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                             text=True, timeout=budget + 60)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_partitioned_watch_fails_by_keepalive_and_goes_unsynced() -> None:
    res = _run_in_netns((1, 1, 2), budget=20.0)
    # keepalive gives up after 1 + 1 x 2 = 3 s (TCP user timeout the same); then the
    # reconnects time out for unsynced_after_seconds (2 s): well inside the 20 s budget,
    # and far inside the 330 s read timeout that was the only bound before
    assert res["first_error"] is not None and res["first_error"] < 10.0, res
    assert res["unsynced"] is not None and res["unsynced"] < 20.0, res
