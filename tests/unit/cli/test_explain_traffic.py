"""``zonemeter explain --prometheus``: why a Service's hint-ignored bytes ignored the hints,
per client node and cause, from the agents' series in Prometheus."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import cli
from tests.fixtures.topologies import write_snapshot

#: what the fake Prometheus holds: increase() over the window, per query family
IGNORED = [({"namespace": "shop", "service": "web", "client_node": "nb", "client_kind": "pod"}, 36000.0),
           ({"namespace": "shop", "service": "web", "client_node": "na", "client_kind": "pod"}, 720.0)]
PATHS = [({"namespace": "shop", "service": "web", "client_node": "nb", "path": "clusterip"}, 90000.0),
         ({"namespace": "shop", "service": "web", "client_node": "na", "path": "direct"}, 720.0)]


class _Prom(http.server.BaseHTTPRequestHandler):
    queries: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
        self.queries.append(q)
        rows = IGNORED if "hint_ignored" in q else PATHS if "client_path" in q else []
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [0, str(v)]} for m, v in rows]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Prom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_json_names_each_client_node_and_cause(prom: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    snap = write_snapshot(tmp_path / "dump.json")
    assert cli.main(["explain", "--snapshot", str(snap), "--prometheus", prom, "--window", "1h",
                     "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = [(c["service"], c["client_node"], c["cause"], c["bytes"]) for c in doc["hint_ignored_causes"]]
    assert got == [("web", "nb", "data-plane", 36000), ("web", "na", "client-side", 720)]
    assert doc["hint_ignored_causes"][0]["bytes_per_second"] == 10.0
    assert doc["hint_ignored_causes"][0]["sentence"] == (
        "locality configured, but node nb's data plane ignores the hints (10 bytes/s)")
    assert all("[3600000ms]" in q for q in _Prom.queries[-2:])


def test_table_adds_the_verdict_lines(prom: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = write_snapshot(tmp_path / "dump.json")
    assert cli.main(["explain", "--snapshot", str(snap), "--prometheus", prom, "--window", "10m",
                     "--service", "shop/web"]) == 0
    out = capsys.readouterr().out
    assert "why bytes ignored the hints (last 10m, from Prometheus):" in out
    assert "  shop/web: data-plane: locality configured, but node nb's data plane ignores the hints (60 bytes/s)" in out
    assert "  shop/web: client-side: clients of this Service on node na choose endpoints themselves" in out


def test_without_prometheus_the_output_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = write_snapshot(tmp_path / "dump.json")
    assert cli.main(["explain", "--snapshot", str(snap), "-o", "json"]) == 0
    assert "hint_ignored_causes" not in json.loads(capsys.readouterr().out)
