"""``zonemeter report`` on a real Prometheus where nothing changed: noise is not a saving.

The TSDB (built with ``promtool tsdb create-blocks-from openmetrics``, as in
:mod:`tests.fixtures.promdata`) holds one Service whose traffic is drawn from the same
distribution in both windows (seeded), so the windows' averages differ by chance only, and a
zone pair whose counter never moves. The report must say "no significant change", price
nothing, print no scientific notation, hide the idle zone pair and say so.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import main
from tests.fixtures.promdata import running_prometheus

T0 = 1736121600 + 86400 * 3  # 2025-01-09T00:00:00Z, a day of its own
CHANGE = T0 + 3600
END = T0 + 7200
SCRAPE = 15
_L = 'namespace="demo",service="api",port="80",client_zone="a",server_zone="{sz}",' \
     'crossing="{cr}",direction="request",instance="node-a"'


def noise_input() -> str:
    rng = random.Random(19)
    lines = ["# TYPE zonemeter_service_bytes counter"]
    for labels, mean in ((_L.format(sz="a", cr="same_zone"), 30_000),
                         (_L.format(sz="b", cr="cross_zone"), 20_000),
                         (_L.format(sz="c", cr="cross_zone"), 0)):
        value = 1_000_000
        for t in range(T0, END + 1, SCRAPE):
            if t > T0 and mean:
                value += int(rng.gauss(mean, mean * 0.3)) * SCRAPE
            lines.append(f"zonemeter_service_bytes_total{{{labels}}} {value} {t}")
    return "\n".join(lines + ["# EOF"]) + "\n"


@pytest.fixture(scope="module")
def noise_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("noise-prom")
    with running_prometheus(root, openmetrics=noise_input()) as url:
        yield url


def _report(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> str:
    code = main(["report", "--prometheus", url, "--now", str(END + 60),
                 "--before", f"{T0}..{CHANGE}", "--after", f"{CHANGE}..{END}", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_unchanged_traffic_reads_no_significant_change(noise_url: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(_report(capsys, noise_url, "-o", "json"))
    (api,) = doc["services"]
    # the averages do differ (by chance), but by less than twice their standard error
    assert api["cross_zone_bytes_per_second_saved"] != 0
    se = api["cross_zone_bytes_per_second_saved_stderr"]
    assert 0 < abs(api["cross_zone_bytes_per_second_saved"]) <= 2 * se
    assert api["cross_zone_bytes_per_second_saved_significant"] is False
    assert api["significant"] is False and api["change"] == "no significant change"
    assert api["usd_per_month_saved"] == 0
    assert doc["total"]["usd_per_month_saved"] == 0
    assert doc["total"]["change"] == "no significant change"
    # 240 scrapes per hour, sub-windows of 4 scrapes
    assert api["before"]["sub_windows"] == 60 and api["before"]["sub_window_seconds"] == 60
    # the zone pair a -> c never moved: hidden, and counted
    assert [p["server_zone"] for p in api["before"]["cross_zone_by_pair"]] == ["b"]
    assert doc["hidden_all_zero_rows"] == {"services": 0, "zone_pairs": 1, "workloads": 0}

    text = _report(capsys, noise_url)
    (row,) = [ln for ln in text.splitlines() if ln.startswith("demo/api ")]
    assert row.endswith("  no significant change")
    assert "no significant change (±" in row
    assert not re.search(r"\d[eE][-+]?\d", text)
    assert "$" not in row and "-$" not in text
    assert ("hidden: 1 zone pair with no bytes in either window (--all-rows shows them)"
            in text.splitlines())
    assert "    request  a -> c: 0 B/s > 0 B/s" in _report(capsys, noise_url, "--all-rows")
