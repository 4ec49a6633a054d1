"""Table, JSON and CSV output of ``zonemeter report``."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import struct
from pathlib import Path

import pytest

from agent.report.compute import (
    CHART_PANELS,
    PairRate,
    Report,
    ServiceKey,
    Spread,
    WindowStats,
    assumptions,
    change_of,
    total_of,
)
from agent.report.pricing import Price
from agent.report.render import (
    CSV_COLUMNS,
    fmt_change,
    fmt_rate,
    fmt_usd,
    table_rows,
    to_csv,
    to_json,
    to_table,
)
from agent.report.timespec import Window

B, A = Window(1_736_121_600, 1_736_125_200), Window(1_736_125_200, 1_736_128_800)
AWS = Price("aws", 0.02)
W_KEYS = {"bytes_per_second", "cross_zone_bytes_per_second", "cross_zone_fraction",
          "hint_ignored_bytes_per_second", "locality_in_effect_share"}
#: steady traffic: 60 sub-windows with identical rates (no noise)
STEADY = Spread(60, 60.0, 0.0, 0.0, 0.0)
#: a standard error of 1 kB/s for both rates of a window
NOISY = Spread(60, 60.0, 1e6, 1e6, 1e6)
#: a number in scientific notation, as Python's %g writes it
SCIENTIFIC = re.compile(r"\d[eE][-+]?\d")


def _report() -> Report:
    cart = change_of(
        ServiceKey("shop", "cart"),
        WindowStats(B, 4e6, 3e6, 0.0, 0.0, (PairRate("request", "a", "b", 2e6),
                                            PairRate("response", "a", "b", 1e6)), spread=STEADY),
        WindowStats(A, 1.3e6, 3e5, 1e5, 1.0, (PairRate("request", "a", "b", 2e5),
                                              PairRate("response", "a", "b", 1e5)),
                    spread=STEADY),
        AWS, change_time=A.start)
    new = change_of(ServiceKey("shop", "new"), WindowStats(B, spread=STEADY),
                    WindowStats(A, 1e6, 0.0, 0.0, 0.0, spread=STEADY), AWS, change_time=A.start)
    changes = (cart, new)
    return Report(AWS, B, A, A.start, changes, total_of(list(changes), AWS, B, A), (),
                  assumptions(AWS))


def test_json_follows_the_issue_schema() -> None:
    doc = json.loads(json.dumps(to_json(_report())))
    assert doc["price"] == {"name": "aws", "usd_per_gb_crossing": 0.02}
    assert doc["windows"] == {"before": [B.start, B.end], "after": [A.start, A.end]}
    cart, new = doc["services"]
    for entry in (cart, new, doc["total"]):
        for w in ("before", "after"):
            assert W_KEYS <= set(entry[w])
        assert {"cross_zone_bytes_per_second_saved",
                "normalized_cross_zone_bytes_per_second_saved", "usd_per_month_saved"} <= set(entry)
    assert (cart["namespace"], cart["name"]) == ("shop", "cart")
    assert cart["before"]["cross_zone_fraction"] == 0.75
    assert cart["after"]["hint_ignored_bytes_per_second"] == 1e5
    assert cart["normalized_cross_zone_bytes_per_second_saved"] == pytest.approx(675_000)
    assert cart["usd_per_month_saved"] == pytest.approx(35.501571)
    assert cart["warnings"] == []
    # an undefined figure is null, never a made-up 0
    assert new["before"]["cross_zone_fraction"] is None
    assert new["normalized_cross_zone_bytes_per_second_saved"] is None
    assert new["usd_per_month_saved"] is None
    assert new["warnings"][0].startswith("no traffic in the before window")
    assert doc["total"]["usd_per_month_saved"] == pytest.approx(35.501571)
    assert any("GB = 10^9 bytes" in a for a in doc["assumptions"])


def test_csv_rows() -> None:
    rows = list(csv.DictReader(io.StringIO(to_csv(_report()))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [(r["kind"], r["name"]) for r in rows] == [("service", "cart"), ("service", "new"),
                                                      ("total", "")]
    cart = rows[0]
    assert float(cart["before_cross_zone_bytes_per_second"]) == 3e6
    assert float(cart["after_locality_in_effect_share"]) == 1.0
    assert float(cart["before_start"]) == B.start
    assert float(cart["usd_per_month_saved"]) == pytest.approx(35.501571)
    assert rows[1]["normalized_cross_zone_bytes_per_second_saved"] == ""
    assert rows[1]["warnings"].startswith("no traffic in the before window")


def test_table() -> None:
    text = to_table(_report())
    lines = text.splitlines()
    assert lines[0] == ("before: 2025-01-06T00:00:00Z .. 2025-01-06T01:00:00Z   "
                        "after: 2025-01-06T01:00:00Z .. 2025-01-06T02:00:00Z")
    (cart,) = [ln for ln in lines if ln.startswith("shop/cart ")]
    assert "3 MB/s > 300 kB/s" in cart and "75% > 23%" in cart and cart.endswith("$35.50")
    # exact (steady) data: the noise threshold is 0 and the saving is significant
    assert "  2.7 MB/s ±0 B/s  " in cart and "  675 kB/s ±0 B/s  " in cart
    (total,) = [ln for ln in lines if ln.startswith("TOTAL")]
    assert total.endswith("$35.50")
    assert "    request  a -> b: 2 MB/s > 200 kB/s" in lines
    assert "  ! shop/new: no traffic in the before window: the normalised saving is undefined" \
        in lines
    assert "assumptions:" in lines


@pytest.mark.parametrize("value, text", [
    (None, "-"), (0, "0 B/s"), (999, "999 B/s"), (1500, "1.5 kB/s"), (2.7e6, "2.7 MB/s"),
    (-3e5, "-300 kB/s"), (1.25e9, "1.25 GB/s"),
    # never scientific notation: tiny residues, rounding across a unit, beyond GB/s
    (1.82e-12, "<0.01 B/s"), (-3e-9, "<0.01 B/s"), (0.42, "0.42 B/s"), (999.7, "1 kB/s"),
    (12.345, "12.3 B/s"), (123_456, "123 kB/s"), (2.5e12, "2.5 TB/s"), (1e18, "1000 PB/s"),
    (float("nan"), "-")])
def test_fmt_rate(value: float | None, text: str) -> None:
    assert fmt_rate(value) == text


@pytest.mark.parametrize("value, text", [
    (None, "-"), (0, "$0.00"), (34.992, "$34.99"), (-42.4145, "-$42.41"), (12345.6, "$12,345.60")])
def test_fmt_usd(value: float | None, text: str) -> None:
    assert fmt_usd(value) == text


def test_per_service_windows_in_table_and_csv() -> None:
    r = _report()
    per = Report(r.price, None, None, None, r.services, r.total, ("shop/x: skipped: no data",),
                 r.assumptions)
    text = to_table(per)
    assert text.startswith("windows: per Service, around its last locality change")
    assert ("  shop/cart  (change 2025-01-06T01:00:00Z; before 2025-01-06T00:00:00Z.."
            "2025-01-06T01:00:00Z, after 2025-01-06T01:00:00Z..2025-01-06T02:00:00Z)") in text
    assert "  ! shop/x: skipped: no data" in text
    rows = list(csv.DictReader(io.StringIO(to_csv(per))))
    assert rows[-1]["kind"] == "total" and rows[-1]["before_start"] == ""
    assert to_json(per)["windows"] == {"before": None, "after": None}


def test_chart_of_many_per_service_windows_draws_the_first_panels(tmp_path: Path) -> None:
    """300 Services with their own windows: a readable PNG of CHART_PANELS panels, not 300
    (which would exceed matplotlib's image size limit)."""
    from agent.report import chart

    changes = []
    for i in range(300):
        b = WindowStats(B, 4e6, 3e6 - i, 0.0, 0.0)
        a = WindowStats(A, 1.3e6, 3e5, 0.0, 1.0)
        changes.append(change_of(ServiceKey("shop", f"s{i:03d}"), b, a, AWS,
                                 change_time=A.start, series=((A.start, 1e5), (A.end, 2e5))))
    report = Report(AWS, None, None, None, tuple(changes), total_of(changes, AWS, B, A), (),
                    assumptions(AWS))
    png = tmp_path / "many.png"
    chart.render_png(report, png)
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    rows = math.ceil(CHART_PANELS / 2)
    assert width < 2000 and height < 400 * rows  # 2 columns x 6 rows at 100 dpi


def _noise_report() -> Report:
    """A demo where nothing changed (cart: 50 B/s less of 3 MB/s, with 1 kB/s standard
    errors), one real rise (pay), an idle Service and a zone pair idle in both windows."""
    cart = change_of(
        ServiceKey("shop", "cart"),
        WindowStats(B, 4e6, 3e6, 0.0, 1.0, (PairRate("request", "a", "b", 3e6),
                                            PairRate("request", "a", "c", 0.0)), spread=NOISY),
        WindowStats(A, 4e6, 3e6 - 50, 0.0, 1.0, (PairRate("request", "a", "b", 3e6 - 50),
                                                 PairRate("request", "a", "c", 0.0)),
                    spread=NOISY),
        AWS, change_time=A.start)
    pay = change_of(
        ServiceKey("shop", "pay"),
        WindowStats(B, 2e6, 1e5, 0.0, 1.0, (PairRate("request", "a", "b", 1e5),), spread=STEADY),
        WindowStats(A, 2e6, 1.1e5, 0.0, 0.0, (PairRate("request", "a", "b", 1.1e5),),
                    spread=STEADY),
        AWS, change_time=A.start)
    idle = change_of(ServiceKey("shop", "idle"), WindowStats(B, spread=STEADY),
                     WindowStats(A, spread=STEADY), AWS, change_time=A.start)
    changes = [cart, pay, idle]
    return Report(AWS, B, A, A.start, tuple(changes), total_of(changes, AWS, B, A), (),
                  assumptions(AWS))


def test_noise_reads_no_significant_change_in_table_csv_and_json() -> None:
    r = _noise_report()
    (cart,) = [row for row in table_rows(r) if row[0] == "shop/cart"]
    # the ± is 2 standard errors: sqrt(1e6 + 1e6) x 2 = 2.83 kB/s
    assert cart[-3] == "no significant change (±2.83 kB/s)"
    assert cart[-1] == "no significant change"
    rows = {row["name"]: row for row in csv.DictReader(io.StringIO(to_csv(r)))}
    assert rows["cart"]["change"] == "no significant change"
    assert rows["cart"]["significant"] == "false"
    assert rows["cart"]["cross_zone_bytes_per_second_saved_significant"] == "false"
    assert float(rows["cart"]["cross_zone_bytes_per_second_saved_stderr"]) == pytest.approx(
        2e6 ** 0.5)
    assert float(rows["cart"]["usd_per_month_saved"]) == 0.0
    doc = json.loads(json.dumps(to_json(r)))
    (jcart,) = [s for s in doc["services"] if s["name"] == "cart"]
    assert jcart["significant"] is False and jcart["change"] == "no significant change"
    assert jcart["usd_per_month_saved"] == 0.0
    assert jcart["normalized_cross_zone_bytes_per_second_saved_stderr"] > 0
    assert jcart["before"]["cross_zone_bytes_per_second_stderr"] == pytest.approx(1000)
    assert jcart["before"]["sub_windows"] == 60
    # the total prices pay's rise only, never cart's noise
    assert doc["total"]["usd_per_month_saved"] == pytest.approx(-AWS.usd_per_month(1e4))


def test_a_rise_reads_cost_rose_never_negative_dollars(tmp_path: Path) -> None:
    from agent.report import chart

    r = _noise_report()
    text = to_table(r)
    (pay,) = [ln for ln in text.splitlines() if ln.startswith("shop/pay ")]
    assert pay.endswith("cost rose $0.53") and "rose 10 kB/s ±0 B/s" in pay
    (total,) = [ln for ln in text.splitlines() if ln.startswith("TOTAL")]
    assert total.endswith("cost rose $0.53")
    assert "-$" not in text and "$-" not in text
    title = chart.chart_title(r)
    assert "cost rose $0.53/month at aws" in title and "-$" not in title and "$-" not in title
    saving = _report()
    assert "$35.50/month saved at aws" in chart.chart_title(saving)
    only_noise = Report(AWS, B, A, A.start, r.services[:1], total_of(list(r.services[:1]), AWS,
                                                                      B, A), (), r.assumptions)
    assert "no significant change at aws" in chart.chart_title(only_noise)
    chart.render_png(r, tmp_path / "rise.png")  # the title renders


def test_no_scientific_notation_anywhere() -> None:
    """The demo's "SAVED/S 1.82e-12 B/s": a residue of floating-point sums."""
    tiny = change_of(ServiceKey("shop", "cart"),
                     WindowStats(B, 3.0000000000018, 1e-9, spread=NOISY),
                     WindowStats(A, 3.0, 1e-9 - 1.82e-12, spread=NOISY), AWS)
    r = Report(AWS, B, A, None, (tiny,), total_of([tiny], AWS, B, A), (), assumptions(AWS))
    for text in (to_table(r), to_table(r, all_rows=True)):
        assert not SCIENTIFIC.search(text), text
    assert fmt_change(1.82e-12, 1e-12, True) == "<0.01 B/s ±<0.01 B/s"


def test_all_zero_rows_are_hidden_and_counted() -> None:
    r = _noise_report()
    text = to_table(r)
    assert "shop/idle" not in text
    assert "a -> c" not in text
    assert ("hidden: 1 Service and 1 zone pair with no bytes in either window "
            "(--all-rows shows them)") in text.splitlines()
    full = to_table(r, all_rows=True)
    assert "shop/idle" in full and "    request  a -> c: 0 B/s > 0 B/s" in full
    assert "hidden:" not in full
    doc = to_json(r)
    assert [s["name"] for s in doc["services"]] == ["cart", "pay"]
    assert doc["hidden_all_zero_rows"] == {"services": 1, "zone_pairs": 1, "workloads": 0}
    assert [p["server_zone"] for p in doc["services"][0]["before"]["cross_zone_by_pair"]] == ["b"]
    assert len(to_json(r, all_rows=True)["services"]) == 3
    assert [row["name"] for row in csv.DictReader(io.StringIO(to_csv(r)))] == ["cart", "pay", ""]
    assert len(list(csv.DictReader(io.StringIO(to_csv(r, all_rows=True))))) == 4


def test_classes_in_json_table_and_zone_pairs_summed_over_classes() -> None:
    from agent.report.compute import class_costs
    # shop/front: its clients are pods, an ALB (free on AWS) and an NLB (billed), all a -> b
    before = WindowStats(B, 4e6, 3e6, 0.0, 1.0, (
        PairRate("request", "a", "b", 1e6, "pod", "none"),
        PairRate("request", "a", "b", 1.5e6, "load-balancer", "aws-alb"),
        PairRate("request", "a", "b", 5e5, "load-balancer", "aws-nlb")), spread=STEADY)
    after = WindowStats(A, 4e6, 2.2e6, 0.0, 1.0, (
        PairRate("request", "a", "b", 2e5, "pod", "none"),
        PairRate("request", "a", "b", 1.5e6, "load-balancer", "aws-alb"),
        PairRate("request", "a", "b", 5e5, "load-balancer", "aws-nlb")), spread=STEADY)
    front = change_of(ServiceKey("shop", "front"), before, after, AWS)
    total = total_of([front], AWS, B, A)
    report = Report(AWS, B, A, A.start, (front,), total, (), assumptions(AWS),
                    classes=class_costs("services", total.before, total.after, AWS))
    doc = json.loads(json.dumps(to_json(report)))
    # zone pairs stay one row per (direction, zones), the classes are summed there
    assert doc["services"][0]["after"]["cross_zone_by_pair"] == [
        {"direction": "request", "client_zone": "a", "server_zone": "b", "bytes_per_second": 2.2e6}]
    assert {(c["client_kind"], c["lb_type"]): c["bytes_per_second"]
            for c in doc["services"][0]["after"]["cross_zone_by_class"]} == {
        ("pod", ""): 2e5, ("load-balancer", "aws-alb"): 1.5e6, ("load-balancer", "aws-nlb"): 5e5}
    alb = next(c for c in doc["classes"] if c["lb_type"] == "aws-alb")
    assert alb["billed"] is False and alb["usd_per_month_after"] == 0.0
    assert alb["reason"].startswith("Application Load Balancer") and alb["scope"] == "services"
    nlb = next(c for c in doc["classes"] if c["lb_type"] == "aws-nlb")
    assert nlb["billed"] is True and nlb["usd_per_month_after"] == pytest.approx(AWS.usd_per_month(5e5))
    # the saving is priced on the billed classes only: pods' 0.8 MB/s, the NLB unchanged
    assert doc["services"][0]["billed_normalized_cross_zone_bytes_per_second_saved"] == \
        pytest.approx(8e5)
    assert doc["services"][0]["usd_per_month_saved"] == pytest.approx(AWS.usd_per_month(8e5))
    text = to_table(report)
    lines = text.splitlines()
    i = lines.index("cross-zone Service bytes by the client's class and their cost at the price (aws):")
    rows = {ln.split()[0] + ("" if ln.split()[0] != "load-balancer" else " " + ln.split()[1]): ln
            for ln in lines[i + 2:i + 5]}
    assert "$0.00 > $0.00" in rows["load-balancer aws-alb"] and " no " in rows["load-balancer aws-alb"]
    assert " yes " in rows["load-balancer aws-nlb"] and " yes " in rows["pod"]
    assert any("not billed load-balancer/aws-alb" in a for a in report.assumptions)
