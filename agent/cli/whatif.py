"""``zonemeter what-if``: arguments and printing of the replica-count table.

The model run is :mod:`agent.hints.whatif`.

Examples:
    zonemeter what-if --zone a=4 --zone b=4 --zone c=4 --replicas 3-12
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from agent.errors import InputError
from agent.hints import MAX_WHATIF_ENDPOINTS, MAX_WHATIF_REPLICAS, what_if

_EPILOG_WHATIF = """examples:
  zonemeter what-if --zone a=4 --zone b=4 --zone c=4 --replicas 3-12
  zonemeter what-if --zone a=20 --zone b=16 --zone c=14 --replicas 3-10 --spread a=2,b=1,c=1
"""



def register(subparsers: Any) -> None:
    """Add the ``what-if`` verb."""
    w = subparsers.add_parser(
        "what-if", help="which replica counts topology-mode Auto accepts",
        description="For each replica count, whether topology-mode Auto assigns hints in zones "
        "of the given allocatable CPU, why not, the per-zone minimums and hints per zone.",
        epilog=_EPILOG_WHATIF, formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--zone", action="append", required=True, metavar="ZONE=CPU",
                   help="a zone and its allocatable CPU (Kubernetes quantity); repeat per zone")
    w.add_argument("--replicas", required=True, metavar="A-B", help="replica counts, e.g. 3-12 or 6")
    w.add_argument("--spread", metavar="ZONE=N,...",
                   help="placement cycle: N endpoints in each zone per round (default 1 each, "
                   "round-robin in zone order)")
    w.add_argument("-o", "--output", choices=("table", "json"), default="table")
    w.set_defaults(func=run_what_if)


def _parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            k, sep, v = part.partition("=")
            if not sep or not k.strip() or not v.strip():
                raise InputError(f"expected ZONE=VALUE, got {part!r}", field=flag)
            if k.strip() in out:
                raise InputError(f"zone {k.strip()!r} given twice", field=flag)
            out[k.strip()] = v.strip()
    return out


def _parse_range(text: str) -> range:
    m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", text)
    if not m:
        raise InputError(f"expected A-B or N, got {text!r}", field="--replicas")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    if a < 1 or b < a or b - a > 10000 or b > MAX_WHATIF_REPLICAS:
        raise InputError(f"bad range {text!r} (1 <= A <= B <= {MAX_WHATIF_REPLICAS}, at most "
                         "10000 counts)", field="--replicas")
    if (a + b) * (b - a + 1) // 2 > MAX_WHATIF_ENDPOINTS:
        raise InputError(f"range {text!r} models more than {MAX_WHATIF_ENDPOINTS} endpoints in "
                         "all; narrow it", field="--replicas")
    return range(a, b + 1)


def run_what_if(args: argparse.Namespace) -> int:
    """``zonemeter what-if``: print the table or JSON; 0 on success."""
    zones = _parse_pairs(args.zone, "--zone")
    if len(zones) < 2:
        raise InputError("give at least two zones (Auto needs 2 or more)", field="--zone")
    spread = None
    if args.spread:
        raw = _parse_pairs([args.spread], "--spread")
        spread = {}
        for z, v in raw.items():
            if not re.fullmatch(r"[0-9]+", v) or int(v) > MAX_WHATIF_REPLICAS:
                raise InputError(f"count for {z!r} must be an integer 0..{MAX_WHATIF_REPLICAS}",
                                 field="--spread")
            spread[z] = int(v)
    doc = what_if(zones, _parse_range(args.replicas), spread)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    zs = list(zones)
    out = ["REPLICAS  HINTS  " + "  ".join(f"MIN {z}" for z in zs) + "  HINTS PER ZONE / REASON"]
    for r in doc["rows"]:
        mins = "  ".join(str((r["minimums"] or {}).get(z, "-")).rjust(len(f"MIN {z}")) for z in zs)
        tail = ("/".join(str(r["hints_per_zone"][z]) for z in zs) if r["hints_enabled"]
                else f"refused: {r['reason']}")
        out.append(f"{r['replicas']:>8}  {'yes' if r['hints_enabled'] else 'no':<5}  {mins}  {tail}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
