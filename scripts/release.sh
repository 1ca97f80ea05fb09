#!/usr/bin/env bash
# Builds a release of outboxd: static binaries for linux/amd64 and
# linux/arm64, one .tar.gz each (the binary, LICENSE, README.md,
# config.yaml) and SHA256SUMS, in dist/<version>/.
#
#   scripts/release.sh v1.2.3            # version given
#   scripts/release.sh                   # the tag at HEAD (git tag v1.2.3)
#   scripts/release.sh v1.2.3 --image    # also the image outboxd:v1.2.3 (docker build)
#
# Reproducible: the same commit built with the same Go toolchain gives the
# same bytes on any machine (-trimpath, no cgo, no VCS stamping beyond the
# -X flags, archive entries with the commit's time, owner 0 and sorted
# names, gzip without a name or time). Publishing (a GitHub release, a
# registry push) is left to the caller: this script only builds what
# would be published.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-$(git describe --tags --exact-match 2>/dev/null || true)}
[ -n "$version" ] || { echo "release: give the version (scripts/release.sh v1.2.3) or tag HEAD" >&2; exit 2; }
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]] || { echo "release: version $version is not vMAJOR.MINOR.PATCH" >&2; exit 2; }
image=false
[ "${2:-}" = --image ] && image=true
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "release: the work tree has uncommitted changes; a release is built from a commit" >&2
  exit 2
fi
commit=$(git rev-parse HEAD)
epoch=$(git log -1 --format=%ct HEAD)
out="dist/$version"
rm -rf "$out"
mkdir -p "$out"

pkg=github.com/outboxd/outboxd/internal/buildinfo
for arch in amd64 arm64; do
  name="outboxd_${version#v}_linux_${arch}"
  stage=$(mktemp -d)
  mkdir "$stage/$name"
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOFLAGS= go build -trimpath -buildvcs=false \
    -ldflags "-s -w -buildid= -X $pkg.version=$version -X $pkg.commit=$commit" \
    -o "$stage/$name/outboxd" ./cmd/outboxd
  cp LICENSE README.md config.yaml "$stage/$name/"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode=u+rw,go+r,go-w \
    -C "$stage" -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
  rm -rf "$stage"
done
(cd "$out" && sha256sum -- *.tar.gz >SHA256SUMS)
echo "release: $out ($(go version | cut -d' ' -f3), commit $commit)" >&2
cat "$out/SHA256SUMS"

if $image; then
  docker build --build-arg VERSION="$version" --build-arg COMMIT="$commit" \
    -t "outboxd:$version" -t "outboxd:${version%%.*}" .
fi
