"""Commands and processes of the lab: run a command (in a namespace), end processes.

The lab shells out to ``ip``, ``nft``, ``iptables-restore``, ``ethtool`` (it is a test
bed, not the agent: the agent uses pyroute2 only). Processes are ended only by pid, and
never the calling process or its ancestors.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from agent.errors import RuntimeFailure

#: repository root: traffic subprocesses import ``tools.lab.traffic`` from here
ROOT = Path(__file__).resolve().parents[2]


def run(argv: Sequence[str], input: str | None = None, check: bool = True
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeFailure(f"{' '.join(argv[:6])} failed ({proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def nsexec(ns: str, argv: Sequence[str], input: str | None = None, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    return run(["ip", "netns", "exec", ns, *argv], input=input, check=check)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                      else "")
    return env


def ancestors() -> set[int]:
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    return pids


def terminate(pids: set[int], grace: float = 2.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace
    alive = set(pids)
    while alive and time.monotonic() < end:
        for pid in list(alive):
            try:
                os.kill(pid, 0)
                # reap our own children so they do not linger as zombies
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                if is_zombie(pid):
                    alive.discard(pid)
            except ProcessLookupError:
                alive.discard(pid)
        time.sleep(0.02)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def is_lab_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"tools.lab.traffic\0server" in fh.read()
    except OSError:
        return False


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
