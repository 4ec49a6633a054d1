"""`zonemeter lab` CLI (help, error paths) and the traffic generator over loopback."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from agent.cli import main
from tools.lab import traffic


def test_lab_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["lab", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for action in ("up", "down", "status", "traffic"):
        assert action in out


def test_lab_up_with_bad_topology_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    bad = tmp_path / "lab.yaml"
    bad.write_text("zones: [{name: z}]\nnodes: [{name: n1, zone: nowhere}]\n")
    assert main(["lab", "up", "--topology", str(bad), "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zonemeter: error: ") and str(bad) in err
    assert "Node n1: zone: unknown zone" in err and "\n" not in err


def test_lab_up_refuses_a_bypass_node_it_could_not_keep(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "lab.yaml"
    topo.write_text("zones: [{name: z}]\nnodes: [{name: n1, zone: z, dataPlane: bypass}]\n")
    assert main(["lab", "up", "--topology", str(topo), "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zonemeter: error: ") and str(topo) in err and "\n" not in err
    assert "Node n1: dataPlane: the bypass data plane lives only while" in err
    assert not list(tmp_path.glob("*.json"))  # nothing was built


def test_lab_status_without_lab_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert main(["lab", "status", "--prefix", "zmnone", "--state-dir", str(tmp_path)]) == 2
    assert "no running lab with this prefix" in capsys.readouterr().err


def test_lab_down_rejects_bad_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "down", "--prefix", "Bad!", "--state-dir", str(tmp_path)]) == 2
    assert "not a lab prefix" in capsys.readouterr().err


def test_lab_without_action_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab"]) == 2
    assert "choose an action" in capsys.readouterr().err


@pytest.fixture()
def loopback_server() -> tuple[int, int]:
    tcp = traffic._bind("tcp", 0)
    udp = traffic._bind("udp", 0)
    for target, sock in ((traffic._tcp_loop, tcp), (traffic._udp_loop, udp)):
        threading.Thread(target=target, args=(sock,), daemon=True).start()
    return tcp.getsockname()[1], udp.getsockname()[1]


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("reuse", [False, True])
def test_client_exchanges_exact_sizes(loopback_server: tuple[int, int], proto: str,
                                      reuse: bool) -> None:
    port = loopback_server[0] if proto == "tcp" else loopback_server[1]
    res = traffic.run_client(proto, "127.0.0.1", port, 300, 5000 if proto == "tcp" else 700,
                             count=4, rate=None, timeout=2.0, reuse=reuse)
    assert (res["ok"], res["failed"]) == (4, 0), res["errors"]
    assert res["request_payload_bytes"] == 1200
    assert res["response_payload_bytes"] == 4 * (5000 if proto == "tcp" else 700)


def test_client_with_several_destinations_sends_round_robin() -> None:
    """A client that balances itself: exchange i goes to the (i mod n)-th address."""
    srv = traffic._bind("tcp", 0)
    seen: list[str] = []

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            seen.append(conn.getsockname()[0].removeprefix("::ffff:"))
            traffic._serve_tcp(conn)

    threading.Thread(target=serve, daemon=True).start()
    res = traffic.run_client("tcp", "127.0.0.1,127.0.0.2,127.0.0.3", srv.getsockname()[1], 100, 200,
                             count=5, rate=None, timeout=2.0, reuse=False)
    assert (res["ok"], res["failed"]) == (5, 0), res["errors"]
    assert seen == ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1", "127.0.0.2"]
    with pytest.raises(ValueError, match="one destination"):
        traffic.run_client("tcp", "127.0.0.1,127.0.0.2", 1, 100, 200, count=1, rate=None,
                           timeout=1.0, reuse=True)


def test_client_reports_refused_connections() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    res = traffic.run_client("tcp", "127.0.0.1", port, 8, 8, count=2, rate=None, timeout=1.0,
                             reuse=False)
    assert (res["ok"], res["failed"]) == (0, 2)
    assert "ConnectionRefusedError" in res["errors"][0]


def test_client_rejects_tiny_requests(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        traffic.main(["client", "--dst", "127.0.0.1", "--port", "1", "--request-bytes", "4"])
    assert info.value.code == 2
    assert "at least 8" in capsys.readouterr().err


def test_lab_up_teardown_hint_runs_as_printed(tmp_path: Path) -> None:
    # `lab up` ends with this line; a new user runs .venv/bin/zonemeter, not on PATH, so a
    # bare "zonemeter lab down" would be "command not found"
    import secrets
    import shlex
    import subprocess
    import sys

    from tools.lab.cli import down_command
    from tools.lab.lab import DEFAULT_STATE_DIR

    prefix = "zm" + secrets.token_hex(3)  # no lab has it: `down` removes nothing
    assert down_command(prefix, DEFAULT_STATE_DIR).endswith(f" lab down --prefix {prefix}")
    cmd = down_command(prefix, tmp_path)
    argv = shlex.split(cmd)
    # under pytest argv[0] is not a zonemeter script: the running interpreter with -m agent
    assert argv[:3] == [sys.executable, "-m", "agent"]
    assert argv[3:] == ["lab", "down", "--prefix", prefix, "--state-dir", str(tmp_path)]
    done = subprocess.run(argv, cwd=Path(__file__).resolve().parents[3], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"lab {prefix}: removed 0 network namespaces"


def test_lab_down_without_prefix_takes_only_a_lab_that_lab_up_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import json

    from agent.errors import InputError
    from tools.lab import cli as lab_cli
    from tools.lab.state import list_prefixes

    orphans: list[str] = []
    # the state directory plus the namespaces a test pretends exist (no real netns read)
    monkeypatch.setattr(lab_cli, "list_prefixes", lambda d, include_orphans=True: sorted(
        set(list_prefixes(d, include_orphans=False)) | set(orphans)))
    args = argparse.Namespace(prefix=None, state_dir=tmp_path)
    (tmp_path / "zmaa.json").write_text(json.dumps({"prefix": "zmaa", "started_by": "lab up"}))
    assert lab_cli._pick_down_prefix(args) == "zmaa"
    (tmp_path / "zmbb.json").write_text(json.dumps({"prefix": "zmbb", "started_by": "python"}))
    with pytest.raises(InputError, match=r"name the lab to remove: zmaa, zmbb \(demo or tests\)"):
        lab_cli._pick_down_prefix(args)
    (tmp_path / "zmaa.json").unlink()
    with pytest.raises(InputError, match=r"zmbb \(demo or tests\)"):
        lab_cli._pick_down_prefix(args)  # the demo's lab alone is not taken by a guess
    (tmp_path / "zmbb.json").unlink()
    orphans.append("zmcc")  # namespaces without a state file (a killed test run)
    with pytest.raises(InputError, match=r"zmcc \(unknown\)"):
        lab_cli._pick_down_prefix(args)
    assert lab_cli._pick_down_prefix(argparse.Namespace(prefix="zmcc", state_dir=tmp_path)) == "zmcc"
