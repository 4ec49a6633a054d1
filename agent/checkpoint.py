"""The agent's checkpoint: its cumulative totals on the node's disk, so neither a crash
(``kill -9``, an OOM kill) nor a restart loses a byte or resets an exported counter.

One JSON file (``--checkpoint-path``, in the DaemonSet a hostPath under
``/var/lib/zonemeter``), rewritten after every drain and before the drained kernel
table is emptied (docs/datapath.md, "Exactly once across a crash"; docs/reliability.md)::

    {"format": "zonemeter-checkpoint", "version": 1, "layout": <ZM_LAYOUT_VERSION>,
     "node": "<node name>", "seq": <writes so far>, "written_at": <Unix s>,
     "handover": {"pins_id": <int>, "folded": [<gen a>, <gen b>]} | null,
     "discarded": {<reason>: <count>}, "attribution": <Attributor.state()>}

Written atomically: a temporary file in the same directory, ``fsync``, ``rename`` over
the old one, ``fsync`` of the directory; a reader sees the old file or the new one,
never a mix. A file that cannot be used (unreadable, not JSON, another format, another
version or layout, another node) is logged in one line and discarded: the agent starts
from zero and counts it in ``zonemeter_checkpoint_discarded_total{reason}``; it never
refuses to start over it.

``ZONEMETER_TEST_CRASH_AT`` (tests only): a comma-separated list of ``point`` or
``point:n``; the process sends itself SIGKILL the n-th time (default 1st) it reaches a
named point (:data:`CRASH_POINTS`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import RuntimeFailure

log = logging.getLogger(__name__)

__all__ = ["CRASH_POINTS", "DEFAULT_CHECKPOINT_PATH", "DISCARD_REASONS", "FORMAT", "MAX_BYTES",
           "VERSION", "Checkpoint", "Checkpointer", "crash_point"]

FORMAT = "zonemeter-checkpoint"
#: version of the file format above (bump when a field changes meaning)
VERSION = 1
#: default ``--checkpoint-path`` on a node (the DaemonSet's hostPath)
DEFAULT_CHECKPOINT_PATH = "/var/lib/zonemeter/checkpoint"
#: a larger file is not read (the state is bounded by the live series and the held
#: deltas, --hold-unresolved-seconds, at most 100,000: a few tens of MiB at worst)
MAX_BYTES = 256 * 1024 * 1024
#: ``reason`` label values of ``zonemeter_checkpoint_discarded_total``: ``unreadable``
#: (read error, too large), ``corrupt`` (not JSON, not a checkpoint, malformed fields),
#: ``version`` (another file format version or kernel layout), ``node`` (another node's)
DISCARD_REASONS = ("unreadable", "corrupt", "version", "node")
#: where ``ZONEMETER_TEST_CRASH_AT`` can stop the agent, in the order a drain reaches them
CRASH_POINTS = ("mid_switch", "after_switch", "after_read", "mid_checkpoint", "after_checkpoint",
                "mid_clear", "after_clear")

_crash_seen: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Test hook: SIGKILL this process when ``ZONEMETER_TEST_CRASH_AT`` names ``name``
    (``name`` or ``name:n``: the n-th time it is reached). No-op when the variable is unset."""
    spec = os.environ.get("ZONEMETER_TEST_CRASH_AT")
    if not spec:
        return
    n = _crash_seen[name] = _crash_seen.get(name, 0) + 1
    for item in spec.split(","):
        point, _, nth = item.strip().partition(":")
        if point == name and n == (int(nth) if nth else 1):
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint as read back.

    Attributes:
        node: the node it belongs to.
        seq: how many checkpoints the agents of this file wrote before it (+1).
        written_at: Unix seconds.
        handover: ``{"pins_id", "folded"}`` of :class:`agent.datapath.HandOver`, or None
            (written without a datapath marker).
        discarded: ``{reason: count}`` carried over, so that counter never goes back.
        attribution: :meth:`agent.attribution.Attributor.state` as written.
        coverage: the hook coverage totals ``[counted, carried, unseen]`` (L3 bytes) of
            :class:`agent.records.CoverageState`, so those counters never go back either;
            ``()`` in a file written without them.
    """

    node: str
    seq: int
    written_at: float
    handover: Mapping[str, Any] | None
    discarded: Mapping[str, int] = field(default_factory=dict)
    attribution: Mapping[str, Any] = field(default_factory=dict)
    coverage: tuple[int, ...] = ()


class Checkpointer:
    """Reads and writes one node's checkpoint file.

    Args:
        path: the file (its directory is created if missing).
        node: this node's name (a file of another node is discarded).
        layout: ``ZM_LAYOUT_VERSION`` of this agent (a file of another layout is discarded).

    Attributes:
        discarded: ``{reason: count}`` of every :data:`DISCARD_REASONS` (cumulative across
            agents of this file).
        seq: checkpoints written (cumulative across agents of this file).
    """

    def __init__(self, path: str, node: str, layout: int) -> None:
        self.path = path
        self.node = node
        self.layout = layout
        self.discarded: dict[str, int] = {r: 0 for r in DISCARD_REASONS}
        self.seq = 0

    def load(self) -> Checkpoint | None:
        """Read the checkpoint file; None when there is none or it was discarded (one
        warning naming the file and why, and ``discarded[reason]`` + 1). Never raises."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.discard("unreadable", err.strerror or str(err))
            return None
        if len(raw) > MAX_BYTES:
            self.discard("unreadable", f"larger than {MAX_BYTES} bytes")
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            self.discard("corrupt", f"not JSON ({err})")
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            self.discard("corrupt", f"format is not {FORMAT!r}")
            return None
        if doc.get("version") != VERSION or doc.get("layout") != self.layout:
            self.discard("version", f"version {doc.get('version')!r} layout {doc.get('layout')!r}, "
                         f"this agent writes version {VERSION} layout {self.layout}")
            return None
        if doc.get("node") != self.node:
            self.discard("node", f"written by node {doc.get('node')!r}, this is {self.node!r}")
            return None
        try:
            handover = doc["handover"]
            if handover is not None:
                folded = handover["folded"]
                if not (isinstance(handover["pins_id"], int) and isinstance(folded, list)
                        and len(folded) == 2 and all(isinstance(g, int) for g in folded)):
                    raise ValueError("handover is not {pins_id: int, folded: [int, int]}")
            discarded = {str(k): int(v) for k, v in dict(doc.get("discarded", {})).items()}
            if not isinstance(doc["attribution"], dict):
                raise ValueError("attribution is not an object")
            coverage = tuple(doc.get("coverage") or ())
            if coverage and not (len(coverage) == 3 and all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in coverage)):
                raise ValueError("coverage is not [counted, carried, unseen] byte counts")
            cp = Checkpoint(self.node, int(doc["seq"]), float(doc["written_at"]), handover,
                            discarded, doc["attribution"], coverage)
        except (KeyError, TypeError, ValueError) as err:
            self.discard("corrupt", f"field {err}")
            return None
        self.seq = cp.seq
        for r, n in cp.discarded.items():
            if r in self.discarded:
                self.discarded[r] = max(self.discarded[r], n)
        return cp

    def discard(self, reason: str, why: str) -> None:
        """Count and log (one warning line) a checkpoint that cannot be used."""
        self.discarded[reason] = self.discarded.get(reason, 0) + 1
        log.warning("checkpoint %s discarded (%s): %s; counters start from zero",
                    self.path, reason, why,
                    extra={"fields": {"checkpoint": self.path, "reason": reason}})

    def save(self, attribution: Mapping[str, Any], handover: Mapping[str, Any] | None,
             coverage: tuple[int, int, int] | None = None) -> None:
        """Write a new checkpoint atomically (tmp + fsync + rename + directory fsync).

        Args:
            attribution: ``Attributor.state()``.
            handover: ``{"pins_id": int, "folded": [int, int]}`` or None.
            coverage: hook coverage totals ``(counted, carried, unseen)``, L3 bytes, or None.

        Raises:
            RuntimeFailure: the file could not be written (disk full, read-only); the old
                checkpoint is intact.
        """
        doc = {"format": FORMAT, "version": VERSION, "layout": self.layout, "node": self.node,
               "seq": self.seq + 1, "written_at": time.time(), "handover": handover,
               "discarded": self.discarded, "attribution": attribution,
               "coverage": list(coverage) if coverage is not None else None}
        data = json.dumps(doc, separators=(",", ":")).encode()
        directory = os.path.dirname(os.path.abspath(self.path))
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            crash_point("mid_checkpoint")
            os.rename(tmp, self.path)
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as err:
            raise RuntimeFailure(f"cannot write checkpoint {self.path}: {err}") from err
        self.seq += 1
