"""``zonemeter report`` against a real Prometheus serving hand-made data (see conftest).

Every expected number below is worked out by hand from the rates in ``conftest.py``:
before = [T0, CHANGE), after = [CHANGE, END), each 3600 s, GB = 1e9 bytes,
month = 2,629,746 s (30.44 days), aws = $0.02 per GB crossing.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from agent.cli import main
from agent.report.compute import ServiceKey, report_for_windows, scrape_interval
from agent.report.pricing import parse_price
from agent.report.prom import PromClient
from agent.report.timespec import Window, format_time
from tests.fixtures.promdata import CHANGE, END, T0, WITHDRAWN

MONTH = 2_629_746  # 30.44 days (agent.report.pricing, the recording rules)
approx = lambda v: pytest.approx(v, rel=1e-9, abs=1e-9)  # noqa: E731


def run_json(capsys: pytest.CaptureFixture[str], *argv: str, now: float = END + 60) -> dict:
    code = main(["report", *argv, "-o", "json", "--now", str(now)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def svc(doc: dict, name: str) -> dict:
    (entry,) = [s for s in doc["services"] if s["name"] == name]
    return entry


def test_windows_report_matches_hand_arithmetic(prometheus_url: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--prometheus", prometheus_url,
                   "--before", f"{format_time(T0)}..{format_time(CHANGE)}",
                   "--after", f"{format_time(CHANGE)}..{format_time(END)}")
    assert doc["price"] == {"name": "aws", "usd_per_gb_crossing": 0.02}
    assert doc["windows"] == {"before": [T0, CHANGE], "after": [CHANGE, END]}
    assert [s["name"] for s in doc["services"]] == ["cart", "pay", "search"]  # by $ saved

    cart = svc(doc, "cart")
    # before: same-zone 1 MB/s + cross request 2 MB/s + cross response 1 MB/s
    assert cart["before"]["bytes_per_second"] == approx(4_000_000)
    assert cart["before"]["cross_zone_bytes_per_second"] == approx(3_000_000)
    assert cart["before"]["cross_zone_fraction"] == approx(0.75)
    assert cart["before"]["hint_ignored_bytes_per_second"] == approx(0)
    # zone b's in-effect series is 0 before the change: not in effect although zone a is 1
    assert cart["before"]["locality_in_effect_share"] == 0
    assert cart["before"]["cross_zone_by_pair"] == [
        {"direction": "request", "client_zone": "a", "server_zone": "b",
         "bytes_per_second": approx(2_000_000)},
        {"direction": "response", "client_zone": "a", "server_zone": "b",
         "bytes_per_second": approx(1_000_000)}]
    # after: 1 MB/s + 0.2 MB/s (through a counter reset) + 0.1 MB/s
    assert cart["after"]["bytes_per_second"] == approx(1_300_000)
    assert cart["after"]["cross_zone_bytes_per_second"] == approx(300_000)
    assert cart["after"]["cross_zone_fraction"] == approx(300_000 / 1_300_000)
    assert cart["after"]["hint_ignored_bytes_per_second"] == approx(100_000)
    assert cart["after"]["locality_in_effect_share"] == 1
    assert cart["cross_zone_bytes_per_second_saved"] == approx(2_700_000)
    # 0.75 x 1.3 MB/s - 0.3 MB/s
    assert cart["normalized_cross_zone_bytes_per_second_saved"] == approx(675_000)
    # 675,000 B/s x 2,629,746 s = 1,775.08 GB x $0.02
    assert cart["usd_per_month_saved"] == approx(35.501571)
    assert cart["warnings"] == []

    search = svc(doc, "search")
    assert search["before"]["bytes_per_second"] == approx(1_000_000)
    assert search["before"]["cross_zone_fraction"] == approx(0.5)
    assert search["after"]["bytes_per_second"] == approx(2_000_000)
    assert search["after"]["cross_zone_bytes_per_second"] == approx(800_000)
    # traffic doubled: observed -0.3 MB/s, but 0.5 x 2 MB/s - 0.8 MB/s = +0.2 MB/s
    assert search["cross_zone_bytes_per_second_saved"] == approx(-300_000)
    assert search["normalized_cross_zone_bytes_per_second_saved"] == approx(200_000)
    assert search["usd_per_month_saved"] == approx(200_000 * MONTH / 1e9 * 0.02)
    assert search["warnings"] == ["locality not in effect at any time in the after window"]

    pay = svc(doc, "pay")
    # after: cross 0.1 MB/s for 1800 s then 1 MB/s for 1800 s = 0.55 MB/s
    assert pay["after"]["cross_zone_bytes_per_second"] == approx(550_000)
    assert pay["after"]["bytes_per_second"] == approx(1_550_000)
    assert pay["after"]["locality_in_effect_share"] == approx(0.5)
    assert pay["cross_zone_bytes_per_second_saved"] == approx(450_000)
    assert pay["normalized_cross_zone_bytes_per_second_saved"] == approx(0.5 * 1_550_000 - 550_000)
    assert pay["warnings"] == [
        f"locality withdrawn inside the after window at {format_time(WITHDRAWN)}"]

    total = doc["total"]
    assert total["before"]["bytes_per_second"] == approx(7_000_000)
    assert total["before"]["cross_zone_bytes_per_second"] == approx(4_500_000)
    assert total["after"]["bytes_per_second"] == approx(4_850_000)
    assert total["after"]["cross_zone_bytes_per_second"] == approx(1_650_000)
    assert total["after"]["hint_ignored_bytes_per_second"] == approx(100_000)
    assert total["cross_zone_bytes_per_second_saved"] == approx(2_850_000)
    assert total["normalized_cross_zone_bytes_per_second_saved"] == approx(1_100_000)
    # 1.1 MB/s x 2,629,746 s = 2,892.72 GB x $0.02
    assert total["usd_per_month_saved"] == approx(57.854412)
    # bytes-weighted: (1.3 MB/s x 1 + 2 MB/s x 0 + 1.55 MB/s x 0.5) / 4.85 MB/s
    assert total["after"]["locality_in_effect_share"] == approx(2_075_000 / 4_850_000)
    assert total["before"]["locality_in_effect_share"] == 0
    assert doc["warnings"] == []


def test_per_service_change_times(prometheus_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No windows: each Service's windows surround its last locality change."""
    doc = run_json(capsys, "--prometheus", prometheus_url, "--price", "gcp", now=END)
    assert doc["windows"] == {"before": None, "after": None}
    cart = svc(doc, "cart")
    # cart changed at CHANGE, one hour before now: D = 3600 s, as in the windows test
    assert cart["windows"] == {"before": [T0, CHANGE], "after": [CHANGE, END]}
    assert cart["change_time"] == CHANGE
    assert cart["normalized_cross_zone_bytes_per_second_saved"] == approx(675_000)
    assert cart["usd_per_month_saved"] == approx(675_000 * MONTH / 1e9 * 0.01)
    pay = svc(doc, "pay")
    # pay's last change is the withdrawal, 1800 s before now: before has locality on
    assert pay["windows"] == {"before": [CHANGE, WITHDRAWN], "after": [WITHDRAWN, END]}
    assert pay["before"]["bytes_per_second"] == approx(1_100_000)
    assert pay["before"]["cross_zone_bytes_per_second"] == approx(100_000)
    assert pay["before"]["locality_in_effect_share"] == 1
    assert pay["after"]["cross_zone_bytes_per_second"] == approx(1_000_000)
    assert pay["after"]["locality_in_effect_share"] == 0
    assert pay["cross_zone_bytes_per_second_saved"] == approx(-900_000)
    # (0.1 / 1.1) x 2 MB/s - 1 MB/s: the withdrawal costs money
    assert pay["normalized_cross_zone_bytes_per_second_saved"] == approx(
        100_000 / 1_100_000 * 2_000_000 - 1_000_000)
    assert pay["warnings"] == ["locality not in effect at any time in the after window"]
    # search's last change is a day before the data: skipped, and said so
    assert [s["name"] for s in doc["services"]] == ["cart", "pay"]
    assert doc["warnings"] == [
        "skipped, no zonemeter_service_bytes_total data in the before window: shop/search"]
    assert doc["total"]["normalized_cross_zone_bytes_per_second_saved"] == approx(
        675_000 + 100_000 / 1_100_000 * 2_000_000 - 1_000_000)


def test_change_time_and_service_filter(prometheus_url: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--prometheus", prometheus_url, "--change-time", format_time(CHANGE),
                   "--window", "30m", "--service", "shop/cart", "--price", "0.05")
    assert doc["price"] == {"name": "custom", "usd_per_gb_crossing": 0.05}
    assert doc["windows"] == {"before": [CHANGE - 1800, CHANGE], "after": [CHANGE, CHANGE + 1800]}
    assert [s["name"] for s in doc["services"]] == ["cart"]
    cart = doc["services"][0]
    assert cart["before"]["cross_zone_bytes_per_second"] == approx(3_000_000)
    assert cart["after"]["cross_zone_bytes_per_second"] == approx(300_000)
    assert cart["usd_per_month_saved"] == approx(675_000 * MONTH / 1e9 * 0.05)
    assert doc["total"]["usd_per_month_saved"] == approx(cart["usd_per_month_saved"])


def test_partial_coverage_is_warned(prometheus_url: str) -> None:
    """A before window that starts 30 min before the first sample: the rate is averaged over
    the whole window (1800 s of data at 4 MB/s over 3600 s) and a warning says so."""
    client = PromClient(prometheus_url)
    report = report_for_windows(client, parse_price("aws"), Window(T0 - 1800, T0 + 1800),
                                Window(CHANGE, END), service=ServiceKey("shop", "cart"))
    (cart,) = report.services
    # increase() extrapolates to the window start only up to half a scrape interval before
    # the first sample, so the 1800 s of data (plus 7.5 s) are averaged over 3600 s
    assert cart.before.bytes_per_second == approx(4_000_000 * (1800 + 7.5) / 3600)
    assert report.warnings and "start of the window" in report.warnings[0]


def test_no_data_in_window_exits_2(prometheus_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", "--prometheus", prometheus_url,
                 "--before", f"{T0 - 7200}..{T0 - 3600}", "--after", f"{CHANGE}..{END}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("zonemeter: error: --before: no zonemeter_service_bytes_total data")


def test_unknown_service_exits_2(prometheus_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", "--prometheus", prometheus_url, "--service", "shop/nope",
                 "--before", f"{T0}..{CHANGE}", "--after", f"{CHANGE}..{END}"])
    assert code == 2
    assert "no zonemeter_service_bytes_total data for shop/nope" in capsys.readouterr().err


def test_chart_and_html(prometheus_url: str, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    png, page = tmp_path / "saved.png", tmp_path / "saved.html"
    code = main(["report", "--prometheus", prometheus_url, "--before", f"{T0}..{CHANGE}",
                 "--after", f"{CHANGE}..{END}", "--plot", str(png), "--html", str(page)])
    assert code == 0, capsys.readouterr().err
    head = png.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "data:image/png;base64," in text and "shop/cart" in text and "TOTAL" in text
    assert "<h2>Non-Service traffic</h2>" in text and "<td>shop/orders (Deployment)</td>" in text
    out = capsys.readouterr().out
    assert "shop/cart" in out and "$57.85" in out


def test_scrape_interval_is_measured(prometheus_url: str) -> None:
    client = PromClient(prometheus_url)
    assert scrape_interval(client, "zonemeter_service_bytes_total", END) == 15
    # before the data: nothing stored, fall back to the default
    assert scrape_interval(client, "zonemeter_service_bytes_total", T0 - 3600) == 60


def _row(doc: dict, workload: str) -> dict:
    (entry,) = [w for w in doc["workloads"] if w["workload"] == workload]
    return entry


def test_non_service_traffic_is_priced_with_the_same_arithmetic(
        prometheus_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--prometheus", prometheus_url,
            "--before", f"{format_time(T0)}..{format_time(CHANGE)}",
            "--after", f"{format_time(CHANGE)}..{format_time(END)}")
    doc = run_json(capsys, *argv)
    assert [(w["workload"], w["workload_kind"], w["remote_kind"]) for w in doc["workloads"]] == [
        ("cart", "Deployment", "pod"), ("orders", "Deployment", "cidr")]  # by $ saved
    cart = _row(doc, "cart")
    # before: 600 kB/s same-zone + 400 kB/s cross-zone; after: 600 + 100
    assert cart["before"]["bytes_per_second"] == approx(1_000_000)
    assert cart["before"]["cross_zone_bytes_per_second"] == approx(400_000)
    assert cart["after"]["cross_zone_bytes_per_second"] == approx(100_000)
    assert cart["before"]["cross_zone_by_pair"] == [
        {"direction": "egress", "client_zone": "a", "server_zone": "b",
         "bytes_per_second": approx(400_000)}]
    assert "locality_in_effect_share" not in cart["before"]
    assert cart["cross_zone_bytes_per_second_saved"] == approx(300_000)
    # normalised: 40 % of the after window's 700 kB/s, less its 100 kB/s
    assert cart["normalized_cross_zone_bytes_per_second_saved"] == approx(180_000)
    assert cart["change"] == "saved"
    assert cart["usd_per_month_saved"] == approx(180_000 * MONTH / 1e9 * 0.02)
    orders = _row(doc, "orders")
    # both directions of the database traffic are billed: 50 kB/s out + 150 kB/s in
    assert orders["before"]["cross_zone_bytes_per_second"] == approx(200_000)
    assert orders["after"]["cross_zone_bytes_per_second"] == approx(200_000)
    assert orders["change"] == "no significant change" and orders["usd_per_month_saved"] == 0
    total = doc["workloads_total"]
    assert total["before"]["cross_zone_bytes_per_second"] == approx(600_000)
    assert total["usd_per_month_saved"] == approx(cart["usd_per_month_saved"])
    # the Services' figures do not include these bytes
    assert doc["total"]["before"]["cross_zone_bytes_per_second"] == approx(
        sum(s["before"]["cross_zone_bytes_per_second"] for s in doc["services"]))

    code = main(["report", *argv, "--now", str(END + 60)])
    text, _ = capsys.readouterr()
    assert code == 0
    (line,) = [ln for ln in text.splitlines() if ln.startswith("shop/cart (Deployment)")]
    assert line.split()[2] == "pod" and line.endswith(f"${180_000 * MONTH / 1e9 * 0.02:,.2f}")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("shop/orders (Deployment)")]
    assert "no significant change" in line

    main(["report", *argv, "--now", str(END + 60), "-o", "csv"])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr()[0])))
    assert [(r["kind"], r["name"], r["remote_kind"]) for r in rows if r["kind"].startswith("w")] \
        == [("workload", "cart", "pod"), ("workload", "orders", "cidr"), ("workload_total", "", "")]

    # one Service selected: non-Service bytes belong to none
    assert run_json(capsys, *argv, "--service", "shop/cart")["workloads"] == []
