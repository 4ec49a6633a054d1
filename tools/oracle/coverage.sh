#!/usr/bin/env bash
# Statement coverage of the upstream code under the differential test, in one command.
#
# Usage: tools/oracle/coverage.sh MINOR [PYTEST_ARGS...]
#   MINOR         e.g. 1.37; the normal oracle build of it must exist
#                 ($ZONEMETER_ORACLE_CACHE, default /var/cache/zonemeter/oracle, /<minor>/: go.mod,
#                 go.sum and the *.go it was built from), made by `bash tools/oracle/build.sh MINOR`
#   PYTEST_ARGS   what to run against the instrumented oracle; default
#                 tests/unit/hints/test_oracle_diff.py::test_model_agrees_with_upstream[MINOR]
#                 (ZONEMETER_ORACLE_EXAMPLES sets the examples per minor, default 400)
#
# What it does:
#   1. copies that generated module to $ZONEMETER_ORACLE_COVER (default
#      /var/cache/zonemeter/oracle-cover)/<minor>/ and builds it there with Go coverage counters on
#      k8s.io/endpointslice/..., k8s.io/kubernetes/pkg/proxy and the oracle's main package (Go
#      writes no counter files unless the main package is in -coverpkg); same build tags and
#      -trimpath as build.sh, the shared Go build cache, so only the instrumented packages and the
#      link are rebuilt. The normal build directory is only read.
#   2. runs pytest with ZONEMETER_ORACLE_CACHE pointing at the coverage tree (tools/oracle/client.py
#      cache_root()), so the test's Oracle(MINOR) is the instrumented binary, and GOCOVERDIR set,
#      so every oracle process writes its counters when it exits;
#   3. prints `go tool covdata percent` per package, statement coverage per file of the upstream
#      files that decide hints and kube-proxy's selection, and every function of those files
#      that no example reached (0.0%). Go's coverage is statement (block) coverage, not branch
#      coverage. The merged profile stays in <dir>/profile.txt, per-function in <dir>/func.txt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
die() { echo "oracle coverage: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: coverage.sh MINOR [PYTEST_ARGS...] (e.g. 1.37)"
req="${1#v}"; shift
[[ "$req" =~ ^1\.([0-9]+)$ ]] || die "MINOR must look like 1.37, got '$req'"
minor_n="${BASH_REMATCH[1]}"
minor="1.$minor_n"
command -v go >/dev/null || die "go not found on PATH"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || die "no $python (run tools/setup.sh, or set PYTHON)"

src="${ZONEMETER_ORACLE_CACHE:-/var/cache/zonemeter/oracle}/$minor"
[[ -f "$src/go.mod" && -f "$src/go.sum" && -x "$src/oracle" ]] \
    || die "no oracle build of $minor in $src; run: bash tools/oracle/build.sh $minor"
cover_root="${ZONEMETER_ORACLE_COVER:-/var/cache/zonemeter/oracle-cover}"
out="$cover_root/$minor"
[[ "$(cd "$src" && pwd -P)" != "$(mkdir -p "$out" && cd "$out" && pwd -P)" ]] \
    || die "the coverage directory must not be the normal build directory ($src)"

# the same build tags as build.sh: k8s_lt_1_N for every N above the minor
tags=()
for n in 32 33 34 35 36 37 38; do
    if (( minor_n < n )); then tags+=("k8s_lt_1_$n"); fi
done
tagarg="$(IFS=,; echo "${tags[*]:-}")"

rm -f "$out"/*.go
cp "$src"/go.mod "$src"/go.sum "$src"/*.go "$out/"
start=$(date +%s)
(
    cd "$out"
    GOFLAGS=-mod=mod nice -n 10 go build -trimpath ${tagarg:+-tags "$tagarg"} -cover \
        -coverpkg=k8s.io/endpointslice/...,k8s.io/kubernetes/pkg/proxy,zonemeter.invalid/oracle \
        -o oracle.new .
) >"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; die "coverage build of $minor failed; log: $out/build.log"; }
mv "$out/oracle.new" "$out/oracle"
echo "oracle coverage: built $out/oracle in $(( $(date +%s) - start ))s ($(head -1 "$src/stamp" 2>/dev/null | cut -d' ' -f1))"

covdir="$out/covdata"
rm -rf "$covdir"
mkdir -p "$covdir"
if [[ $# -eq 0 ]]; then
    set -- "tests/unit/hints/test_oracle_diff.py::test_model_agrees_with_upstream[$minor]"
fi
echo "oracle coverage: pytest $* (ZONEMETER_ORACLE_EXAMPLES=${ZONEMETER_ORACLE_EXAMPLES:-default})"
rc=0
(cd "$root" && GOCOVERDIR="$covdir" ZONEMETER_ORACLE_CACHE="$cover_root" \
    "$python" -m pytest -q -s -n 0 -p no:cacheprovider "$@") || rc=$?
ls "$covdir"/covcounters.* >/dev/null 2>&1 || die "no counter files in $covdir (pytest exit $rc)"

echo
echo "== go tool covdata percent (statements per package)"
go tool covdata percent -i "$covdir" \
    -pkg k8s.io/endpointslice,k8s.io/endpointslice/topologycache,k8s.io/endpointslice/trafficdist,k8s.io/kubernetes/pkg/proxy
go tool covdata textfmt -i "$covdir" -o "$out/profile.txt"
(cd "$out" && GOFLAGS=-mod=mod go tool cover -func="$out/profile.txt" >"$out/func.txt" 2>/dev/null) || true

# files that decide hints (reconciler, topologycache, trafficdist) and kube-proxy's selection
files_re='^k8s\.io/(endpointslice/[^/]*\.go|endpointslice/(topologycache|trafficdist)/[^/]*\.go|kubernetes/pkg/proxy/(endpointslicecache|topology|endpoint|endpointschangetracker|serviceport|servicechangetracker)\.go):'
echo
echo "== statements per file (covered/total)"
grep -E "$files_re" "$out/profile.txt" | awk '
    { k = $1; n[k] = $2; if ($3 > 0) hit[k] = 1; split(k, a, ":"); file[k] = a[1] }
    END { for (k in n) { tot[file[k]] += n[k]; if (k in hit) cov[file[k]] += n[k] }
          for (f in tot) printf "%-58s %5.1f%%  %4d/%-4d\n", f, 100 * cov[f] / tot[f], cov[f], tot[f] }' | sort
if [[ -s "$out/func.txt" ]]; then
    echo
    echo "== functions of those files no example reached (0.0%)"
    grep -E "$files_re" "$out/func.txt" | awk '$NF == "0.0%" { print "  " $1 " " $2 }' || true
fi
echo
echo "oracle coverage: profile $out/profile.txt, per function $out/func.txt; pytest exit $rc"
exit "$rc"
