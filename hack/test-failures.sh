#!/usr/bin/env bash
# Prints what failed in a `go test` log: each "--- FAIL" line with the test's
# own output (under it without -v; with -v, the output that came before it
# under the test's === RUN/CONT/NAME lines, its last 60 lines; a test
# that timed out, under the timeout's list), a package
# that did not build with its compiler's errors, panics and timeouts with
# what follows them, and the FAIL lines of packages. The Makefile's test
# targets call it when go test fails, so the end of a long log (all a CI
# page may show) names the tests.
#   hack/test-failures.sh LOG [MAX_LINES]
set -euo pipefail
log=${1:?usage: hack/test-failures.sh LOG [MAX_LINES]}
max=${2:-300}
echo "==== what failed (from $log; the whole log is there) ===="
awk -v keep=60 '
  function flush(name,   from, i) {
    if (n[name] > keep) print "    ... (" n[name] - keep " earlier lines of " name " in the log)"
    from = n[name] > keep ? n[name] - keep + 1 : 1
    for (i = from; i <= n[name]; i++) print out[name, i % keep]
    forget(name)
  }
  function forget(name,   i) {
    for (i = 0; i < keep; i++) delete out[name, i]
    delete n[name]
  }
  /^panic: |^fatal error: |^panic: test timed out|test timed out after/ { tail = 60 }
  # A panic ends at the FAIL line of its package at the latest.
  tail > 0 && /^(FAIL|ok)[ \t]/ { tail = 0 }
  # A timeout names the tests still running, each on a line of its own.
  tail > 0 && /^\t\t[^ \t]+ \(/ { print; flush($1); tail--; next }
  tail > 0 { print; tail--; next }
  # A package that did not build: "# pkg" and the errors under it.
  /^# [^ ]/ { build = 30; print; next }
  build > 0 && !/^(ok|FAIL|PASS|---|===|\?)[ \t]/ { print; build--; next }
  { build = 0 }
  # go test -v: whose output the lines that follow are.
  /^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; infail = 0; next }
  /^ *--- FAIL: / { print; flush($3); match($0, /[^ ]/); depth = RSTART; infail = 1; next }
  /^ *--- (PASS|SKIP): / { forget($3) }
  infail && /^ +[^ ]/ { match($0, /[^ ]/); if (RSTART > depth) { print; next } }
  { infail = 0 }
  cur != "" && /^    / { n[cur]++; out[cur, n[cur] % keep] = $0; next }
  /^--- / { cur = "" }
  /^FAIL[ \t]|^FAIL$/ { print }
' "$log" | head -n "$max"
