"""Prices per GB crossing a zone boundary."""

from __future__ import annotations

import pytest

from agent.errors import InputError
from agent.report.pricing import Price, parse_price


@pytest.mark.parametrize("text, name, usd", [
    ("aws", "aws", 0.02), ("AWS", "aws", 0.02), ("gcp", "gcp", 0.01), ("azure", "azure", 0.0),
    ("0.015", "custom", 0.015), ("$0.03", "custom", 0.03), ("0", "custom", 0.0)])
def test_prices(text: str, name: str, usd: float) -> None:
    assert parse_price(text) == Price(name, usd)


@pytest.mark.parametrize("text", ["oracle", "", "-0.01", "nan", "inf", "0.01/GB"])
def test_bad_prices(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_price(text)
    assert str(err.value).startswith("--price: ")


def test_usd_per_month() -> None:
    # 1 MB/s for 30.44 days (2,629,746 s) = 2,629.746 GB; x $0.02 (aws, both sides)
    assert parse_price("aws").usd_per_month(1_000_000) == pytest.approx(52.59492)
    assert parse_price("gcp").usd_per_month(1_000_000) == pytest.approx(26.29746)
    assert parse_price("azure").usd_per_month(1_000_000) == 0
    assert "0.01/GB on each side" in parse_price("aws").describe()


def test_one_month_length_everywhere() -> None:
    """The report, the demo (through this module), the recording rules and the dashboard
    price a month of the same length."""
    from pathlib import Path

    from agent.report.pricing import SECONDS_PER_MONTH

    mon = Path(__file__).resolve().parents[3] / "deploy" / "daemonset" / "monitoring"
    assert SECONDS_PER_MONTH == 2_629_746
    for f in ("prometheusrule.yaml", "rules.yml", "grafana-dashboard.json"):
        text = (mon / f).read_text()
        assert str(SECONDS_PER_MONTH) in text, f
        assert "2592000" not in text and "30 * 86400" not in text, f
