"""deploy/daemonset/monitoring: rules, their promtool unit tests, and the dashboard.

promtool (Debian's `prometheus` package, installed by tools/setup.sh) checks the
rule file, runs the unit tests in rules_test*.yml, and parses every PromQL query of
the Grafana dashboard (as the expressions of a generated rule file). The tests fail,
rather than skip, when promtool is missing: CI installs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.monitoring import dashboard, dashboard_queries, load_script, metric_names, substitute
from tests.fixtures.monitoring import panels as all_panels

ROOT = Path(__file__).resolve().parents[3]
MON = ROOT / "deploy" / "daemonset" / "monitoring"
README = ROOT / "deploy" / "daemonset" / "README.md"
TEST_FILES = ("rules_test.yml", "rules_test_weekly.yml")

# Metric contract (docs/metrics.md, with the client_zone label on
# zonemeter_service_locality_in_effect), plus what rules may read from elsewhere.
CONTRACT_METRICS = {
    "zonemeter_service_bytes_total",
    "zonemeter_service_entry_bytes_total",
    "zonemeter_service_hint_ignored_bytes_total",
    "zonemeter_service_client_path_bytes_total",
    "zonemeter_service_locality_in_effect",
    "zonemeter_service_expected_cross_zone_ratio",
    "zonemeter_service_locality_info",
    "zonemeter_service_locality_last_change_timestamp_seconds",
    "zonemeter_workload_bytes_total",
    "zonemeter_unknown_crossing_bytes_total",
    "zonemeter_skipped_bytes_total",
    "zonemeter_unattributed_bytes_total",
    "zonemeter_flow_table_entries",
    "zonemeter_flow_table_capacity",
    "zonemeter_attached_interfaces",
    "zonemeter_collector_duration_seconds",
    "zonemeter_metadata_synced",
    "zonemeter_diagnostic_bytes_total",
    "zonemeter_series_expired_total",
    "zonemeter_hook_counted_bytes_total",
    "zonemeter_interface_bytes_total",
    "zonemeter_hook_unseen_bytes_total",
    "zonemeter_hook_coverage_ratio",
    "zonemeter_datapath_info",
    "zonemeter_hook_tcp_direction_ratio",
}
OTHER_METRICS = {"up", "kube_daemonset_status_number_ready", "kube_daemonset_status_desired_number_scheduled"}
# Grafana variables and the values substituted before promtool parses a query.
DASHBOARD_VARS = {"namespace": ".*", "service": ".*", "price_usd_per_gb": "0.02", "__rate_interval": "5m"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's prometheus package (tools/setup.sh does)")
    return path


def _run(*args: str, cwd: Path = MON) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _prometheusrule() -> dict[str, Any]:
    return yaml.safe_load((MON / "prometheusrule.yaml").read_text())


def _rules() -> Iterator[dict[str, Any]]:
    for group in _prometheusrule()["spec"]["groups"]:
        yield from group["rules"]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def _rule_tests() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in TEST_FILES:
        for group in yaml.safe_load((MON / name).read_text())["tests"]:
            for test in group.get("alert_rule_test", []):
                yield name, test


def _sync_rules() -> Any:
    return load_script(MON / "sync_rules.py")


# ---------------------------------------------------------------- rule files


def test_rules_yml_is_generated_from_the_prometheusrule() -> None:
    sync_rules = _sync_rules()
    assert (MON / "rules.yml").read_text() == sync_rules.render(), (
        "rules.yml is stale: python deploy/daemonset/monitoring/sync_rules.py"
    )
    assert yaml.safe_load((MON / "rules.yml").read_text()) == {"groups": _prometheusrule()["spec"]["groups"]}


def test_promtool_check_rules() -> None:
    result = _run("check", "rules", "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = _run("test", "rules", *TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES)


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    fired: dict[str, int] = {}
    silent: dict[str, int] = {}
    for _, test in _rule_tests():
        bucket = fired if test["exp_alerts"] else silent
        bucket[test["alertname"]] = bucket.get(test["alertname"], 0) + 1
    names = {a["alert"] for a in _alerts()}
    assert names - fired.keys() == set(), "alerts never fired by a unit test"
    assert names - silent.keys() == set(), "alerts never shown silent by a unit test"
    assert set(fired) | set(silent) <= names, "unit tests name an alert that does not exist"


@pytest.mark.parametrize("alert", sorted(a["alert"] for a in _alerts()))
def test_unit_tests_fail_when_the_alert_never_fires(alert: str, tmp_path: Path) -> None:
    """Mutation: an alert whose expression can never be true must fail its tests."""
    doc = {"groups": _prometheusrule()["spec"]["groups"]}
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) == 0"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    files = sorted({name for name, test in _rule_tests() if test["alertname"] == alert})
    for name in files:
        shutil.copy(MON / name, tmp_path / name)
    result = _run("test", "rules", *files, cwd=tmp_path)
    assert result.returncode != 0, f"{alert}: unit tests still pass with a never-firing rule"
    assert alert in result.stdout + result.stderr


def test_alerts_carry_severity_summary_and_runbook() -> None:
    readme = README.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", readme, flags=re.M)
    }
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}, name
        ann = alert["annotations"]
        assert ann["summary"] and ann["description"], name
        assert "runbook" not in ann, f"{name}: the annotation is runbook_url (a URL), as Prometheus mixins use"
        assert ann["runbook_url"] == f"{_sync_rules().RUNBOOK_BASE}#{name.lower()}", name
        assert "First step: " in ann["description"], f"{name}: the description ends with a first step"
        assert name.lower() in anchors, f"README.md has no section for {name}"


def test_rules_read_only_contract_metrics() -> None:
    recorded = {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        for metric in metric_names(str(rule["expr"])):
            assert metric in CONTRACT_METRICS | OTHER_METRICS | recorded, (
                f"{rule.get('record') or rule.get('alert')}: unknown metric {metric}"
            )


def test_price_is_a_single_constant() -> None:
    price_rules = [r for r in _rules() if r.get("record") == "zonemeter:cross_zone_price_usd_per_gigabyte"]
    assert [r["expr"] for r in price_rules] == ["vector(0.02)"]


# ---------------------------------------------------------------- dashboard

def _substitute(where: str, expr: str) -> str:
    return substitute(where, expr, DASHBOARD_VARS)


def _promtool_parses(exprs: list[tuple[str, str]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    rules = [{"record": f"dashboard:query_{i}", "expr": _substitute(w, e)} for i, (w, e) in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    return _run("check", "rules", str(path), cwd=tmp_path)


def test_every_dashboard_query_parses_with_promtool(tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 15
    result = _promtool_parses(queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_promtool_rejects_a_broken_dashboard_query(tmp_path: Path) -> None:
    result = _promtool_parses([("broken", "sum by (service (rate(x[5m]))")], tmp_path)
    assert result.returncode != 0


def test_dashboard_queries_read_contract_metrics() -> None:
    for where, expr in dashboard_queries():
        for metric in metric_names(_substitute(where, expr)):
            assert metric in CONTRACT_METRICS | OTHER_METRICS, f"{where}: unknown metric {metric}"


def test_dashboard_covers_the_issue() -> None:
    dash = dashboard()
    panels = [p for p in all_panels(dash["panels"]) if p["type"] != "row"]
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    types = {p["type"] for p in panels}
    for needle in (
        'crossing="cross_zone"',  # cross-zone bytes/s per Service
        "zonemeter_service_locality_in_effect",
        "zonemeter_service_hint_ignored_bytes_total",
        "$price_usd_per_gb",  # dollars per month
        'up{job="zonemeter"}',  # agent health
        "zonemeter_flow_table_entries",
        "zonemeter_service_expected_cross_zone_ratio",  # expected beside observed, per client zone
    ):
        assert needle in exprs, needle
    (versus,) = [p for p in panels if "zonemeter_service_expected_cross_zone_ratio" in str(p.get("targets"))]
    assert "sum by (namespace, service, client_zone) (rate(zonemeter_service_bytes_total" in str(versus["targets"])
    assert {"heatmap", "state-timeline", "timeseries", "stat"} <= types
    heatmap = next(p for p in panels if p["type"] == "heatmap")
    assert "client_zone, server_zone" in heatmap["targets"][0]["expr"]


def test_dashboard_layout_is_consistent() -> None:
    dash = dashboard()
    panels = list(all_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area
        for target in p.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource"} | {k for k in DASHBOARD_VARS if not k.startswith("__")}


def test_metric_name_extraction_finds_what_it_must() -> None:
    expr = (
        'sum by (namespace, service) (rate(zonemeter_servce_bytes_total{crossing="cross_zone"}[1h] offset 1w))'
        " * on () group_left () zonemeter:price * 2629746 / 1e9 > bool 0.5 and up == 0"
    )
    assert metric_names(expr) == {"zonemeter_servce_bytes_total", "zonemeter:price", "up"}
    assert "zonemeter_servce_bytes_total" not in CONTRACT_METRICS


def test_runbook_base_rewrites_every_runbook_url(tmp_path: Path) -> None:
    sync_rules = _sync_rules()
    sync_rules.SOURCE = tmp_path / "prometheusrule.yaml"
    sync_rules.TARGET = tmp_path / "rules.yml"
    sync_rules.SOURCE.write_text((MON / "prometheusrule.yaml").read_text())
    assert sync_rules.main(["--runbook-base", "https://wiki.example/ops/zonemeter"]) == 0
    rules = yaml.safe_load(sync_rules.TARGET.read_text())["groups"]
    urls = [r["annotations"]["runbook_url"] for g in rules for r in g["rules"] if "alert" in r]
    assert len(urls) == len(_alerts()) > 5
    assert all(re.fullmatch(r"https://wiki\.example/ops/zonemeter#zonemeter[a-z]+", u) for u in urls), urls
    assert sync_rules.main(["--runbook-base", "not a url"]) == 2


def test_withdrawn_alert_says_what_is_true_for_each_state() -> None:
    """Node-local (internalTrafficPolicy: Local) is locality in effect: the withdrawn alert
    neither fires for it nor claims its clients reach every zone; the runbook says so."""
    (alert,) = [a for a in _alerts() if a["alert"] == "ZonemeterServiceLocalityWithdrawn"]
    desc = alert["annotations"]["description"]
    assert "now reach endpoints in every zone" not in desc
    assert "Node-local routing (internalTrafficPolicy: Local) counts as in effect" in desc
    assert "rejected, when the reason is no-endpoints" in desc
    section = README.read_text().split("### ZonemeterServiceLocalityWithdrawn", 1)[1].split("\n### ", 1)[0]
    assert "`internal-traffic-policy-local`: never fires this alert" in section
    assert "`no-endpoints`: no endpoint is usable" in section
    assert "`internalTrafficPolicy: Local`\nwas set" not in section and "Local` was set" not in section
