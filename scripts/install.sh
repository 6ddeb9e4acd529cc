#!/usr/bin/env bash
# Create .venv/ in the checkout and install kame into it (idempotent).
#
# Install strategy (docs/development.md, "Install strategy"):
#  * torch: an existing torch in .venv is never replaced. Otherwise
#    $KAME_TORCH_SPEC is installed (default: torch==2.13.0; on a machine with
#    an NVIDIA driver pip's default Linux build is CUDA-enabled). Pass
#    KAME_TORCH_INDEX to use another index (e.g. a CPU-only one).
#    KAME_VENV_SYSTEM_SITE=1 creates the venv with --system-site-packages so a
#    torch already installed in the system Python is used as is.
#  * moshi==0.2.13 is installed with --no-deps (its torch<2.10 pin would swap
#    torch); its other runtime dependencies are kame's own dependencies.
#  * everything else is pinned by requirements/constraints.txt, plus a
#    constraint torch==<installed version> so no package can swap torch.
# Usage: scripts/install.sh [--test] [--deps-only]
#   --test adds test tools and Debian packages; --deps-only installs torch, moshi and kame's
#   pinned dependencies but not kame itself (needs only pyproject.toml, requirements/ and this
#   script: the Dockerfile's cached dependency layer, built before the source is copied).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
WITH_TEST=0
DEPS_ONLY=0
for a in "$@"; do
  case "$a" in
    --test) WITH_TEST=1 ;;
    --deps-only) DEPS_ONLY=1 ;;
    *) echo "install.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

PY=${KAME_PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  opts=()
  if [ "${KAME_VENV_SYSTEM_SITE:-0}" = "1" ]; then opts+=(--system-site-packages); fi
  "$PY" -m venv "${opts[@]}" "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check -q)

if [ "$WITH_TEST" = "1" ]; then
  need=()
  command -v espeak-ng >/dev/null || need+=(espeak-ng)
  command -v sox >/dev/null || need+=(sox)
  # tests/test_browser.py drives Debian's Chromium with the Python playwright
  # package (its own driver; no browser download: never `playwright install`).
  [ -x /usr/bin/chromium ] || need+=(chromium)
  # tests/test_kubernetes.py renders deploy/kubernetes with `kubectl kustomize`;
  # tests/calls/test_haproxy.py and bench/fleet.py run HAProxy in front of kame replicas.
  command -v kubectl >/dev/null || need+=(kubectl)
  [ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null || need+=(haproxy)
  # tests/test_webrtc_turn.py relays a WebRTC call through coturn on loopback.
  [ -x /usr/bin/turnserver ] || need+=(coturn)
  # tests/calls/test_resume_*.py: two replicas resume a drained session through a real Redis.
  command -v redis-server >/dev/null || need+=(redis-server)
  # tests/calls/test_sip_load.py and bench/sip_load.py place phone calls with SIPp.
  command -v sipp >/dev/null || need+=(sip-tester)
  # tests/calls/test_sip_calls.py runs deploy/sip/kamailio.cfg: SIP over TLS in front of kame.
  [ -n "$(ls /usr/lib/*/kamailio/modules/tls.so 2>/dev/null)" ] || need+=(kamailio kamailio-tls-modules)
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    echo "install.sh: installing Debian packages: ${need[*]}"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

if "$VPY" -c "import torch" 2>/dev/null; then
  echo "install.sh: keeping installed torch $("$VPY" -c 'import torch; print(torch.__version__)')"
else
  spec=${KAME_TORCH_SPEC:-torch==2.13.0}
  idx=()
  if [ -n "${KAME_TORCH_INDEX:-}" ]; then idx=(--index-url "$KAME_TORCH_INDEX"); fi
  echo "install.sh: installing $spec"
  "${PIP[@]}" "${idx[@]}" "$spec"
fi
TORCH_VERSION=$("$VPY" -c 'import torch; print(torch.__version__)')
CONS="$VENV/kame-constraints.txt"
{ cat requirements/constraints.txt; echo "torch==$TORCH_VERSION"; } > "$CONS"

"${PIP[@]}" -c "$CONS" --no-deps "moshi==0.2.13"
if [ "$DEPS_ONLY" = "1" ]; then
  mapfile -t deps < <("$VPY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
  "${PIP[@]}" -c "$CONS" "${deps[@]}"
  echo "install.sh: dependencies ready in $VENV (torch $TORCH_VERSION); kame itself not installed (--deps-only)"
  exit 0
fi
extras=""
[ "$WITH_TEST" = "1" ] && extras="[test]"
"${PIP[@]}" -c "$CONS" -e ".$extras"
if [ "$WITH_TEST" = "1" ]; then
  # Pipecat's Live API event models for tests/test_live_pipecat.py: only its wire module is used, which
  # needs nothing but pydantic, so its heavy dependencies (numba, onnxruntime, ...) are not installed.
  "${PIP[@]}" -c "$CONS" --no-deps "pipecat-ai==1.14.0"
fi
echo "install.sh: ready: $VENV/bin/kame (torch $TORCH_VERSION)"
