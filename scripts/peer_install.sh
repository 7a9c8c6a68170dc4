#!/usr/bin/env bash
# Runs ON the GPU machine (no network): installs the optional peer (QuACK, requirements-peer.txt)
# from the wheels scripts/peer_wheels.sh prepared, carried in two device calls of one folder
# each (docs/peers.md):
#   bash scripts/peer_install.sh stage1   # call 1, carry .whl/peer1: keeps its part in /tmp/peer
#   bash scripts/peer_install.sh stage2   # call 2, carry .whl/peer2: reassembles the split
#                                         # wheel, checks its md5, installs into /tmp/peersite
# The second call must follow at once: the machine is given back ~30 s after a call, /tmp and
# all. After stage2, `source /tmp/peersite/env.sh` sets the PYTHONPATH under which
# `import quack` works. The install directory ends in site-packages on purpose: QuACK's kernel
# cache treats code under such a path as library code, and elsewhere it fails to key CuTe DSL.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${PEER_STAGE:-/tmp/peer}
ROOT=${PEER_ROOT:-/tmp/peersite}
SITE=$ROOT/site-packages

die() { echo "peer_install: $*" >&2; exit 1; }

case "${1:-}" in
  stage1)
    [ -d .whl/peer1 ] || die "no .whl/peer1 here: name it in the call's carry (run scripts/peer_wheels.sh first)"
    mkdir -p "$STAGE"
    cp .whl/peer1/* "$STAGE"/
    echo "stage1: copied .whl/peer1 to $STAGE:"
    ls -l "$STAGE" | tail -n +2
    echo "stage1: done; run stage2 (carry .whl/peer2) in the very next call"
    ;;
  stage2)
    [ -d .whl/peer2 ] || die "no .whl/peer2 here: name it in the call's carry"
    mkdir -p "$STAGE"
    cp .whl/peer2/* "$STAGE"/
    echo "stage2: copied .whl/peer2 to $STAGE"
    for sum in "$STAGE"/*.whl.md5; do
      [ -e "$sum" ] || continue
      whl=${sum%.md5}
      parts=("$whl".part-*)
      if [ -e "${parts[0]}" ]; then
        [ "${#parts[@]}" -eq 2 ] || die "$(basename "$whl"): found ${#parts[@]} part(s) of 2 in $STAGE; the machine was given back after stage1? Run stage1 again, then stage2 at once"
        cat "${parts[@]}" > "$whl"
        echo "stage2: joined ${parts[*]##*/} into $(basename "$whl")"
      fi
      (cd "$STAGE" && md5sum -c "$(basename "$sum")") || die "md5 mismatch for $(basename "$whl")"
      rm -f "${parts[@]}"
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
      "$STAGE"/*.whl
    echo "stage2: installed $(ls "$STAGE"/*.whl | wc -l) wheels into $SITE"
    # --target leaves CuTe DSL's .pth unread, so its package folder goes on the path too
    echo "export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}" \
      > "$ROOT/env.sh"
    # shellcheck disable=SC1091
    source "$ROOT/env.sh"
    echo "stage2: wrote $ROOT/env.sh ($PYTHONPATH)"
    python3 -c "import quack, quack.gemm_interface, cutlass, einops, google.protobuf as pb; \
print('stage2: import quack', quack.__version__, 'ok; cutlass from', cutlass.__file__, \
'; protobuf', pb.__version__)" || die "import quack failed"
    ;;
  *)
    die "usage: bash scripts/peer_install.sh stage1|stage2"
    ;;
esac
