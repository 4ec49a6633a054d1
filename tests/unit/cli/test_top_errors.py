"""Attack ``zonemeter top`` with /flows documents of any shape and odd flags.

Whatever answers at ``--url`` (an agent of another version, a proxy, a different
service on that port), ``top`` prints frames, or exits 1 with one line naming what is
wrong; never a traceback.
"""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agent.cli.top as top
from agent import cli
from agent.errors import ZonemeterError
from tests.fixtures.mutation import mutate_once

GOOD: dict[str, Any] = {
    "generated_at": 100.0, "interval_seconds": 2.0,
    "services": [{"namespace": "shop", "service": "web", "bytes_total": 1500,
                  "by_crossing": {"cross_zone": 1000, "same_zone": 500},
                  "by_direction": {"request": 1000, "response": 500}, "hint_ignored_bytes": 0,
                  "mode": "PreferClose", "reason": "no-hints-for-zone",
                  "locality_in_effect": {"zone-a": False, "zone-b": True}}],
    "pairs": [{"client": "shop/client-a", "server": "shop/web-b", "client_zone": "zone-a",
               "server_zone": "zone-b", "crossing": "cross_zone", "namespace": "shop",
               "service": "web", "port": "", "bytes": 4000}],
    "pairs_interval": [98.0, 100.0],
    "unattributed_bytes": {"flow_table_full": 7}, "unknown_crossing_bytes": {}, "skipped_bytes": {},
    "self": {"flow_table_entries": 0, "flow_table_capacity": 0, "attached_interfaces": 0,
             "collector_duration_seconds": 0.0, "metadata_synced": {"pods": True}},
}

ODD = st.sampled_from([None, "", "x", 0, -1, 1.5, True, [], {}, [None], {"a": 1}, [1, 2, 3],
                       "1e3", 1e308, -1e308, 10**30])




@st.composite
def documents(draw: Any) -> Any:
    doc = copy.deepcopy(GOOD)
    for _ in range(draw(st.integers(1, 3))):
        if not mutate_once(draw, doc, ODD):
            break
    return doc


class _Resp(io.BytesIO):
    def __enter__(self) -> _Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(monkeypatch: pytest.MonkeyPatch, bodies: list[bytes]) -> None:
    it = iter(bodies)

    def urlopen(url: str, timeout: float = 0) -> _Resp:
        return _Resp(next(it))

    monkeypatch.setattr(top.urllib.request, "urlopen", urlopen)


def _frames(argv: list[str], frames: int) -> tuple[int, str]:
    """Run top like cli.main does (ZonemeterError -> exit code), with ``frames`` reads."""
    args = cli.build_parser().parse_args(["top", *argv])
    out = io.StringIO()
    try:
        return top.run(args, out=out, sleep=lambda s: None, max_frames=frames), out.getvalue()
    except ZonemeterError as err:
        assert len(str(err).splitlines()) == 1
        return 1, str(err)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents(), documents())
def test_any_flows_document_gives_frames_or_one_line(monkeypatch: pytest.MonkeyPatch,
                                                     first: Any, second: Any) -> None:
    body1, body2 = json.dumps(first).encode(), json.dumps(second).encode()
    _serve(monkeypatch, [body1, body2])
    code, text = _frames([], 2)
    assert code in (0, 1), text
    _serve(monkeypatch, [body1])
    assert _frames(["-o", "json"], 1)[0] in (0, 1)
    _serve(monkeypatch, [body1])
    assert _frames(["--once", "--pairs", "0"], 1)[0] in (0, 1)


@pytest.mark.parametrize("body", [b"\xff\xfe", b"[]", b"null", b'{"services": {}}', b"1e999",
                                  b'{"services": [1]}', b'{"services": [], "pairs": 5}'])
def test_odd_bodies_are_one_line(monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    _serve(monkeypatch, [body])
    code, text = _frames(["--once"], 1)
    assert code == 1 and "/flows" in text, text


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "0", "-1"])
def test_interval_must_be_a_sane_number_of_seconds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--interval inf`` made ``time.sleep`` raise OverflowError after the first frame."""
    assert cli.main(["top", f"--interval={value}", "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--interval" in err, err


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "http://a b"])
def test_malformed_url_is_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["top", "--once", "--url", url])
    err = capsys.readouterr().err
    assert rc in (1, 2) and len(err.strip().splitlines()) == 1 and "not JSON" not in err, err
