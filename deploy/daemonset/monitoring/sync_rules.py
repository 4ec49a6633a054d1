#!/usr/bin/env python3
"""Write rules.yml (plain Prometheus rule file) from prometheusrule.yaml.

The PrometheusRule is the source of truth; rules.yml holds its `spec` (the rule
groups) so `promtool check rules rules.yml` and `promtool test rules rules_test*.yml`
check exactly what the Operator loads. tests/unit/deploy/test_rules.py fails when
the two files differ.

Usage: python deploy/daemonset/monitoring/sync_rules.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "prometheusrule.yaml"
TARGET = HERE / "rules.yml"
#: where the runbooks are published: each alert's runbook_url is this plus "#<alert name in
#: lower case>", the alert's section in deploy/daemonset/README.md. Serving the docs
#: elsewhere (an internal mirror): sync_rules.py --runbook-base URL rewrites the rules.
RUNBOOK_BASE = "https://github.com/zonemeter/zonemeter/blob/main/deploy/daemonset/README.md"
HEADER = (
    "# Generated from prometheusrule.yaml by sync_rules.py: edit that file, then run\n"
    "#   python deploy/daemonset/monitoring/sync_rules.py\n"
    "# Plain Prometheus rule groups for `promtool check rules` and non-Operator set-ups.\n"
)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks, as in the source file."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(source: Path | None = None) -> str:
    """Return the text of rules.yml for a PrometheusRule manifest.

    Args:
        source: path of a PrometheusRule YAML document (default: prometheusrule.yaml).

    Returns:
        The header comment followed by `{"groups": [...]}` as YAML.

    Raises:
        ValueError: the document is not a PrometheusRule with spec.groups.
    """
    source = source or SOURCE
    doc = yaml.safe_load(source.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != "PrometheusRule":
        raise ValueError(f"{source}: not a PrometheusRule")
    groups = (doc.get("spec") or {}).get("groups")
    if not isinstance(groups, list):
        raise ValueError(f"{source}: PrometheusRule spec.groups is missing")
    body = yaml.dump(
        {"groups": groups}, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True
    )
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    """Write rules.yml, or with --check exit 1 when it is out of date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, do not write")
    parser.add_argument("--runbook-base", metavar="URL",
                        help="rewrite every runbook_url of prometheusrule.yaml to URL#<alert> first")
    args = parser.parse_args(argv)
    if args.runbook_base:
        if not re.match(r"^https?://\S+$", args.runbook_base):
            print(f"--runbook-base: want an http(s) URL, got {args.runbook_base!r}", file=sys.stderr)
            return 2
        src = SOURCE.read_text()
        SOURCE.write_text(re.sub(r"(runbook_url: )\S+?(#[a-z0-9-]+)$",
                                 lambda m: m.group(1) + args.runbook_base.rstrip("#") + m.group(2),
                                 src, flags=re.M))
    text = render()
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
