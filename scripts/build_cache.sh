# shellcheck shell=bash
# Build outputs kept between installs on one machine (sourced by scripts/install.sh): the Horovod
# wheel and node_modules, each under a key that hashes everything the build depends on, so a fresh
# clone reuses them and any change to those inputs builds anew. docs/testing.md, "The install cache".
#
#   key=$(cache_key NAME FILE... [-- TEXT...])   NAME-<hash of the files' contents and the texts>
#   cache_get KEY          prints the entry's directory if a complete, intact entry exists
#   cache_put KEY FILE...  stores copies of the files as KEY's entry
#
# An entry appears under its key only by a rename of a finished temporary directory, and is used only
# while its files match the SHA256SUMS written with them: an interrupted or damaged entry is a miss.

BUILD_CACHE_DIR=${MASKRCNN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/maskrcnn-on-aws}
# Entries of one kind (one NAME) kept: enough for a few branches on one machine, not an ever-growing folder.
BUILD_CACHE_KEEP=${BUILD_CACHE_KEEP:-3}
_BUILD_CACHE_SELF=${BASH_SOURCE[0]}

cache_key() {
  local name=$1 files=("$_BUILD_CACHE_SELF") file
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do files+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  for file in "${files[@]}"; do
    [ -f "$file" ] || { echo "build cache: no file $file to key on" >&2; return 1; }
  done
  {
    # this file too: a change to how entries are laid out must not find the old ones
    for file in "${files[@]}"; do
      printf 'file %s %s\n' "$(basename "$file")" "$(sha256sum < "$file")"
    done
    printf 'text %s\n' "$@"
  } | sha256sum | { read -r hash _; echo "$name-${hash:0:32}"; }
}

cache_get() {
  local entry=$BUILD_CACHE_DIR/$1
  [ -f "$entry/SHA256SUMS" ] || return 1
  if ! (cd "$entry" && sha256sum --check --quiet --status SHA256SUMS); then
    echo "build cache: $entry does not match its checksums; removing it and building again" >&2
    rm -rf "$entry"
    return 1
  fi
  touch "$entry"   # recently used: kept by the pruning below
  echo "$entry"
}

cache_put() {
  local key=$1 partial
  shift
  mkdir -p "$BUILD_CACHE_DIR"
  # dot-prefixed, with the writer's pid: never a key, never looked up; left behind only by a killed writer
  partial=$(mktemp -d "$BUILD_CACHE_DIR/.partial-$key-$$-XXXXXX")
  if ! { cp -- "$@" "$partial"/ && (cd "$partial" && sha256sum -- * > SHA256SUMS); }; then
    rm -rf "$partial"
    return 1
  fi
  # Another install may have stored the same key meanwhile: then its entry stays and ours goes.
  mv -T "$partial" "$BUILD_CACHE_DIR/$key" 2>/dev/null || rm -rf "$partial"
  find "$BUILD_CACHE_DIR" -mindepth 1 -maxdepth 1 -name '.partial-*' -mmin +1440 -exec rm -rf {} +
  # shellcheck disable=SC2012  # keys are [A-Za-z0-9-]: ls's sort by time is safe here
  ls -1dt "$BUILD_CACHE_DIR/${key%-*}"-* | tail -n +$((BUILD_CACHE_KEEP + 1)) | xargs -r rm -rf
}
