#!/usr/bin/env bash
# Prints this checkout's version, the one every binary, the image tag and
# the chart's appVersion carry (docs/release.md). The file VERSION names
# the latest release; the commit that last changed it is that release's
# commit (tagged with the same name once published). Then:
#
#   v0.2.0                    at the release's commit
#   v0.2.0-12-gabcdef0        12 commits after it, at commit abcdef0
#   v0.2.0-12-gabcdef0-dirty  ... with changed tracked files or untracked,
#                             not ignored ones (either may be built in)
#   v0.2.0-dev                no git history (a source archive): unknown
#   v0.2.0-dev-gabcdef0       a shallow clone: the distance is unknown
#
# A tag named as VERSION wins where HEAD's history reaches it (git
# describe: the same answer when the tag is on the release's commit).
# Nothing else is read: no time, no path, no user, so two builds of one
# commit say the same.
set -euo pipefail
cd "$(dirname "$0")/.."
release=$(tr -d '[:space:]' <VERSION)
[[ $release =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] || {
  echo "hack/version.sh: VERSION holds \"$release\", not vMAJOR.MINOR.PATCH" >&2; exit 1; }
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "$release-dev"; exit 0
fi
dirty=""
# A changed tracked file or an untracked one that is not ignored (a new
# source file is compiled in as much as a changed one; Go's vcs.modified
# counts it too). Build outputs and caches (bin/, dist/, .cache/) are
# ignored. No optional locks: a version asked during another git command
# must not take the index lock. A status that fails cannot say clean.
status=$(git --no-optional-locks status --porcelain --untracked-files=normal 2>/dev/null) || status=unknown
[[ -z $status ]] || dirty=-dirty
# A tag HEAD's history does not reach (the release tagged on a release
# branch) says nothing about HEAD: count from VERSION's commit then.
if git rev-parse -q --verify "refs/tags/$release" >/dev/null &&
  described=$(git describe --tags --match "$release" --abbrev=7 --long 2>/dev/null); then
  sed -e 's/-0-g[0-9a-f]*$//' -e "s/\$/$dirty/" <<<"$described"
  exit 0
fi
head=$(git rev-parse --short=7 HEAD)
if [[ $(git rev-parse --is-shallow-repository) == true ]]; then
  echo "$release-dev-g$head$dirty"; exit 0
fi
base=$(git log -1 --format=%H -- VERSION)
[[ -n $base ]] || { echo "$release-dev-g$head$dirty"; exit 0; }
n=$(git rev-list --count "$base..HEAD")
if [[ $n == 0 ]]; then echo "$release$dirty"; else echo "$release-$n-g$head$dirty"; fi
