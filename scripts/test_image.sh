#!/usr/bin/env bash
# The image phase of the test command (docs/deploying.md): build the Dockerfile on a local Debian
# base and serve the CPU demo from the container (tests/image/image_check.py). Run on its own, after the
# other tests: a build beside real-time tests would break their timing. Callable alone:
#   ./scripts/test_image.sh            (needs .venv from ./scripts/install.sh --test; root or sudo)
#   ./scripts/test_image.sh --clean    (also remove the cached base image, tarball and build cache)
# Installs Debian's docker.io, mmdebstrap and docker-compose when missing, starts dockerd
# (--iptables=false --bridge=none: no bridge networking here) when none runs and stops what it
# started. Needs 8 GiB free under /var/lib/docker: less is a failure (one sentence), not a skip.
set -uo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
need=()
[ -x /usr/bin/docker ] && [ -x /usr/sbin/dockerd ] || need+=(docker.io)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v docker-compose >/dev/null || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  echo "test_image.sh: installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || { echo "test_image.sh: apt-get install ${need[*]} failed" >&2; exit 1; }
fi
# Debian's client: BuildKit (--secret, RUN --mount) with DOCKER_BUILDKIT=1; a newer client first on
# PATH may lack buildx.
export KAME_IMAGE_DOCKER=/usr/bin/docker DOCKER_BUILDKIT=1
mkdir -p /var/lib/docker
free_kb=$(df -Pk /var/lib/docker | awk 'NR==2 {print $4}')
if [ "$free_kb" -lt $((8 * 1024 * 1024)) ]; then
  echo "test_image.sh: only $((free_kb / 1024)) MiB free under /var/lib/docker; the image test needs 8 GiB (base, build cache and a 1.8 GB image)." >&2
  exit 1
fi
started=""
if ! $SUDO $KAME_IMAGE_DOCKER info >/dev/null 2>&1; then
  log=$(mktemp /tmp/kame-dockerd.XXXXXX.log)
  $SUDO dockerd --iptables=false --bridge=none >"$log" 2>&1 &
  started=$!
  for _ in $(seq 60); do $SUDO $KAME_IMAGE_DOCKER info >/dev/null 2>&1 && break; sleep 0.5; done
  $SUDO $KAME_IMAGE_DOCKER info >/dev/null 2>&1 || { echo "test_image.sh: dockerd did not start (log: $log)" >&2; tail -5 "$log" >&2; kill "$started"; exit 1; }
fi
stop_dockerd() {
  if [ -n "$started" ]; then $SUDO kill "$started"; wait "$started" 2>/dev/null; fi
}
trap stop_dockerd EXIT
if [ "${1:-}" = "--clean" ]; then
  $SUDO $KAME_IMAGE_DOCKER rmi -f kame-test-base:bookworm >/dev/null 2>&1
  $SUDO $KAME_IMAGE_DOCKER builder prune -af >/dev/null
  rm -f "${KAME_IMAGE_CACHE:-$HOME/.cache/kame-image}/bookworm-minbase.tar"
  echo "test_image.sh: removed the cached base image, tarball and build cache"
  exit 0
fi
t0=$(date +%s)
NO_TORCH_COMPILE=1 .venv/bin/python -m pytest -ra -p no:cacheprovider -o testpaths= --durations=8 tests/image/image_check.py "$@"
rc=$?
echo "test_image.sh: image phase $(( $(date +%s) - t0 )) s (exit $rc)"
exit $rc
