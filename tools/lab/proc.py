"""Commands and processes of the lab: run a command (in a namespace), end processes.

The lab shells out to ``ip``, ``nft``, ``iptables-restore``, ``ethtool`` (it is a test
bed, not the agent: the agent uses pyroute2 only). Processes are ended only by pid, and
never the calling process or its ancestors.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
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


# ---------------------------------------------------------------------- pod cgroups
#
# Like kubelet (kubepods/<qos>/pod<uid>/<container>: pkg/kubelet/cm), the lab gives each
# pod a cgroup v2 cgroup, ``<cgroup2 root>/zmlab-<prefix>/<node>/<pod>.<n>.pod<uid>``
# (a fresh UID each, so the agent takes it for a pod cgroup as it does kubelet's), whose child
# ``app`` its processes run in: the cgroup hook keys a socket by the parent of its cgroup
# (bpf/cgroup.c zm_cg_hook_id), so the lab's pods have ids of their own, and a pod that
# reuses a removed pod's address has a newer one. A lab agent on the cgroup hook counts the
# sockets below its node's cgroup (``--cgroup-scope-cgroup``), so pods added later are in
# its scope. ``<n>`` grows per name (cgroup v2 does not rename, and a name can come back
# before its old cgroup could be removed).

def _cgroup_top(prefix: str) -> Path | None:
    """``<cgroup2 root>/zmlab-<prefix>``, or None when the machine has no cgroup2 mount."""
    from agent.datapath import cgroup

    try:
        return Path(cgroup.cgroup2_root()) / f"zmlab-{prefix}"
    except (OSError, RuntimeFailure):
        return None


def node_cgroup(prefix: str, node: str, create: bool = False) -> Path | None:
    """The cgroup lab node ``node``'s pods are made under (made with ``create``), or None
    without a cgroup2 mount.

    Raises:
        RuntimeFailure: ``create`` and the cgroup could not be made.
    """
    top = _cgroup_top(prefix)
    if top is None:
        return None
    if create:
        try:
            (top / node).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RuntimeFailure(f"cannot create the cgroup of node {node}: {err}") from err
    return top / node


_POD_DIR = re.compile(r"^(?P<pod>.+)\.(?P<n>\d+)\.pod[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _pod_dirs(parent: Path, pod: str | None) -> list[tuple[int, Path]]:
    """``(n, directory)`` of the cgroups of pods named ``pod`` (any pod for None) below
    ``parent``, by ``n``."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _POD_DIR.match(name)
        if m is not None and (pod is None or m["pod"] == pod):
            out.append((int(m["n"]), parent / name))
    return sorted(out)


def _make(parent: Path, pod: str, n: int) -> Path:
    """Make ``<parent>/<pod>.<n>.pod<a new UID>``: the UID makes it a pod cgroup's name as
    kubelet's cgroupfs driver writes it (``pod<uid>``), which the agent looks for
    (agent/datapath/cgroup.py ``POD_CGROUP_NAME``)."""
    d = parent / f"{pod}.{n}.pod{uuid.uuid4()}"
    try:
        d.mkdir(parents=True)
    except OSError as err:
        raise RuntimeFailure(f"cannot create the cgroup of pod {pod}: {err}") from err
    return d


def new_pod_cgroup(prefix: str, node: str, pod: str) -> Path | None:
    """Create the cgroup of a new pod ``pod`` of lab ``prefix`` on ``node`` and its
    ``app`` child; returns the child (where the pod's processes go), None without a
    cgroup2 mount.

    Raises:
        RuntimeFailure: the cgroup could not be created.
    """
    parent = node_cgroup(prefix, node)
    if parent is None:
        return None
    dirs = _pod_dirs(parent, pod)
    if dirs and not (dirs[-1][1] / "app").exists():
        d = dirs[-1][1]  # made early (:func:`early_pod_cgroup`): its container comes now
    else:
        d = _make(parent, pod, (dirs[-1][0] if dirs else 0) + 1)
    try:
        (d / "app").mkdir()
    except OSError as err:
        raise RuntimeFailure(f"cannot create the cgroup of pod {pod}: {err}") from err
    return d / "app"


def early_pod_cgroup(prefix: str, node: str, pod: str) -> Path:
    """Make the cgroup of a pod that does not exist yet, without its ``app`` child: what
    kubelet does at the start of a pod's sync, before the pod's volumes are mounted and
    its sandbox gets an address (``SyncPod`` in pkg/kubelet/kubelet.go). The pod added
    later under this name takes it, and its container's cgroup is made then.

    Raises:
        RuntimeFailure: no cgroup2 mount, or the cgroup could not be made.
    """
    parent = node_cgroup(prefix, node)
    if parent is None:
        raise RuntimeFailure("no cgroup2 mount for the lab's pod cgroups")
    dirs = _pod_dirs(parent, pod)
    return _make(parent, pod, (dirs[-1][0] if dirs else 0) + 1)


def pod_cgroup(prefix: str, node: str, pod: str) -> Path | None:
    """The ``app`` cgroup of the newest pod named ``pod`` on ``node`` of lab ``prefix``,
    or None (none made)."""
    parent = node_cgroup(prefix, node)
    dirs = _pod_dirs(parent, pod) if parent is not None else []
    return dirs[-1][1] / "app" if dirs else None


def in_cgroup(app: Path | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run in cgroup ``app`` (a shell writes its pid to ``cgroup.procs`` and execs
    it, so the command's sockets belong to the cgroup; no ``preexec_fn``, which is unsafe
    in a threaded parent), or ``argv`` itself for None."""
    if app is None:
        return list(argv)
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(app / "cgroup.procs"), *argv]


def remove_pod_cgroups(prefix: str, pod: str | None = None) -> None:
    """Remove the cgroups of ``pod`` (every generation, any node), or of the whole lab for
    None, children first. A cgroup whose processes are still exiting is retried for 2 s,
    then left (it is empty soon; ``lab down`` removes it). Never raises."""
    top = _cgroup_top(prefix)
    if top is None or not top.is_dir():
        return
    end = time.monotonic() + 2.0

    def rm(d: Path) -> None:
        while d.is_dir():
            try:
                d.rmdir()
            except OSError:
                if time.monotonic() > end:
                    return
                time.sleep(0.02)

    for node in [top / n for n in os.listdir(top) if (top / n).is_dir()]:
        for d in [d for _, d in _pod_dirs(node, pod)]:
            rm(d / "app")
            rm(d)
        if pod is None:
            rm(node)
    if pod is None:
        rm(top)
