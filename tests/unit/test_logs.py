"""agent.logs: LogOnce logs a key once, honours its limit, and JSON lines carry the error."""

from __future__ import annotations

import io
import json
import logging

import pytest

from agent.errors import InputError
from agent.logs import LogOnce, setup_logging


def test_log_once_logs_each_key_once(caplog: pytest.LogCaptureFixture) -> None:
    once = LogOnce(logging.getLogger("agent.test"))
    with caplog.at_level(logging.INFO, logger="agent.test"):
        assert once("a", logging.WARNING, "first %s", "a")
        assert not once("a", logging.WARNING, "again %s", "a")
        assert once("b", logging.ERROR, "first %s", "b", exc=ValueError("bad"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "first a"), (logging.ERROR, "first b")]
    assert caplog.records[1].exc_info is not None and once.seen("b") and not once.seen("c")


def test_log_once_drops_new_keys_beyond_its_limit(caplog: pytest.LogCaptureFixture) -> None:
    once = LogOnce(logging.getLogger("agent.test"), limit=2)
    with caplog.at_level(logging.INFO, logger="agent.test"):
        logged = [once(k, logging.WARNING, "key %s", k) for k in ("a", "b", "c", "a")]
    assert logged == [True, True, False, False]
    assert [r.getMessage() for r in caplog.records] == ["key a", "key b"]


def test_setup_logging_writes_json_lines_and_refuses_unknown_levels() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging("warning", stream)
        logging.getLogger("agent.test").warning("odd %s", "thing", exc_info=KeyError("k"),
                                                extra={"fields": {"n": 1}})
        logging.getLogger("agent.test").info("not shown")
        [line] = stream.getvalue().splitlines()
        doc = json.loads(line)
        assert (doc["level"], doc["logger"], doc["msg"], doc["n"], doc["error"]) == (
            "warning", "agent.test", "odd thing", 1, "KeyError: 'k'")
        with pytest.raises(InputError, match="--log-level"):
            setup_logging("loud")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
