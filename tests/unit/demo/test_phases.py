"""``DemoRun.execute`` reports each phase (lab, agents n/N, warm-up, traffic) as it starts,
so the first quiet seconds of ``zonemeter demo`` say what is happening. The lab, the agents
and the traffic are stand-ins here: only the order of the phases is under test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.demo.agents import AgentMetrics
from tools.demo.run import DemoOptions, DemoRun
from tools.demo.topology import load_demo
from tools.lab import FlowResult


class _Handle:
    client = "frontend-a1"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def done(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def wait(self) -> FlowResult:
        return FlowResult(self.client, "10.96.0.10", 80, "tcp", 1, 0, (), 400, 4000, self.seconds)


class _Fleet:
    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.agents: list[Any] = []
        self.last_nodes: dict[str, AgentMetrics] = {}

    def start(self, on_ready: Any = None) -> None:
        for i, node in enumerate(self.nodes, 1):
            on_ready(node, i, len(self.nodes))

    def scrape_settled(self, after: float | None = None) -> AgentMetrics:
        return AgentMetrics()

    def stop(self) -> dict[str, int | None]:
        return {}


def test_execute_reports_every_phase_in_order(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_demo()
    run = DemoRun(spec, DemoOptions(duration_seconds=1, workdir=tmp_path))
    nodes = [n.name for n in spec.topology.nodes]
    run.fleet = _Fleet(nodes)  # type: ignore[assignment]
    monkeypatch.setattr(run.cluster, "up", lambda: None)
    monkeypatch.setattr(run.cluster, "down", lambda: None)
    monkeypatch.setattr(run.cluster, "truth", lambda gt=None: {})
    monkeypatch.setattr(run.cluster.lab, "ground_truth", lambda: {})
    monkeypatch.setattr(run.cluster, "start_traffic",
                        lambda seconds, count=None, clients=None: [_Handle(seconds or 0.2)])
    said: list[str] = []
    result = run.execute(phase=said.append)
    assert said[0].startswith("lab up in ") and "starting 6 agents" in said[0]
    assert [s.split(" (")[0] for s in said[1:7]] == [
        f"agents compiled and attached {i}/6" for i in range(1, 7)]
    assert said[7].startswith("warming up: 30 requests per client and Service")
    assert said[8] == "traffic: 1 s per client, IPv4; paths: clusterIP"
    assert said[9].startswith("traffic done")
    assert result.traffic_seconds == 1

