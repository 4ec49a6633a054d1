"""Run code inside a named network namespace, and read that namespace's port range.

``setns(2)`` moves only the calling thread, so each call runs in a short-lived thread
and the caller's own namespace never changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from agent.datapath.config import DEFAULT_EPHEMERAL

T = TypeVar("T")


def run_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """Return fn() run in a thread that entered network namespace netns (a name under
    /run/netns), or fn() itself when netns is None. setns moves only the calling thread,
    so the caller's namespace never changes.

    Raises:
        BaseException: whatever fn (or entering the namespace) raised, re-raised here.
    """
    if netns is None:
        return fn()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            from pyroute2.netns import setns

            setns(netns, flags=0)
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            box["error"] = err

    th = threading.Thread(target=target, name=f"zm-netns-{netns}")
    th.start()
    th.join()
    if "error" in box:
        raise cast(BaseException, box["error"])
    return cast(T, box.get("value"))


def read_ephemeral_range(netns: str | None) -> tuple[int, int]:
    """Return ``net.ipv4.ip_local_port_range`` of netns as (low, high), host order.

    Falls back to Linux's default (32768, 60999) when the file cannot be read.
    """
    def read() -> tuple[int, int]:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        lo, hi = (int(x) for x in text.split())
        return lo, hi

    try:
        return run_in_netns(netns, read)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
