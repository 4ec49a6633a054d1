"""``zonemeter report`` flags and exit codes, through ``agent.cli.main``."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from agent.cli import main
from agent.errors import InputError
from tools.report.cli import parse_service
from tools.report.compute import ServiceKey
from tools.report.prom import PromClient


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
    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/html/"):
            body, kind, code = b"<html>hello</html>", "text/html", 200
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
