"""Table, JSON and CSV output of ``zonemeter report``."""

from __future__ import annotations

import csv
import io
import json
import math
import struct
from pathlib import Path

import pytest

from agent.report.compute import (
    CHART_PANELS,
    PairRate,
    Report,
    ServiceKey,
    WindowStats,
    assumptions,
    change_of,
    total_of,
)
from agent.report.pricing import Price
from agent.report.render import CSV_COLUMNS, fmt_rate, fmt_usd, to_csv, to_json, to_table
from agent.report.timespec import Window

B, A = Window(1_736_121_600, 1_736_125_200), Window(1_736_125_200, 1_736_128_800)
AWS = Price("aws", 0.02)
W_KEYS = {"bytes_per_second", "cross_zone_bytes_per_second", "cross_zone_fraction",
          "hint_ignored_bytes_per_second", "locality_in_effect_share"}


def _report() -> Report:
    cart = change_of(
        ServiceKey("shop", "cart"),
        WindowStats(B, 4e6, 3e6, 0.0, 0.0, (PairRate("request", "a", "b", 2e6),
                                            PairRate("response", "a", "b", 1e6))),
        WindowStats(A, 1.3e6, 3e5, 1e5, 1.0, (PairRate("request", "a", "b", 2e5),
                                              PairRate("response", "a", "b", 1e5))),
        AWS, change_time=A.start)
    new = change_of(ServiceKey("shop", "new"), WindowStats(B),
                    WindowStats(A, 1e6, 0.0, 0.0, 0.0), AWS, change_time=A.start)
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
    (total,) = [ln for ln in lines if ln.startswith("TOTAL")]
    assert total.endswith("$35.50")
    assert "    request  a -> b: 2 MB/s > 200 kB/s" in lines
    assert "  ! shop/new: no traffic in the before window: the normalised saving is undefined" \
        in lines
    assert "assumptions:" in lines


@pytest.mark.parametrize("value, text", [
    (None, "-"), (0, "0 B/s"), (999, "999 B/s"), (1500, "1.5 kB/s"), (2.7e6, "2.7 MB/s"),
    (-3e5, "-300 kB/s"), (1.25e9, "1.25 GB/s")])
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
