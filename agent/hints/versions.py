"""Kubernetes versions 1.27 to 1.37 and their feature-gate defaults, as the hint model reads them.

Gate defaults and lock state come from ``pkg/features/kube_features.go`` of each release
(see docs/hints.md, Versions and feature gates). Refusals use the wording of
``k8s.io/component-base/featuregate`` ``(*featureGate).unsafeSetFromMap``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import InputError

GATES = ("TopologyAwareHints", "ServiceTrafficDistribution", "PreferSameTrafficDistribution")
MIN_MINOR, MAX_MINOR = 27, 37
DEFAULT_VERSION = "1.37"

#: gates removed after graduating to GA, with the first minor that no longer has them
#: (kubernetes PR #136112 removed both from ``pkg/features/kube_features.go`` in 1.36; the
#: code they guarded now always runs, e.g. ``endpointslice_controller.go NewController``
#: always builds the topology cache).
REMOVED_GA_GATES = {"TopologyAwareHints": 36, "ServiceTrafficDistribution": 36}


def _gate_default(gate: str, minor: int) -> tuple[bool, bool] | None:
    """(default, locked) of ``gate`` in 1.<minor>, or None when the gate does not exist.

    Source: ``pkg/features/kube_features.go`` of each release (docs/hints.md).
    """
    removed = REMOVED_GA_GATES.get(gate)
    if removed is not None and minor >= removed:
        return None
    if gate == "TopologyAwareHints":
        return (True, minor >= 33)
    if gate == "ServiceTrafficDistribution":
        if minor < 30:
            return None
        return (minor >= 31, minor >= 33)
    if gate == "PreferSameTrafficDistribution":
        if minor < 33:
            return None
        return (minor >= 34, minor >= 35)
    return None


@dataclass(frozen=True, slots=True)
class KubeVersion:
    """A Kubernetes minor version with its effective feature gates.

    Attributes:
        minor: the minor version (27..37 for 1.27..1.37).
        gates: effective value of each gate that exists in that version (defaults from
            ``pkg/features/kube_features.go``, overridden by the caller).
    """

    minor: int
    gates: Mapping[str, bool]

    @classmethod
    def parse(cls, version: str = DEFAULT_VERSION,
              feature_gates: Mapping[str, bool] | None = None) -> KubeVersion:
        """Build from ``"1.X"`` (``"v1.X.Y"`` accepted) and gate overrides.

        Raises:
            InputError: unsupported version, unknown gate for that version
                (``unrecognized feature gate: NAME``, as ``featuregate.unsafeSetFromMap``), or a
                locked gate set against its locked value (``cannot set feature gate NAME to
                false, feature is locked to true``).
        """
        m = re.fullmatch(r"v?1\.(\d+)(?:\.\d+)?", str(version).strip())
        if not m or not MIN_MINOR <= int(m.group(1)) <= MAX_MINOR:
            raise InputError(f"unsupported Kubernetes version {version!r} (supported: 1.27 to 1.37)",
                             field="--kubernetes-version")
        minor = int(m.group(1))
        gates: dict[str, bool] = {}
        for gate in GATES:
            d = _gate_default(gate, minor)
            if d is not None:
                gates[gate] = d[0]
        for name, value in (feature_gates or {}).items():
            d = _gate_default(name, minor)
            if d is None:
                raise InputError(f"unrecognized feature gate: {name} (1.{minor})",
                                 field="--feature-gates")
            if d[1] and bool(value) != d[0]:
                raise InputError(f"cannot set feature gate {name} to {str(bool(value)).lower()}, "
                                 f"feature is locked to {str(d[0]).lower()} (1.{minor})",
                                 field="--feature-gates")
            gates[name] = bool(value)
        return cls(minor, gates)

    def gate(self, name: str) -> bool:
        """Effective value of a gate.

        A gate removed after GA (:data:`REMOVED_GA_GATES`) is on from the minor that removed
        it: its code path became unconditional. Any other gate the version does not have
        (not yet added) is off.
        """
        got = self.gates.get(name)
        if got is not None:
            return got
        removed = REMOVED_GA_GATES.get(name)
        return removed is not None and self.minor >= removed

    def __str__(self) -> str:
        return f"1.{self.minor}"


def parse_feature_gates(text: str) -> dict[str, bool]:
    """Parse ``Name=true,Other=false``.

    Raises:
        InputError: malformed pair or value.
    """
    gates: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or value.strip().lower() not in ("true", "false"):
            raise InputError(f"expected Name=true|false, got {part!r}", field="--feature-gates")
        gates[name.strip()] = value.strip().lower() == "true"
    return gates


#: where the control-plane version the model assumes came from (``zonemeter_hint_model_info``)
VERSION_SOURCES = ("flag", "cluster", "snapshot", "default")
#: where a node's kube-proxy version came from
PROXY_VERSION_SOURCES = ("flag", "node", "default")


def covered_version(reported: str, what: str) -> tuple[str | None, str | None]:
    """The covered ``"1.X"`` nearest to a version a cluster reports, and what to tell about it.

    Reads the ``gitVersion`` shapes of ``/version`` and ``status.nodeInfo``: ``v1.33.5``,
    ``v1.33.5-eks-abc``, ``v1.30.2-gke.1587003``, ``v1.26.4+k3s1``, also ``1.33``. A version
    outside 1.27 to 1.37 is clamped to the nearest covered one (an API server of 1.38 is
    modelled as 1.37, a kubelet of 1.20 as 1.27).

    Args:
        reported: the version text as the cluster reports it.
        what: who reported it, for the message (``"the API server"``, ``"Node n3"``).

    Returns:
        ``(version, message)``: version is ``"1.X"`` within the covered range, or None when
        the text is not a version; message is one sentence when the version was clamped or
        unreadable, else None.
    """
    text = str(reported).strip()
    m = re.match(r"v?(\d+)\.(\d+)(?:\D|$)", text)
    if not m:
        return None, f"{what} reports Kubernetes version {text!r}, which is not a version"
    major, minor = int(m.group(1)), int(m.group(2))
    if major != 1:
        minor = MAX_MINOR + 1 if major > 1 else MIN_MINOR - 1
    if MIN_MINOR <= minor <= MAX_MINOR:
        return f"1.{minor}", None
    near = MAX_MINOR if minor > MAX_MINOR else MIN_MINOR
    side = "newer" if minor > MAX_MINOR else "older"
    return f"1.{near}", (f"{what} reports Kubernetes {text}, {side} than the hint model covers "
                         f"(1.{MIN_MINOR} to 1.{MAX_MINOR}): modelling it as 1.{near}")


def parse_proxy_flag(text: str | None) -> str | None:
    """``--kube-proxy-version``: None for ``auto`` (each Node's own), else ``"1.X"``.

    Raises:
        InputError: neither ``auto`` nor a covered version.
    """
    if text is None or text.strip().lower() in ("", "auto"):
        return None
    try:
        return str(KubeVersion.parse(text))
    except InputError:
        raise InputError(f"expected auto or a version 1.{MIN_MINOR} to 1.{MAX_MINOR}, got {text!r}",
                         field="--kube-proxy-version") from None


def choose_version(flag: str | None, reported: str | None, reported_source: str,
                   what: str) -> tuple[str, str, str | None]:
    """The control-plane version to model: an explicit flag, else what the cluster reports,
    else the newest covered version.

    Args:
        flag: ``--kubernetes-version`` (None: not given).
        reported: the ``gitVersion`` the cluster reports (``/version`` or a snapshot's
            ``version.json``), or None when nothing tells.
        reported_source: the source name of ``reported`` (``"cluster"`` or ``"snapshot"``).
        what: who reported it, for the message.

    Returns:
        ``(version "1.X", source, message)``: source one of :data:`VERSION_SOURCES`;
        message is one sentence when the reported version was clamped or unreadable.

    Raises:
        InputError: ``flag`` is not a covered version (a flag is the user's word: it is
            refused, not clamped).
    """
    if flag is not None:
        return str(KubeVersion.parse(flag)), "flag", None
    if reported is None:
        return DEFAULT_VERSION, "default", None
    got, note = covered_version(reported, what)
    if got is None:
        return DEFAULT_VERSION, "default", f"{note}; modelling the newest covered version, {DEFAULT_VERSION}"
    return got, reported_source, note
