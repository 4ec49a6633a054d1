"""Every repository path the docs and the code's comments cite exists.

A path such as ``tests/unit/k8s/test_cache.py``, ``agent/hints/model.py`` or
``tests/kernel/test_datapath*.py`` named in README.md, docs/, BENCHMARKS.md, the deploy and
tools READMEs, the manifests, or a Python/C source file must name a file or directory of this
checkout (a glob must match at least one), and a ``path::name`` citation must name a function
or class defined in that file. A move that leaves a reader at a dead path fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where citations are read: the documents, the manifests, and every source file
SOURCES = ("README.md", "BENCHMARKS.md", "docs/*.md", "deploy/**/*.md", "deploy/**/*.yaml",
           "deploy/**/*.txt", "deploy/**/*.py", "tools/**/*.md", "tools/**/*.py", "tools/**/*.sh",
           "agent/**/*.py", "bpf/*.h", "bpf/*.c", "bench/*.py", "tests/**/*.py", ".ci/run")
#: paths of other projects that the text names as theirs (cilium's ``bpf/lib``, client-go's
#: ``tools/cache/reflector.go``); they look like ours but are not in this tree
UPSTREAM = {"bpf/lib", "tools/cache/reflector.go"}
CITE = re.compile(r"(?<![\w/.$-])((?:tests|agent|tools|bpf|bench|deploy|docs)/[\w./-]*\w(?:\*[\w.]*)?)"
                  r"(?:::(\w+))?")


def _citations() -> list[tuple[str, str, str | None]]:
    out = []
    for pattern in SOURCES:
        for f in sorted(ROOT.glob(pattern)):
            if not f.is_file() or "/.venv/" in str(f) or f == Path(__file__).resolve():
                continue
            text = f.read_text(errors="replace")
            for m in CITE.finditer(text):
                if text[m.end():m.end() + 1] == "\\":  # a regular expression, not a path
                    continue
                out.append((str(f.relative_to(ROOT)), m.group(1), m.group(2)))
    return out


def _dead(path: str, name: str | None) -> str | None:
    if path in UPSTREAM:
        return None
    if "*" in path:
        return None if any(ROOT.glob(path)) else "no file matches"
    target = ROOT / path
    if not target.exists():
        return "no such file"
    if name and target.is_file() and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b",
                                                   target.read_text(), re.MULTILINE):
        return f"no def or class {name}"
    return None


def test_the_scan_finds_citations() -> None:
    cited = {p for _, p, _ in _citations()}
    # the scan reads what it should: paths that the README and the docs do cite
    assert "tools/setup.sh" in cited
    assert any(p.startswith("tests/unit/") for p in cited)


def test_every_cited_path_exists() -> None:
    dead = sorted({f"{src}: {path}{'::' + name if name else ''} ({why})"
                   for src, path, name in _citations()
                   if (why := _dead(path, name)) is not None})
    assert not dead, "dead citations:\n" + "\n".join(dead)


def test_a_dead_path_is_reported() -> None:
    assert _dead("tests/unit/test_no_such_module.py", None) == "no such file"
    assert _dead("tests/unit/no_such_*.py", None) == "no file matches"
    assert _dead("tests/unit/test_docs.py", "no_such_test") == "no def or class no_such_test"
    assert _dead("tests/unit/test_docs.py", "test_a_dead_path_is_reported") is None


#: documents that live outside this repository (the founders' notes) and history
FOREIGN_CITATION = re.compile(r"\b(?:DESIGN|HINTS|STYLE)\.md\b|\b[Ii]ssue \d+\b|\bBreaker \d")


def test_nothing_cites_documents_outside_the_repository_or_its_history() -> None:
    """Comments and docs cite upstream sources and the project's own docs; the history of
    how the code got here belongs in commit messages (CHANGELOG.md excepted: it is history)."""
    found = []
    for pattern in SOURCES:
        for f in sorted(ROOT.glob(pattern)):
            if not f.is_file() or "/.venv/" in str(f) or f == Path(__file__).resolve():
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if FOREIGN_CITATION.search(line):
                    found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "citations of documents outside the repository or of its history:\n" + "\n".join(found)
