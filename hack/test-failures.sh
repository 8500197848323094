#!/usr/bin/env bash
# Prints what failed in a `go test` log: each "--- FAIL" line with the test's
# own output under it, panics and timeouts with what follows them, and the
# FAIL lines of packages. The Makefile's test targets call it when go test
# fails, so the end of a long log (all a CI page may show) names the tests.
#   hack/test-failures.sh LOG [MAX_LINES]
set -euo pipefail
log=${1:?usage: hack/test-failures.sh LOG [MAX_LINES]}
max=${2:-300}
echo "==== what failed (from $log; the whole log is there) ===="
awk '
  /^panic: |^fatal error: |^panic: test timed out|test timed out after/ { tail = 60 }
  tail > 0 { print; tail--; next }
  /^ *--- FAIL: / { print; match($0, /[^ ]/); depth = RSTART; infail = 1; next }
  infail && /^ +[^ ]/ { match($0, /[^ ]/); if (RSTART > depth) { print; next } }
  { infail = 0 }
  /^FAIL[ \t]|^FAIL$/ { print }
' "$log" | head -n "$max"
