"""What ``zonemeter demo`` prints at the end (``tools.demo.cli._report``), from a finished
run's result: no lab is built, the run is a stand-in with the attributes the report reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.fixtures.lab_hints import lab_hints
from tools.demo import cli as demo_cli
from tools.demo.agents import parse_metrics
from tools.demo.cluster import ServiceModel, ServiceTruth, controller_snapshot
from tools.demo.run import DemoResult, client_seconds
from tools.demo.summary import build_summary
from tools.demo.topology import load_demo
from tools.lab import FlowResult, Lab

METRICS = """\
# TYPE zonemeter_service_bytes_total counter
zonemeter_service_bytes_total{namespace="shop",service="cart",port="80",client_zone="zone-a",server_zone="zone-b",crossing="cross_zone",direction="request"} 4000.0
# TYPE zonemeter_service_locality_in_effect gauge
zonemeter_service_locality_in_effect{namespace="shop",service="cart",client_zone="zone-a"} 0.0
# TYPE zonemeter_service_locality_info gauge
zonemeter_service_locality_info{namespace="shop",service="cart",mode="topology-mode",reason="min-allocation-exceeds-overload-threshold"} 1.0
"""


def flow(seconds: float) -> FlowResult:
    return FlowResult("frontend-a1", "10.96.0.10", 80, "tcp", 40, 0, (), 16000, 160000, seconds)


def finished_run(tmp_path: Path) -> tuple[DemoResult, Any]:
    spec = load_demo()
    lab = Lab(spec.topology, prefix="zmrep")  # not built
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(controller_snapshot(lab, lab_hints("model"))))
    truth = ServiceTruth()
    truth.bytes["cross_zone"] = 4000
    truth.by_series = {("zone-a", "zone-b", "cross_zone", "request"): 4000}
    model = ServiceModel(key="shop/cart", mode="topology-mode",
                         reason="min-allocation-exceeds-overload-threshold",
                         locality_in_effect={"zone-a": False}, warnings=("auto-minimum-endpoints",),
                         selection={}, filtering={})
    agents = parse_metrics(METRICS)
    flows = [flow(10.0), flow(10.1), flow(9.9)]
    result = DemoResult(summary=build_summary(12.3, agents, {"shop/cart": truth},
                                              {"shop/cart": model}),
                        agents=agents, truth={"shop/cart": truth}, flows=flows,
                        traffic_seconds=client_seconds(flows))
    run = SimpleNamespace(
        cluster=SimpleNamespace(topology=spec.topology, prefix="zmrep", snapshot_path=snapshot,
                                lab=SimpleNamespace(state_dir=tmp_path / "state")),
        workdir=tmp_path,
        fleet=SimpleNamespace(agents=[SimpleNamespace(node="a1", url="http://127.0.0.1:19001")]),
        prometheus_url=None)
    return result, run


def report(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    result, run = finished_run(tmp_path)
    args = argparse.Namespace(output="table", keep="--keep" in flags)
    demo_cli._report(result, run, args, ["zone-a", "zone-b", "zone-c"], {})
    return capsys.readouterr().out


def test_client_seconds_is_the_median_client() -> None:
    assert client_seconds([flow(10.0), flow(10.2), flow(4.0)]) == 10.0
    assert client_seconds([]) == 0.0


def test_title_says_what_the_seconds_measure(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    title = report(tmp_path, capsys).splitlines()[0]
    assert title.startswith("zonemeter demo: 10.0 s of traffic per client (12.3 s from "
                            "starting the first client to the last reply)")


def test_command_is_one_the_user_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "venv" / "bin" / "zonemeter"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert demo_cli.zonemeter_command(str(script), "/py") == str(script.resolve())
    monkeypatch.setenv("PATH", str(script.parent))
    script.chmod(0o755)
    assert demo_cli.zonemeter_command(str(script), "/py") == "zonemeter"
    # python -m agent: argv[0] is agent/__main__.py
    assert demo_cli.zonemeter_command("/repo/agent/__main__.py", "/v/bin/python") == \
        "/v/bin/python -m agent"


def test_why_line_prints_a_runnable_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", [str(Path("agent/__main__.py").resolve())])
    why = next(ln for ln in report(tmp_path, capsys).splitlines() if ln.startswith("why:"))
    import sys
    assert why.startswith(f"why: {sys.executable} -m agent explain --snapshot {tmp_path}")


def test_keep_prints_top_and_the_exact_teardown_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", [str(Path("agent/__main__.py").resolve())])
    import sys
    cmd = f"{sys.executable} -m agent"
    lines = [ln.strip() for ln in report(tmp_path, capsys, "--keep").splitlines()]
    assert "agent a1: curl -s http://127.0.0.1:19001/metrics" in lines
    assert f"{cmd} top --url http://127.0.0.1:19001" in lines
    assert f"tear down: {cmd} demo --teardown {tmp_path}" in lines


def test_json_output_still_names_the_workdir_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # `demo -o json` leaves its work directory in /tmp like the table run: say which one,
    # on standard error so standard output stays one JSON document
    monkeypatch.setattr("sys.argv", [str(Path("agent/__main__.py").resolve())])
    import sys
    result, run = finished_run(tmp_path)
    demo_cli._report(result, run, argparse.Namespace(output="json", keep=False),
                     ["zone-a", "zone-b", "zone-c"], {})
    captured = capsys.readouterr()
    assert json.loads(captured.out)["double_counted_bytes"] == 0
    assert captured.err.splitlines() == [
        f"zonemeter demo: why: {sys.executable} -m agent explain --snapshot "
        f"{tmp_path / 'snapshot.json'} (snapshot and agent logs stay in {tmp_path})"]


def test_real_kubernetes_is_named_with_versions_and_a_kubectl_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result, run = finished_run(tmp_path)
    kc, kubectl = tmp_path / "lab kube" / "admin.kubeconfig", "/var/cache/zonemeter/kube/v1.37.2/kubectl"
    result.summary["kubernetes"] = {"mode": "real", "version": "v1.37.2", "etcd": "v3.7.0", "proxyMode": "nftables",
                                    "kubeProxyNodes": ["a1", "b1"], "emulatedProxyNodes": ["c2"],
                                    "adminKubeconfig": str(kc), "kubectl": kubectl}
    demo_cli._report(result, run, argparse.Namespace(output="table", keep=True), ["zone-a", "zone-b", "zone-c"], {})
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    assert ("kubernetes: real v1.37.2 (etcd v3.7.0): hints by the real EndpointSlice controller, kube-proxy "
            "nftables on a1, b1, the lab's emulation (ignores hints) on c2") in lines
    # quoted as a shell needs it: the work directory may contain spaces
    assert f"KUBECONFIG='{kc}' {kubectl} get endpointslices -A -o yaml" in lines


def test_emulated_kubernetes_names_the_hint_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result, run = finished_run(tmp_path)
    result.summary["kubernetes"] = {"mode": "emulated", "hints": "oracle"}
    demo_cli._report(result, run, argparse.Namespace(output="table", keep=True), ["zone-a", "zone-b", "zone-c"], {})
    out = capsys.readouterr().out
    assert ("kubernetes: emulated (snapshot file, hints and kube-proxy endpoints from the oracle, kube-proxy "
            "emulation)") in out.splitlines()
    assert "KUBECONFIG" not in out
