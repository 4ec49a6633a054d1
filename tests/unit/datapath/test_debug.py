"""agent.datapath.debug without a kernel: the effective C and the flag errors."""

from __future__ import annotations

import pytest

from agent.datapath import debug


def test_print_c_shows_flags_and_every_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert debug.main(["--print-c", "--capacity", "128"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("/* cflags: ") and "-DZM_FLOW_CAPACITY=128" in out
    for name in ("zonemeter.h", "maps.h", "parse.h", "account.h", "classify.h", "tc.c"):
        assert f"bpf/{name}" in out
    assert "TC_ACT_UNSPEC" in out


@pytest.mark.parametrize("argv", [["--print-c", "--endpoint", "10.0.0.1:80"],
                                  ["--print-c", "--endpoint", "nohost,80,6"],
                                  ["--print-c", "--capacity", "1"],
                                  ["--cleanup", "--pin-path", "not/absolute"]])
def test_bad_flag_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert debug.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err
