"""zonemeter explain --kubeconfig against a loopback HTTP server speaking the list API.

The official kubernetes client builds the requests; the server (127.0.0.1, an ephemeral port)
answers the three list calls with API-shaped JSON and ``/version`` with a ``version.Info``
(``gitVersion`` as :attr:`_Handler.version` says; None answers 404), so the live path is exercised end to end
without a cluster. Nothing leaves loopback.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent import cli
from tests.fixtures import k8s
from tests.fixtures.topologies import own_zone_endpoints, three_zone_nodes

ITEMS = {
    "/api/v1/nodes": ("NodeList", three_zone_nodes()),
    "/api/v1/services": ("ServiceList", [k8s.service(traffic_distribution="PreferClose")]),
    "/apis/discovery.k8s.io/v1/endpointslices": (
        "EndpointSliceList", [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))]),
}


class _Handler(BaseHTTPRequestHandler):
    seen: list[str] = []
    version: str | None = "v1.37.2"

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        path = self.path.split("?")[0]
        self.seen.append(path)
        if path.rstrip("/") == "/version" and self.version is not None:
            self._json({"major": "1", "minor": self.version.split(".")[1], "gitVersion": self.version,
                        "platform": "linux/amd64"})
            return
        if path not in ITEMS:
            self.send_response(404)
            self.end_headers()
            return
        kind, items = ITEMS[path]
        self._json({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                    "items": [{k_: v for k_, v in i.items() if k_ != "kind"} for i in items]})

    def _json(self, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_explain_live_cluster(api_server: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{api_server}'}}}}]\n"
        "users: [{name: t, user: {token: not-a-secret}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n")
    _Handler.seen = []
    assert cli.main(["explain", "--kubeconfig", str(kc), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (s,) = doc["services"]
    assert (s["name"], s["mechanism"], s["reason"]) == ("web", "trafficDistribution", "none")
    assert s["proxy"]["n-b"]["cluster_endpoints"] == ["10.0.0.2:8080"]
    assert set(_Handler.seen) == set(ITEMS) | {"/version/"}  # list calls and the version only
    assert (doc["kubernetes_version"], doc["kubernetes_version_source"]) == ("1.37", "cluster")


def _kubeconfig(tmp_path: Path, api_server: str) -> Path:
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{api_server}'}}}}]\n"
        "users: [{name: t, user: {token: not-a-secret}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n")
    return kc


@pytest.mark.parametrize(("served", "want", "source", "said"), [
    ("v1.33.5-eks-abc", "1.33", "cluster", None),
    ("v1.38.0", "1.37", "cluster", "newer than the hint model covers"),
    ("v1.20.1", "1.27", "cluster", "older than the hint model covers"),
    (None, "1.37", "default", "reading the API server's version (/version) failed"),
])
def test_explain_live_reads_the_server_version(api_server: str, tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                               monkeypatch: pytest.MonkeyPatch, served: str | None,
                                               want: str, source: str, said: str | None) -> None:
    monkeypatch.setattr(_Handler, "version", served)
    assert cli.main(["explain", "--kubeconfig", str(_kubeconfig(tmp_path, api_server)), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["kubernetes_version"], doc["kubernetes_version_source"]) == (want, source)
    if said is None:
        assert err == ""
    else:
        assert err.count("\n") == 1 and said in err and "Traceback" not in err
    # an explicit flag wins over the server
    assert cli.main(["explain", "--kubeconfig", str(_kubeconfig(tmp_path, api_server)),
                     "--kubernetes-version", "1.31", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["kubernetes_version"], doc["kubernetes_version_source"]) == ("1.31", "flag")


def test_explain_reads_kubeconfig_from_the_environment_as_kubectl(  # type: ignore[no-untyped-def]
        api_server: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    kc = tmp_path / "kc.yaml"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: off\n"
        f"clusters: [{{name: t, cluster: {{server: '{api_server}'}}}}, "
        "{name: gone, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: t, user: {token: not-a-secret}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}, {name: off, context: {cluster: gone, user: t}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    assert cli.main(["explain", "--context", "t", "-o", "json"]) == 0  # KUBECONFIG=kc.yaml, as kubectl
    assert json.loads(capsys.readouterr().out)["services"][0]["name"] == "web"
    assert cli.main(["explain", "--context", "t", "--snapshot", str(kc)]) == 2
    assert "--context: needs a kubeconfig" in capsys.readouterr().err


def test_explain_live_api_down(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens there any more
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: t, user: {token: x}}]\ncontexts: [{name: t, context: {cluster: t, user: t}}]\n")
    code = cli.main(["explain", "--kubeconfig", str(kc)])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.count("\n") == 1 and "listing Node objects failed" in err
