"""zonemeter top: rates from two /flows reads, rendering, -o json against a real server,
--help and error paths."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from agent import cli
from agent.cli.top import rates, render, run
from agent.exporter import (
    AttributionTotals,
    Exporter,
    ExportSnapshot,
    Locality,
    MetricsServer,
    PairRow,
    ServiceBytesKey,
    ServiceRef,
    start_server,
)


def snap(cross: int, same: int, at: float) -> ExportSnapshot:
    return ExportSnapshot(
        totals=AttributionTotals(
            service_bytes={
                ServiceBytesKey("shop", "web", "80", "zone-a", "zone-b", "cross_zone", "request"): cross,
                ServiceBytesKey("shop", "web", "80", "zone-b", "zone-b", "same_zone", "response"): same},
            top_pairs=(PairRow(client="shop/client-a", server="shop/web-b", client_zone="zone-a",
                               server_zone="zone-b", crossing="cross_zone", namespace="shop", service="web",
                               port="", bytes=4000, client_kind="pod"),
                       PairRow(client="10.0.9.4", server="shop/web-b", client_zone="zone-a",
                               server_zone="zone-b", crossing="cross_zone", namespace="shop", service="web",
                               port="80", bytes=2000, client_kind="load-balancer", lb_type="aws-nlb")),
            top_interval=(at - 2.0, at)),
        locality={ServiceRef("shop", "web"): Locality("PreferClose", "no-hints-for-zone",
                                                       {"zone-a": False, "zone-b": True}, 0.0)},
        generated_at=at, interval_seconds=2.0)


@pytest.fixture()
def server() -> Iterator[tuple[MetricsServer, Exporter]]:
    exp = Exporter()
    exp.update(snap(1000, 500, 100.0))
    srv = start_server(exp, "127.0.0.1:0")
    yield srv, exp
    srv.close()


def test_pairs_show_the_client_class() -> None:
    e = Exporter()
    e.update(snap(1000, 500, 100.0))
    doc = e.flows()
    for width, lb in ((80, "lb:nlb"), (160, "lb:aws-nlb")):
        lines = render(doc, None, "http://x", width=width).splitlines()
        head = next(ln for ln in lines if ln.startswith("CLIENT"))
        assert head.split()[:3] == ["CLIENT", "CLASS", "SERVER"]
        rows = {ln.split()[0]: ln.split()[1] for ln in lines
                if ln.startswith(("shop/client-a", "10.0.9.4"))}
        assert rows == {"shop/client-a": "pod", "10.0.9.4": lb}
    # an agent from before client classes: its rows say nothing, shown as "?"
    old = {**doc, "pairs": [{k: v for k, v in p.items() if k not in ("client_kind", "lb_type")}
                            for p in doc["pairs"]]}
    row = next(ln for ln in render(old, None, "http://x").splitlines() if ln.startswith("10.0.9.4"))
    assert row.split()[1] == "?"


def test_rates_are_differences_over_generated_at() -> None:
    e = Exporter()
    e.update(snap(1000, 500, 100.0))
    a = e.flows()
    e.update(snap(5000, 700, 104.0))
    b = e.flows()
    assert rates(a, b) == {("shop", "web"): {"cross_zone": 1000.0, "same_zone": 50.0}}
    assert rates(None, b) == {}
    e.update(snap(10, 5, 106.0))  # agent restarted: counters went down
    assert rates(b, e.flows()) == {("shop", "web"): {"cross_zone": 5.0, "same_zone": 2.5}}


def test_render_shows_rates_locality_and_pairs() -> None:
    e = Exporter()
    e.update(snap(1000, 500, 100.0))
    a = e.flows()
    e.update(snap(1000 + 4096 * 4, 500, 104.0))
    wide = render(e.flows(), a, "http://x", width=160)
    row = next(ln for ln in wide.splitlines() if ln.startswith("shop/web"))
    assert "4.0KiB/s" in row and "PreferClose on in zone-b (no-hints-for-zone)" in row
    assert "CROSS_REGION" in wide and "EXTERNAL" in wide  # the full table fits 160 columns
    screen = render(e.flows(), a, "http://x")  # 80 columns
    assert max(len(ln) for ln in screen.splitlines()) <= 80
    assert "CROSS_REGION" not in screen and "CROSS_ZONE" in screen  # empty columns left out
    lines = screen.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("shop/web"))
    assert "4.0KiB/s" in lines[i]
    # the locality text wraps inside its column, nothing cut
    assert " ".join(ln.strip() for ln in lines[i:i + 2])[-len("PreferClose on in zone-b (no-hints-for-zone)"):] \
        == "PreferClose on in zone-b (no-hints-for-zone)"
    pair = next(ln for ln in screen.splitlines() if ln.startswith("shop/client-a"))
    assert "shop/web-b" in pair and "cross_zone" in pair and pair.rstrip().endswith("2.0Ki")  # 4000 B / 2 s
    first = render(a, None, "http://x")
    assert "totals since start" in first and "1000B" in first


def test_json_once_against_a_running_exporter(server: tuple[MetricsServer, Exporter],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    srv, _ = server
    assert cli.main(["top", "--url", srv.url, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["services"][0]["by_crossing"] == {"cross_zone": 1000, "same_zone": 500}
    assert doc["pairs"][0]["client"] == "shop/client-a"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_loop_redraws_with_rates(server: tuple[MetricsServer, Exporter]) -> None:
    srv, exp = server
    out = _Terminal()
    args = cli.build_parser().parse_args(["top", "--url", srv.url, "--interval", "1"])

    def sleep(_: float) -> None:
        exp.update(snap(3000, 500, 102.0))

    assert run(args, out=out, sleep=sleep, max_frames=2) == 0
    frames = out.getvalue().split("\x1b[H\x1b[2J")[1:]
    assert len(frames) == 2
    assert "totals since start" in frames[0] and "rates" in frames[1]
    assert "1000B/s" in frames[1]  # (3000 - 1000) / 2 s


def test_pipe_gets_plain_snapshots_separated_by_a_blank_line(
        server: tuple[MetricsServer, Exporter]) -> None:
    srv, exp = server
    out = io.StringIO()  # not a terminal, like `zonemeter top | tail`
    args = cli.build_parser().parse_args(["top", "--url", srv.url, "--interval", "1"])

    def sleep(_: float) -> None:
        exp.update(snap(3000, 500, 102.0))

    assert run(args, out=out, sleep=sleep, max_frames=2) == 0
    text = out.getvalue()
    assert "\x1b" not in text
    first, second = text.split("\n\n", 1)
    assert "totals since start" in first and "rates" in second and "1000B/s" in second
    assert "totals since start" not in second


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["top", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--url" in out and "-o" in out and "--once" in out


def test_unreachable_agent_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["top", "--url", f"http://127.0.0.1:{port}", "--once"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot reach the agent" in err
    assert "--url" in err  # says what to do


def test_http_error_passes_on_what_the_agent_said(capsys: pytest.CaptureFixture[str]) -> None:
    # the agent's 403 for a non-loopback peer explains itself in the body; top must not
    # reduce that to "HTTP 403" (a stand-in on loopback answers as the agent would)
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    said = (b"/flows answers loopback only (run zonemeter top on the node, "
            b"or start the agent with --flows-allow-remote)\n")

    class Forbidden(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(403)
            self.send_header("Content-Length", str(len(said)))
            self.end_headers()
            self.wfile.write(said)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Forbidden)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        assert cli.main(["top", "--url", url, "--once"]) == 1
    finally:
        httpd.shutdown()
        httpd.server_close()
    err = capsys.readouterr().err.strip()
    assert err == (f"zonemeter: error: {url}/flows?top=10: HTTP 403: /flows answers loopback "
                   "only (run zonemeter top on the node, or start the agent with "
                   "--flows-allow-remote)")


@pytest.mark.parametrize("argv, msg", [
    (["--interval", "0"], "--interval: must be > 0"),
    (["--url", "127.0.0.1:11808"], "--url: expected http://HOST:PORT"),
])
def test_bad_flags_exit_2(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["top", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_q_on_the_terminal_quits_and_restores_it(server: tuple[MetricsServer, Exporter]) -> None:
    import os
    import termios

    srv, _ = server
    master, slave = os.openpty()
    keys = os.fdopen(slave, "rb", buffering=0)
    try:
        before = termios.tcgetattr(slave)
        args = cli.build_parser().parse_args(["top", "--url", srv.url, "--interval", "0.2"])
        os.write(master, b"xq")  # another key first: only q quits
        out = io.StringIO()
        assert run(args, out=out, max_frames=5, keys=keys, width=100) == 0
        frames = [f for f in out.getvalue().split("\n\n") if f.startswith("zonemeter top")]
        assert len(frames) == 1 and "q quits" in frames[0]  # without q: five frames
        assert termios.tcgetattr(slave) == before  # cbreak undone
    finally:
        keys.close()
        os.close(master)


def test_lines_fit_the_width_given(server: tuple[MetricsServer, Exporter]) -> None:
    srv, _ = server
    args = cli.build_parser().parse_args(["top", "--url", srv.url, "--once"])
    for width in (60, 80, 120, 200):
        out = io.StringIO()
        assert run(args, out=out, width=width) == 0
        assert max(len(ln) for ln in out.getvalue().splitlines()) <= width
        assert "shop/web" in out.getvalue() and "q quits" not in out.getvalue()
