#!/usr/bin/env bash
# Build the hint oracle (tools/oracle/*.go) against one Kubernetes release.
#
# Usage: tools/oracle/build.sh VERSION      VERSION = 1.37 (newest patch the module proxy
#                                           serves) or 1.37.2 (that exact patch)
#        tools/oracle/build.sh --list       the minors this script knows and the patch each resolves to
#        tools/oracle/build.sh --cover VERSION
#                                           also build oracle-cover: the same program with Go coverage
#                                           counters on the upstream packages (k8s.io/endpointslice/...,
#                                           k8s.io/kubernetes/pkg/proxy); run it with GOCOVERDIR=DIR, then
#                                           `go tool covdata percent -i DIR` (statement coverage; the main
#                                           package must be in -coverpkg or Go writes no counters)
#
# Output (outside the clone): $ZONEMETER_ORACLE_CACHE (default /var/cache/zonemeter/oracle)/<minor>/
#   go.mod, go.sum, *.go     the generated module: our sources + a go.mod that requires
#                            k8s.io/kubernetes vX and k8s.io/endpointslice v0.X and replaces every
#                            staging module listed in k8s.io/kubernetes's own go.mod with v0.X.Y
#   oracle                   the binary
#   stamp                    "<kubernetes version> <sha256 of the sources and this script>"; when it
#                            matches, the build is skipped
#   build.log                the go output of the last build, with its wall-clock time
#
# The module proxy does not serve every staging module at every patch. A staging module refused at
# v0.X.Y falls back to the newest v0.X.* the proxy lists (printed, and kept in stamp).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${ZONEMETER_ORACLE_CACHE:-/var/cache/zonemeter/oracle}"
minors=(1.31 1.32 1.33 1.34 1.35 1.36 1.37)

die() { echo "oracle build: $*" >&2; exit 1; }

command -v go >/dev/null || die "go not found on PATH (Go 1.26 is needed)"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# `go list -m` needs a module context that is not the project's; an empty one in scratch does.
(cd "$scratch" && go mod init zonemeter.invalid/probe >/dev/null 2>&1)

# newest_patch MODULE MAJOR.MINOR -> newest vMAJOR.MINOR.P the proxy lists, or nothing
newest_patch() {
    (cd "$scratch" && go list -m -versions "$1" 2>/dev/null) | tr ' ' '\n' \
        | grep -E "^v$2\.[0-9]+\$" | sort -V | tail -1 || true
}

if [[ "${1:-}" == "--list" ]]; then
    for m in "${minors[@]}"; do echo "$m $(newest_patch k8s.io/kubernetes "$m")"; done
    exit 0
fi

cover=0
if [[ "${1:-}" == "--cover" ]]; then cover=1; shift; fi
[[ $# -eq 1 ]] || die "usage: build.sh [--cover] VERSION (e.g. 1.37 or 1.37.2)"
req="${1#v}"
if [[ "$req" =~ ^1\.([0-9]+)$ ]]; then
    minor_n="${BASH_REMATCH[1]}"
    kver="$(newest_patch k8s.io/kubernetes "1.$minor_n")"
    [[ -n "$kver" ]] || die "the module proxy lists no k8s.io/kubernetes v1.$minor_n.x"
elif [[ "$req" =~ ^1\.([0-9]+)\.([0-9]+)$ ]]; then
    minor_n="${BASH_REMATCH[1]}"
    kver="v$req"
else
    die "VERSION must look like 1.37 or 1.37.2, got '$1'"
fi
minor="1.$minor_n"
patch="${kver##*.}"
staging_ver="v0.$minor_n.$patch"

# Build tags select the per-version-range files (see README.md "Version differences").
tags=()
for n in 32 33 34 35 36 37 38; do
    if (( minor_n < n )); then tags+=("k8s_lt_1_$n"); fi
done
tagarg="$(IFS=,; echo "${tags[*]:-}")"

srchash="$(cat "$here"/*.go "$here/build.sh" | sha256sum | cut -c1-16)"
out="$cache_root/$minor"
mkdir -p "$out"
if [[ -x "$out/oracle" && -f "$out/stamp" && "$(head -1 "$out/stamp")" == "$kver $srchash" ]]; then
    echo "oracle $minor ($kver) up to date: $out/oracle"
    if (( cover )); then
        if [[ ! -x "$out/oracle-cover" || "$out/oracle-cover" -ot "$out/oracle" ]]; then
            (cd "$out" && GOFLAGS=-mod=mod nice -n 10 go build -trimpath ${tagarg:+-tags "$tagarg"} -cover \
                -coverpkg=k8s.io/endpointslice/...,k8s.io/kubernetes/pkg/proxy,zonemeter.invalid/oracle -o oracle-cover .) \
                || die "coverage build of $minor failed"
        fi
        echo "coverage binary: $out/oracle-cover"
    fi
    exit 0
fi

echo "oracle $minor: k8s.io/kubernetes $kver, staging $staging_ver, tags '${tagarg}'"
dl="$(cd "$scratch" && go mod download -json "k8s.io/kubernetes@$kver" 2>&1)" \
    || die "k8s.io/kubernetes@$kver refused: $(echo "$dl" | grep -m1 -E 'Error|error' || echo "$dl" | head -3)"
kdir="$(echo "$dl" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -f "$kdir/go.mod" ]] || die "no go.mod under '$kdir'"

# Staging modules: the left-hand sides of "k8s.io/x => ./staging/src/k8s.io/x" in kubernetes's
# go.mod that its require block also lists (at v0.0.0); a replace line for a module outside the
# build graph would be unused (sample-cli-plugin, sample-controller).
mapfile -t staging < <(
    sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\1#p' "$kdir/go.mod" | while read -r m; do
        grep -qE "^[[:space:]]*$m v0\.0\.0([[:space:]]|\$)" "$kdir/go.mod" && echo "$m"
    done
)
[[ ${#staging[@]} -gt 0 ]] || die "no staging replace lines in $kdir/go.mod"
gover="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kdir/go.mod")"

# listed_patches MODULE MAJOR.MINOR -> every vMAJOR.MINOR.P the proxy lists, newest first
listed_patches() {
    (cd "$scratch" && go list -m -versions "$1" 2>/dev/null) | tr ' ' '\n' \
        | grep -E "^v$2\.[0-9]+\$" | sort -rV || true
}

# The proxy may answer a version's .info and still refuse its .zip (endpointslice v0.32.13), so
# availability is checked by downloading the module (Go needs the zip to build it anyway).
fallbacks=()
replace_lines=()
for mod in "${staging[@]}"; do
    v="$staging_ver"
    if ! (cd "$scratch" && go mod download "$mod@$v" >/dev/null 2>"$scratch/err"); then
        why="$(grep -m1 -o '[0-9][0-9][0-9] [A-Za-z ]*' "$scratch/err" || echo refused)"
        alt=""
        while read -r cand; do
            [[ -z "$cand" || "$cand" == "$v" ]] && continue
            if (cd "$scratch" && go mod download "$mod@$cand" >/dev/null 2>&1); then alt="$cand"; break; fi
        done < <(listed_patches "$mod" "0.$minor_n" | head -6)
        if [[ -n "$alt" ]]; then
            fallbacks+=("$mod $v->$alt ($why)")
            v="$alt"
        else
            # Kept as is: Go reads a module's go.mod only when the build needs one of its
            # packages (module graph pruning), so an unused refused module does no harm; if it
            # is needed, go mod tidy fails below with the proxy's answer.
            fallbacks+=("$mod $v kept although refused ($why), no downloadable v0.$minor_n.x listed")
        fi
    fi
    replace_lines+=("	$mod => $mod $v")
    [[ "$mod" == "k8s.io/endpointslice" ]] && eps_ver="$v"
done
for f in "${fallbacks[@]}"; do echo "  fallback: $f"; done

rm -f "$out"/*.go
cp "$here"/*.go "$out/"
{
    echo "// Generated by tools/oracle/build.sh for Kubernetes $kver. Do not edit."
    echo "module zonemeter.invalid/oracle"
    echo
    echo "go $gover"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $kver"
    echo "	k8s.io/endpointslice ${eps_ver:-$staging_ver}"
    echo ")"
    echo
    echo "replace ("
    printf '%s\n' "${replace_lines[@]}"
    echo ")"
} >"$out/go.mod"

start=$(date +%s)
(
    cd "$out"
    export GOFLAGS="-mod=mod"
    nice -n 10 go mod tidy
    nice -n 10 go build -trimpath ${tagarg:+-tags "$tagarg"} -o oracle.new .
) >"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; die "build of $minor ($kver) failed; log: $out/build.log"; }
mv "$out/oracle.new" "$out/oracle"
if (( cover )); then
    (cd "$out" && GOFLAGS=-mod=mod nice -n 10 go build -trimpath ${tagarg:+-tags "$tagarg"} -cover \
        -coverpkg=k8s.io/endpointslice/...,k8s.io/kubernetes/pkg/proxy,zonemeter.invalid/oracle -o oracle-cover .) \
        >>"$out/build.log" 2>&1 || die "coverage build of $minor failed; log: $out/build.log"
    echo "coverage binary: $out/oracle-cover"
fi
secs=$(( $(date +%s) - start ))
echo "build seconds: $secs (uptime:$(uptime | sed 's/.*load average/ load average/'))" >>"$out/build.log"
{
    echo "$kver $srchash"
    echo "endpointslice ${eps_ver:-$staging_ver}"
    for f in "${fallbacks[@]}"; do echo "fallback $f"; done
    echo "built $(date -u +%FT%TZ) in ${secs}s"
} >"$out/stamp"
echo "oracle $minor ($kver) built in ${secs}s: $out/oracle"
