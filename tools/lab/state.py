"""Lab state and prefixes: the state file another process attaches with, and which
prefixes exist on this machine.

A state file ``<state_dir>/<prefix>.json`` records the resolved topology, the server
pids and the endpoint overrides, so that another process (``zonemeter lab
status|traffic|down``) can attach to a running lab with :meth:`tools.lab.Lab.attach`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tools.lab.netns import LabNamespaces, netns_mod

#: where lab state files live (one JSON per prefix)
DEFAULT_STATE_DIR = Path(os.environ.get("ZONEMETER_LAB_STATE", "/run/zonemeter/lab"))
#: a lab prefix: 2-9 lowercase letters or digits starting with a letter
PREFIX = re.compile(r"^[a-z][a-z0-9]{1,8}$")


def list_prefixes(state_dir: Path | str = DEFAULT_STATE_DIR, include_orphans: bool = True
                  ) -> list[str]:
    """Return the prefixes of labs that have a state file in ``state_dir`` and, with
    ``include_orphans``, of every ``<prefix>-fabric`` namespace (any lab on the machine)."""
    found: set[str] = set()
    state_dir = Path(state_dir)
    if state_dir.is_dir():
        found.update(p.stem for p in state_dir.glob("*.json"))
    if not include_orphans:
        return sorted(found)
    for name in netns_mod().listnetns():
        if name.endswith("-fabric") and PREFIX.match(name[: -len("-fabric")]):
            found.add(name[: -len("-fabric")])
    return sorted(found)


def started_by(prefix: str, state_dir: Path | str = DEFAULT_STATE_DIR) -> str:
    """Who built the lab ``prefix``: ``"lab up"`` (``zonemeter lab up``), ``"python"`` (the
    demo, tests, other callers of :class:`tools.lab.Lab`), or ``"unknown"`` (no readable state)."""
    try:
        value = json.loads((Path(state_dir) / f"{prefix}.json").read_text()).get("started_by")
    except (OSError, ValueError, AttributeError):
        return "unknown"
    return value if value in ("lab up", "python") else "unknown"


class LabState(LabNamespaces):
    """The state file of a lab (part of :class:`tools.lab.Lab`)."""

    server_max_seconds: float
    #: pod name -> server pid
    _servers: dict[str, int]
    #: (service key, node) -> endpoint strings (pod names or addresses); absent = default
    _overrides: dict[tuple[str, str], tuple[str, ...]]

    @property
    def state_file(self) -> Path:
        """Path of this lab's state file."""
        return self.state_dir / f"{self.prefix}.json"

    def _write_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "prefix": self.prefix,
            "server_max_seconds": self.server_max_seconds,
            "started_by": getattr(self, "started_by", "python"),
            "kubernetes": self.kubernetes,
            "proxy_mode": getattr(self, "proxy_mode", "iptables"),
            "kube_version": getattr(self, "kube_version", None),
            "relay_port": getattr(self, "relay_port", 0),
            "topology": self.topology.to_dict(),
            "servers": self._servers,
            "endpoint_overrides": [{"service": s, "node": n, "endpoints": list(e)}
                                   for (s, n), e in sorted(self._overrides.items())],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.state_file)

    def _save_if_running(self) -> None:
        if self.state_file.exists():
            self._write_state()
