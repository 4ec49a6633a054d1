"""zonemeter what-if: output contract and every bad-input path (exit 2, one line)."""

from __future__ import annotations

import json

import pytest

from tests.unit.cli.test_explain import assert_one_line_error, run


def test_what_if_three_equal_zones_table(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["what-if", "--zone", "a=4", "--zone", "b=4", "--zone", "c=4", "--replicas", "3-12",
                        "-o", "json"], capsys)
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [r["replicas"] for r in rows if r["hints_enabled"]] == [3, 6, 7, 9, 10, 12]
    assert [r["replicas"] for r in rows if not r["hints_enabled"]] == [4, 5, 8, 11]
    by = {r["replicas"]: r for r in rows}
    assert by[7]["hints_per_zone"] == {"a": 3, "b": 2, "c": 2}
    assert by[8] == {"replicas": 8, "hints_enabled": False,
                     "reason": "min-allocation-exceeds-overload-threshold",
                     "minimums": {"a": 3, "b": 3, "c": 3}, "hints_per_zone": None}
    assert set(by[3]) == {"replicas", "hints_enabled", "reason", "minimums", "hints_per_zone"}


def test_what_if_kep_float64_and_spread(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["what-if", "--zone", "a=20,b=16,c=14", "--replicas", "2-3", "--spread", "a=0,b=1,c=1",
                        "-o", "json"], capsys)
    assert code == 0
    rows = json.loads(out)["rows"]
    assert rows[0]["reason"] == "insufficient-number-of-endpoints" and rows[0]["minimums"] is None
    assert rows[1]["minimums"] == {"a": 2, "b": 1, "c": 1} and rows[1]["hints_enabled"] is False
    code, out, _ = run(["what-if", "--zone", "a=1,b=1", "--replicas", "2", "--spread", "a=2,b=0"], capsys)
    assert code == 0 and out.splitlines()[1].split() == ["2", "yes", "1", "1", "1/1"]


@pytest.mark.parametrize(("flags", "parts"), [
    (["--zone", "a=4", "--replicas", "3"], ["--zone", "two zones"]),
    (["--zone", "a=four", "--zone", "b=4", "--replicas", "3"], ["--zone", "zone a", "bad quantity"]),
    (["--zone", "a", "--zone", "b=4", "--replicas", "3"], ["--zone", "ZONE=VALUE"]),
    (["--zone", "a=4,b=4", "--replicas", "5-3"], ["--replicas"]),
    (["--zone", "a=4,b=4", "--replicas", "x"], ["--replicas"]),
    (["--zone", "a=4,b=4", "--replicas", "3", "--spread", "z=1"], ["--spread", "z"]),
    (["--zone", "a=4,b=4", "--replicas", "3", "--spread", "a=-1"], ["--spread"]),
])
def test_what_if_bad_input(flags: list[str], parts: list[str], capsys) -> None:  # type: ignore[no-untyped-def]
    assert_one_line_error(*run(["what-if", *flags], capsys), *parts)
