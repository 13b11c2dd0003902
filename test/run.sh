#!/usr/bin/env bash
# Runs the whole acpgate test suite: formatting, go vet, staticcheck, every
# Go test with the race detector (unit, end-to-end against the real binary,
# Node interop against the official SDK and real agents), then a short run
# of every fuzz target.
#
#   ACPGATE_FUZZTIME   how long each fuzz target runs (default 5s; 0 skips)
#
# ACPGATE_REQUIRE_INTEROP, _OPS, _BROWSER, _SCALE and _REDIS make the
# interop, ops, browser, scale-out and budget tests fail, rather than skip,
# when node/npm, prometheus/promtool, chromium, haproxy or redis-server are
# missing (this script installs them). ACPGATE_REQUIRE_JAEGER does the same for the tracing tests' Jaeger
# (this script builds it first).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:$(go env GOPATH 2>/dev/null)/bin"

step() { printf '\n== %s\n' "$*"; }

step "system packages (Debian): node, npm, chromium, prometheus, haproxy, redis-server"
export DEBIAN_FRONTEND=noninteractive
apt_updated=
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
need_pkg() { # need_pkg COMMAND PACKAGE...
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root apt-get install -y -qq "${@:2}"
}
need_pkg node nodejs
need_pkg npm npm
need_pkg git git
need_pkg setsid util-linux
# test/ops runs a real Prometheus and promtool (both in Debian's prometheus
# package; its service is never started, the tests run the binary).
need_pkg promtool --no-install-recommends prometheus
# test/browser drives Debian's chromium with playwright-core (no browser
# download).
need_pkg chromium --no-install-recommends chromium
# test/scale puts two gateways behind HAProxy (Debian's 2.6; its service is
# never started, the test runs the binary).
need_pkg haproxy --no-install-recommends haproxy
# The budget tests share a ledger among gateways through Debian's Redis
# (internal/redistest runs the binary; its service is never started).
need_pkg redis-server --no-install-recommends redis-server

step "npm dependencies for the interop and browser tests"
(cd test/interop && npm ci --no-audit --no-fund --loglevel=error)
(cd test/browser && npm ci --no-audit --no-fund --loglevel=error)

step "Jaeger v2 for the tracing tests (test/jaeger: built once into the cache)"
# 5 to 8 minutes on 2 cores the first time; reused while the binary is there.
jaeger_version=$(cd test/jaeger && go list -m -f '{{.Version}}' github.com/jaegertracing/jaeger)
jaeger_bin="${ACPGATE_JAEGER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/acpgate/jaeger-$jaeger_version}"
if [ ! -x "$jaeger_bin" ]; then
  echo "building Jaeger $jaeger_version into $jaeger_bin"
  mkdir -p "$(dirname "$jaeger_bin")"
  (cd test/jaeger && timeout 15m go build -o "$jaeger_bin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
  mv "$jaeger_bin.tmp" "$jaeger_bin"
fi
export ACPGATE_JAEGER_BIN="$jaeger_bin"

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path '*/node_modules/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

step "go vet"
go vet ./...

step "staticcheck"
go tool staticcheck ./...

step "go test -race"
ACPGATE_REQUIRE_INTEROP=1 ACPGATE_REQUIRE_OPS=1 ACPGATE_REQUIRE_BROWSER=1 ACPGATE_REQUIRE_SCALE=1 ACPGATE_REQUIRE_JAEGER=1 ACPGATE_REQUIRE_REDIS=1 go test -race -count=1 -timeout 25m ./...

step "go test -race -tags poison: a released message buffer reads as 0xDB (jsonrpc.PutBuffer)"
# 2.5 to 3.5 minutes on 2 shared cores; a buffer used after its release
# fails a test.
go test -race -tags poison -count=1 ./proxy/... ./gateway/...

step "deploy/validate: Kubernetes manifests against the API types (its own module)"
(cd deploy/validate && go vet ./... && go test -count=1 ./...)

fuzztime="${ACPGATE_FUZZTIME:-5s}"
corpus_size() { if [ -d "$1" ]; then ls "$1" | wc -l; else echo 0; fi; }
if [ "$fuzztime" != "0" ]; then
  step "fuzzing, $fuzztime per target"
  for pkg in $(go list ./...); do
    dir=$(go list -f '{{.Dir}}' "$pkg")
    for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
      echo "-- $pkg $target"
      # Go 1.26's fuzz coordinator can fail a run with a bare "context
      # deadline exceeded" when -fuzztime ends while a worker is busy
      # (go.dev/issue/75804, fixed in Go 1.27). That failure writes no
      # failing input; a real finding does (testdata/fuzz/<target>/). Such
      # a run is repeated once; anything else fails the suite.
      corpus="$dir/testdata/fuzz/$target"
      before=$(corpus_size "$corpus")
      log=$(mktemp)
      if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$log"; then
        after=$(corpus_size "$corpus")
        if [ "$after" = "$before" ] && grep -q '^    context deadline exceeded$' "$log"; then
          echo "-- $target: the fuzz coordinator's deadline race (go.dev/issue/75804), no failing input; running it again"
          go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
        else
          rm -f "$log"
          exit 1
        fi
      fi
      rm -f "$log"
    done
  done
fi
echo "all tests passed"
