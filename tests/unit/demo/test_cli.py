"""``zonemeter demo`` command line: help and error paths (nothing is built)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main
from agent.errors import InputError
from tools.demo.agents import agent_argv
from tools.demo.topology import load_demo
from tools.lab import Lab, proc


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["demo", "--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "--topology FILE" in out and "--keep" in out and "--prometheus" in out
    assert "zonemeter demo --teardown" in out


@pytest.mark.parametrize("argv", [["demo"], ["lab"], ["lab", "up"], ["report"], ["top"],
                                  ["explain"], ["what-if"], ["agent"]])
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main([*argv, "--help"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "::" not in out  # reST markup means nothing in a terminal


def test_bad_topology_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("zones: [{name: za}]\nnodes: [{name: n1, zone: nowhere}]\n")
    assert main(["demo", "--topology", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and "zone" in err


def test_bad_zone_cidrs_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --zone-cidrs file is refused before anything is built, naming the file, line
    and field (the agents' own parser)."""
    bad = tmp_path / "zones.csv"
    bad.write_text("10.0.0.0/8,zone-a\n10.1.0.0/33,zone-b\n")
    assert main(["demo", "--zone-cidrs", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and "line 2" in err and "cidr" in err
    assert main(["demo", "--zone-cidrs", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("argv, source", [(["--duration", "0"], "--duration"),
                                          (["--interval", "0.1"], "--interval")])
def test_bad_numbers_exit_2(argv: list[str], source: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"zonemeter: error: {source}:")


@pytest.mark.parametrize("content, missing", [
    (None, "no such directory"),
    ("", "has no demo.json"),
    ("{not json", "demo.json is not a kept demo's state"),
    ("[]", "demo.json is not a kept demo's state"),
])
def test_teardown_of_a_wrong_dir_is_one_line_exit_2(
        tmp_path: Path, content: str | None, missing: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "nonexist"
    if content is not None:
        workdir.mkdir()
        if content:
            (workdir / "demo.json").write_text(content)
    assert main(["demo", "--teardown", str(workdir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("zonemeter: error: --teardown:")
    assert str(workdir) in err and missing in err
    assert "Errno" not in err


def test_agent_command_line_follows_contract() -> None:
    spec = load_demo()
    lab = Lab(spec.topology, prefix="zmcli")
    argv = agent_argv(lab, "b2", Path("/w/snapshot.json"), "127.0.0.1:9999", 2.0, python="py")
    assert argv == ["py", "-m", "agent", "agent", "--node-name", "b2", "--snapshot",
                    "/w/snapshot.json", "--netns", "zmcli-node-b2", "--metrics-address",
                    "127.0.0.1:9999", "--interval", "2", "--exclude-interfaces", "zmcliu3",
                    "--uplink-interfaces", "zmcliu3"]  # the first hop of node ports is counted there
    vx = Lab(load_demo(mode="vxlan").topology, prefix="zmcli")
    assert agent_argv(vx, "a1", Path("s"), "a:1", 1.5, python="py")[-5:] == [
        "1.5", "--exclude-interfaces", "zmcliu0,zmclix", "--uplink-interfaces", "zmcliu0"]
    extra = agent_argv(lab, "b2", Path("s"), "a:1", 2.0, python="py",
                       extra=("--series-retention", "60"))
    assert extra[-6:] == ["--exclude-interfaces", "zmcliu3", "--uplink-interfaces", "zmcliu3",
                          "--series-retention", "60"]
    # on real Kubernetes the agent reads the apiserver instead of a snapshot
    real = agent_argv(lab, "b2", None, "a:1", 2.0, python="py", kubeconfig=Path("/k/agent.kubeconfig"))
    assert real[4:8] == ["--node-name", "b2", "--kubeconfig", "/k/agent.kubeconfig"]
    assert "--snapshot" not in real
    for snap, kc in ((None, None), (Path("s"), Path("k"))):
        with pytest.raises(InputError, match="exactly one"):
            agent_argv(lab, "b2", snap, "a:1", 2.0, kubeconfig=kc)
    # the cgroup hook: the node's lab namespaces and its pods' cgroups only (labs share
    # the machine's cgroup tree), compared with the node's uplink
    cg = agent_argv(lab, "b2", Path("s"), "a:1", 2.0, python="py", hook="cgroup")
    pods = [f"zmcli-pod-{p.name}" for p in spec.topology.pods_on("b2")]
    assert pods and cg[-10:] == ["--exclude-interfaces", "zmcliu3", "--uplink-interfaces", "zmcliu3", "--hook",
                                 "cgroup", "--cgroup-scope-netns", ",".join(["zmcli-node-b2", *pods]),
                                 "--cgroup-scope-cgroup", str(proc.node_cgroup("zmcli", "b2"))]
    assert cg[-1].endswith("/zmlab-zmcli/b2")


def test_teardown_says_the_workdir_stays(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # a kept run whose agents and lab are already gone: teardown stops nothing, removes no
    # namespace, and ends by naming the directory it leaves (snapshot and logs for explain)
    import json
    import secrets

    workdir = tmp_path / "zonemeter-demo-x"
    workdir.mkdir()
    prefix = "zm" + secrets.token_hex(3)
    (workdir / "demo.json").write_text(json.dumps({
        "prefix": prefix, "state_dir": str(tmp_path / "state"), "workdir": str(workdir),
        "agents": [], "prometheus": None}))
    assert main(["demo", "--teardown", str(workdir)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"lab {prefix}: 0 namespaces removed",
                     f"kept {workdir} (snapshot, agent logs); remove it when done: "
                     f"rm -r {workdir}"]
    assert workdir.is_dir()


def test_ctrl_c_says_what_was_cleaned_and_where_the_workdir_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # nothing is built: a stand-in run is interrupted in its first phase, as by Ctrl-C
    import tools.demo.cli as demo_cli

    left: list[str] = []

    class Interrupted:
        def __init__(self, spec: object, options: object) -> None:
            self.workdir = tmp_path / "zonemeter-demo-x"
            self.cluster = type("C", (), {"prefix": "zmffff", "hints": type(
                "H", (), {"line": "hints and kube-proxy endpoints: zonemeter's model (--hints model)"})()})()

        def __enter__(self) -> Interrupted:
            return self

        def __exit__(self, *exc: object) -> None:
            left.append("torn down")  # the real DemoRun stops agents and removes the lab

        def execute(self, **kw: object) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(demo_cli, "DemoRun", Interrupted)
    monkeypatch.setattr(demo_cli.os, "geteuid", lambda: 0)
    assert main(["demo", "--duration", "1"]) == 130
    assert left == ["torn down"]
    err = capsys.readouterr().err.strip().splitlines()
    # the second line says where hints and kube-proxy endpoints come from
    assert err[1] == "zonemeter demo: hints and kube-proxy endpoints: zonemeter's model (--hints model)"
    assert err[-1] == ("zonemeter demo: interrupted: agents stopped, lab removed; snapshot "
                       f"and agent logs stay in {tmp_path / 'zonemeter-demo-x'}")
