"""Client for the hint oracle (tools/oracle): upstream Kubernetes code behind a JSON-lines pipe.

The oracle is a Go program built per Kubernetes minor by ``tools/oracle/build.sh MINOR`` into
``$ZONEMETER_ORACLE_CACHE`` (default ``/var/cache/zonemeter/oracle``)``/<minor>/oracle``. It runs
the EndpointSlice controller's reconciler (``k8s.io/endpointslice``) and kube-proxy's endpoint
selection (``k8s.io/kubernetes/pkg/proxy`` ``CategorizeEndpoints``) of that release; the request
and answer format is in ``tools/oracle/README.md``.

Example::

    from tools.oracle.client import Oracle
    with Oracle("1.37") as o:
        ans = o.ask({"nodes": [...], "service": {...}, "endpoint_slices": [...],
                     "proxy_nodes": "all"})
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

#: the minors build.sh knows (newest last)
MINORS = ("1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")

_BUILD = Path(__file__).resolve().parent / "build.sh"


class OracleError(Exception):
    """The oracle is missing, died, timed out, or answered a request with an error line."""


def cache_root() -> Path:
    """Directory holding one ``<minor>/`` build per Kubernetes minor."""
    return Path(os.environ.get("ZONEMETER_ORACLE_CACHE", "/var/cache/zonemeter/oracle"))


def minor_of(version: str) -> str:
    """``"1.37"`` for ``"1.37"``, ``"1.37.2"``, ``"v1.37.2"`` or ``"v1.37.2-eks-1"``.

    Raises:
        OracleError: the string does not start with MAJOR.MINOR.
    """
    m = re.match(r"v?(\d+)\.(\d+)", version.strip())
    if m is None:
        raise OracleError(f"version {version!r}: want MAJOR.MINOR, e.g. 1.37")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def binary(minor: str) -> Path:
    """Path of the oracle binary for ``minor`` (e.g. ``"1.37"``); it may not exist yet."""
    return cache_root() / minor_of(minor) / "oracle"


def built_minors() -> list[str]:
    """Minors whose oracle binary is present, oldest first."""
    return [m for m in MINORS if binary(m).is_file()]


class Oracle:
    """One long-lived oracle process for one Kubernetes minor.

    Args:
        minor: Kubernetes version, ``"1.31"`` .. ``"1.37"`` (a patch or ``v`` prefix is ignored).
        timeout: seconds to wait for each answer line.

    Raises:
        OracleError: the binary is missing (the message names the build command) or fails to start.
    """

    def __init__(self, minor: str, timeout: float = 30.0) -> None:
        minor = minor_of(minor)
        self.minor = minor
        self.timeout = timeout
        path = binary(minor)
        if not path.is_file():
            raise OracleError(f"oracle for Kubernetes {minor} not built: {path} missing; "
                              f"run: bash {_BUILD.relative_to(_BUILD.parents[2])} {minor}")
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL)
        except OSError as e:
            raise OracleError(f"oracle {path}: cannot start: {e}") from None
        self._sel = selectors.DefaultSelector()
        assert self._proc.stdout is not None
        self._sel.register(self._proc.stdout, selectors.EVENT_READ)
        self._buf = b""
        self._seq = 0

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close stdin and wait for the process (killed after 5 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._sel.close()
        try:
            assert proc.stdin is not None
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def _readline(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                self.close()
                raise OracleError(f"oracle {self.minor}: no answer within {self.timeout} s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                code = self._proc.poll()
                self.close()
                raise OracleError(f"oracle {self.minor}: process exited (code {code})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def ask_raw(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request; return the answer object, error lines included (``{"error": ...}``).

        Raises:
            OracleError: the process is closed, died or timed out.
        """
        if self._proc is None:
            raise OracleError(f"oracle {self.minor}: closed")
        self._seq += 1
        req = dict(request)
        req.setdefault("id", self._seq)
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(req, separators=(",", ":")).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError as e:
            self.close()
            raise OracleError(f"oracle {self.minor}: write failed: {e}") from None
        ans: dict[str, Any] = json.loads(self._readline())
        if ans.get("id") != req["id"]:
            raise OracleError(f"oracle {self.minor}: answer id {ans.get('id')!r} for request {req['id']!r}")
        return ans

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Like :meth:`ask_raw`, but an ``{"error": ...}`` answer raises.

        Raises:
            OracleError: the oracle refused the request (message = its error line), or the
                process is closed, died or timed out.
        """
        ans = self.ask_raw(request)
        if "error" in ans:
            raise OracleError(f"oracle {self.minor}: {ans['error']}")
        return ans
