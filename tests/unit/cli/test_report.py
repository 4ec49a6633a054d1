"""``zonemeter report`` flags and exit codes, through ``agent.cli.main``."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import agent.cli.report as report_cli
from agent.cli import main
from agent.cli.report import parse_service
from agent.errors import InputError
from agent.report.compute import ServiceKey
from agent.report.prom import PromClient, redact_url


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(["report", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    return err.strip()


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--prometheus URL" in out and "--change-time" in out and "examples:" in out


URL = "http://127.0.0.1:9"


@pytest.mark.parametrize("argv, message", [
    (["--before", "-2h..-1h", "--after", "-1h..now", "--price", "oracle"],
     "zonemeter: error: --price: unknown price 'oracle'"),
    (["--before", "-1h..-2h", "--after", "-1h..now"],
     "zonemeter: error: --before: window '-1h..-2h' is reversed or empty"),
    (["--before", "-2h..-30m", "--after", "-1h..now"],
     "zonemeter: error: --after: the windows overlap by 1800 s"),
    (["--before", "-1h..now", "--after", "-3h..-2h"],
     "zonemeter: error: --after: the after window ends before the before window starts"),
    (["--before", "yesterday..now", "--after", "-1h..now"],
     "zonemeter: error: --before: 'yesterday' is not a time"),
    (["--before", "-2h..-1h"], "zonemeter: error: --after: give both --before and --after"),
    (["--before", "-2h..-1h", "--after", "-1h..now", "--change-time", "-1h"],
     "zonemeter: error: --change-time: give either --before/--after or --change-time"),
    (["--before", "-2h..-1h", "--after", "-1h..now", "--window", "1h"],
     "zonemeter: error: --window: --window applies to --change-time"),
    (["--change-time", "-1h", "--window", "2h"],
     "zonemeter: error: --window: '2h' after --change-time"),
    (["--window", "20s"], "zonemeter: error: --window: '20s' is 20 s; each window must be at least 60 s"),
    (["--change-time", "-1h", "--window", "59s"],
     "zonemeter: error: --window: '59s' is 59 s"),
    (["--change-time", "+1h"], "zonemeter: error: --change-time: '+1h'"),
    (["--change-time", "-1h", "--window", "soon"],
     "zonemeter: error: --window: 'soon' is not a duration"),
    (["--service", "shop", "--change-time", "-1h"],
     "zonemeter: error: --service: 'shop' is not NAMESPACE/NAME"),
    (["--change-time", "-1h", "--plot", "chart.svg"],
     "zonemeter: error: --plot: 'chart.svg' must end in .png"),
    (["--change-time", "-1h", "--html", "/nonexistent-dir/r.html"],
     "zonemeter: error: --html: directory of '/nonexistent-dir/r.html' does not exist"),
])
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         message: str) -> None:
    assert error_line(capsys, ["--prometheus", URL, *argv]).startswith(message)


def test_unreachable_prometheus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, ["--prometheus", f"http://127.0.0.1:{_closed_port()}",
                               "--before", "-2h..-1h", "--after", "-1h..now"])
    assert line.startswith("zonemeter: error: --prometheus: cannot reach http://127.0.0.1:")


def test_not_a_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, ["--prometheus", "prometheus:9090", "--change-time", "-1h"])
    assert line == "zonemeter: error: --prometheus: 'prometheus:9090' is not an http(s) URL"


def test_missing_prometheus_flag_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--change-time", "-1h"])
    assert exit_.value.code == 2
    assert "--prometheus" in capsys.readouterr().err


class _Handler(http.server.BaseHTTPRequestHandler):
    #: (method, path with query, form body) of every request, for the tests to inspect
    seen: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", "0"))
        self._answer("POST", self.rfile.read(length).decode())

    def do_GET(self) -> None:  # noqa: N802
        self._answer("GET", "")

    def _answer(self, method: str, form: str) -> None:
        _Handler.seen.append((method, self.path, form))
        if self.path.startswith("/html/"):
            body, kind, code = b"<html>hello</html>", "text/html", 200
        elif self.path.startswith("/auth/"):
            body, kind, code = b"Unauthorized", "text/plain", 401
        elif self.path.startswith("/old/"):  # Prometheus 2.25-2.32 without feature flags
            body = (b'{"status":"error","errorType":"bad_data",'
                    b'"error":"1:40: parse error: @ modifier is disabled"}')
            kind, code = "application/json", 400
        elif self.path.startswith("/ok/"):
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            kind, code = "application/json", 200
        else:
            body = b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'
            kind, code = "application/json", 400
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_not_prometheus(web: str) -> None:
    with pytest.raises(InputError, match="without Prometheus API JSON"):
        PromClient(f"{web}/html").query("up", 0)


def test_refused_query(web: str) -> None:
    with pytest.raises(InputError, match="refused the query: parse error at char 3"):
        PromClient(f"{web}/api").query_range("up{", 0, 60, 15)


def test_not_prometheus_exits_2(web: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, ["--prometheus", f"{web}/html", "--before", "-2h..-1h",
                               "--after", "-1h..now"])
    assert "without Prometheus API JSON" in line


def test_parse_service() -> None:
    assert parse_service("shop/cart") == ServiceKey("shop", "cart")
    assert parse_service(None) is None
    for bad in ("shop/", "/cart", "Shop/cart", "a/b/c"):
        with pytest.raises(InputError):
            parse_service(bad)


SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize("url, shown", [
    ("http://alice:s3cr3t-Pa55@prom.example:9090/prom",
     "http://REDACTED@prom.example:9090/prom"),
    ("https://s3cr3t-Pa55@prom.example", "https://REDACTED@prom.example"),
    ("http://prom:9090/api?token=s3cr3t-Pa55&tenant=shop&X-Amz-Signature=s3cr3t-Pa55",
     "http://prom:9090/api?token=REDACTED&tenant=shop&X-Amz-Signature=REDACTED"),
    ("http://prom:9090/?password=s3cr3t-Pa55&api_key=s3cr3t-Pa55#s3cr3t-Pa55",
     "http://prom:9090/?password=REDACTED&api_key=REDACTED"),
    ("http://a:s3cr3t-Pa55@[::1:9090/", "http://REDACTED@[::1:9090/"),  # unparsable
    ("http://prom:9090", "http://prom:9090"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert SECRET not in redact_url(url)


def test_unreachable_prometheus_hides_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    url = f"http://alice:{SECRET}@127.0.0.1:{port}/?token={SECRET}"
    line = error_line(capsys, ["--prometheus", url, "--before", "-2h..-1h", "--after", "-1h..now"])
    assert line.startswith(f"zonemeter: error: --prometheus: cannot reach "
                           f"http://REDACTED@127.0.0.1:{port}?token=REDACTED (ConnectionError)")
    assert SECRET not in line


@pytest.mark.parametrize("url", [f"ftp://alice:{SECRET}@prom", f"http://alice:{SECRET}@prom:x/",
                                 f"http://alice:{SECRET}@/"])
def test_bad_url_messages_hide_credentials(capsys: pytest.CaptureFixture[str], url: str) -> None:
    line = error_line(capsys, ["--prometheus", url, "--change-time", "-1h"])
    assert line.startswith("zonemeter: error: --prometheus: ") and SECRET not in line
    assert "REDACTED" in line


def test_refused_and_not_prometheus_messages_hide_credentials(web: str) -> None:
    authed = web.replace("http://", f"http://alice:{SECRET}@") + f"/api?token={SECRET}"
    with pytest.raises(InputError, match="refused the query") as err:
        PromClient(authed).query("up", 0)
    assert SECRET not in str(err.value) and "http://REDACTED@127.0.0.1" in str(err.value)
    authed_html = web.replace("http://", f"http://alice:{SECRET}@") + "/html"
    with pytest.raises(InputError, match="without Prometheus API JSON") as err:
        PromClient(authed_html).query("up", 0)
    assert SECRET not in str(err.value)


def test_unauthorised_says_so(web: str) -> None:
    with pytest.raises(InputError, match="answered HTTP 401: not authorised") as err:
        PromClient(web.replace("http://", f"http://alice:{SECRET}@") + "/auth").query("up", 0)
    assert SECRET not in str(err.value)


def test_url_parameters_are_sent_with_every_query_and_long_queries_are_posted(web: str) -> None:
    _Handler.seen.clear()
    client = PromClient(f"{web}/ok/?tenant=shop")
    client.query("up", 0)
    long_query = " or ".join(f'up{{job="j{i}"}}' for i in range(400))
    client.query(long_query, 0)
    (m1, path1, _), (m2, path2, form2) = _Handler.seen
    assert (m1, m2) == ("GET", "POST")
    assert path1.startswith("/ok/api/v1/query?") and "tenant=shop" in path1
    assert path2 == "/ok/api/v1/query"
    form = urllib.parse.parse_qs(form2)
    assert form["tenant"] == ["shop"] and form["query"] == [long_query]
    assert client.requests_made == 2


def test_no_service_with_data_names_a_few_and_counts_the_rest(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Every Service has a change time but no bytes in its windows: one short line."""
    now = 1_760_000_000.0
    changes = [{"metric": {"namespace": "shop", "service": f"s{i}"},
                "value": [now, str(now - 7200)]} for i in range(9)]

    class Session:
        def get(self, url: str, params: dict[str, str], timeout: float) -> Any:
            result = changes if "last_change" in params["query"] else []
            kind = "matrix" if url.endswith("query_range") else "vector"
            return _Json({"status": "success", "data": {"resultType": kind, "result": result}})

        post = None

    monkeypatch.setattr(report_cli, "PromClient",
                        lambda url: PromClient(url, session=Session()))  # type: ignore[arg-type]
    line = error_line(capsys, ["--prometheus", URL, "--now", str(now), "--window", "1h"])
    assert line == ("zonemeter: error: --prometheus: no Service has data around its last "
                    "locality change (no zonemeter_service_bytes_total data in the before window: "
                    "shop/s0, shop/s1, shop/s2, shop/s3, shop/s4 and 4 more); check that "
                    "Prometheus scrapes the agents and keeps data that old, or give "
                    "--before/--after")
    # each Service named once, the reason said once: a short line
    assert line.count("shop/s0") == 1 and line.count("in the before window") == 1
    assert len(line) < 300


def test_services_skipped_for_different_reasons_are_grouped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Changes 30 s ago (no 60 s window) and older ones without data: one clause per reason."""
    now = 1_760_000_000.0
    changes = [{"metric": {"namespace": "shop", "service": f"s{i}"},
                "value": [now, str(now - (30 if i < 2 else 7200))]} for i in range(4)]

    class Session:
        def get(self, url: str, params: dict[str, str], timeout: float) -> Any:
            result = changes if "last_change" in params["query"] else []
            kind = "matrix" if url.endswith("query_range") else "vector"
            return _Json({"status": "success", "data": {"resultType": kind, "result": result}})

        post = None

    monkeypatch.setattr(report_cli, "PromClient",
                        lambda url: PromClient(url, session=Session()))  # type: ignore[arg-type]
    line = error_line(capsys, ["--prometheus", URL, "--now", str(now)])
    assert ("(changed under 60 s ago: shop/s0, shop/s1; no "
            "zonemeter_service_bytes_total data in the before window: shop/s2, shop/s3)") in line
    assert len(line) < 300


class _Json:
    status_code = 200

    def __init__(self, body: Any) -> None:
        self.body = body

    def json(self) -> Any:
        return self.body


@pytest.mark.parametrize("argv, message", [
    (["--window="], "zonemeter: error: --window: empty duration"),
    (["--change-time", "-3d", "--window", "5M"], "zonemeter: error: --window: '5M' is ambiguous"),
    (["--change-time", "-3d", "--window", "30"], "zonemeter: error: --window: '30' has no unit"),
    (["--change-time", "-3M"], "zonemeter: error: --change-time: '3M' is ambiguous"),
    (["--before", "-7d", "--after", "-1d..now"],
     "zonemeter: error: --before: '-7d' is not a window START..END"),
])
def test_bad_window_values_name_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         message: str) -> None:
    """Checked before Prometheus is asked (URL is a closed port)."""
    assert error_line(capsys, ["--prometheus", URL, *argv]).startswith(message)


def test_silent_prometheus_times_out_with_one_line() -> None:
    """A server that accepts the connection and never answers: a timeout, said so."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        client = PromClient(f"http://alice:{SECRET}@127.0.0.1:{port}", timeout=0.3)
        with pytest.raises(InputError) as err:
            client.query("up", 0)
    assert str(err.value) == (f"--prometheus: http://REDACTED@127.0.0.1:{port} did not answer "
                              "within 0.3 s")


def test_prometheus_without_at_modifier_is_told_which_version_works(web: str) -> None:
    with pytest.raises(InputError, match=r"@ modifier is disabled \(the report needs the @ "
                                         r"modifier and negative offsets: Prometheus >= 2.33"):
        PromClient(f"{web}/old").query("up @ 1", 0)
