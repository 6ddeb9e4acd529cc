# kame on a GPU box (and, for the test suite, on a local Debian base on the CPU).
#   Build: DOCKER_BUILDKIT=1 docker build -t kame .        Run: docker-compose.yml / docs/deploying.md.
# Installs exactly as the README does (scripts/install.sh creates .venv/ in the checkout);
# torch comes from PyPI as its standard Linux (CUDA) build, which bundles the CUDA libraries.
#
# Build arguments:
#   BASE_IMAGE   the base (default: the CUDA runtime image). Any Debian/Ubuntu image works: when it
#                lacks python3 + venv they are installed with apt (the CUDA image: Ubuntu 24.04,
#                Python 3.12; a Debian bookworm base made with mmdebstrap: Python 3.11).
#   KAME_VERSION, GIT_COMMIT   image labels (org.opencontainers.image.version / .revision).
# Build secrets (BuildKit; both optional, never stored in a layer: `docker history` shows none):
#   --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt   a CA bundle for pip (corporate TLS proxy)
#   --secret id=pip_conf,src=pip.conf                        a pip config: index-url (with a token),
#                find-links (a wheel folder served over HTTP, e.g. a CPU torch), extra-index-url
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Python: the base's when it has python3 with venv, else Debian/Ubuntu's packages. torch.compile (Triton on
# CUDA, inductor on CPU; frontend.compile) builds kernels at warm-up: it needs gcc, g++ and the Python headers
# at run time, which a runtime base lacks.
RUN pkgs=""; \
    python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs="python3 python3-venv ca-certificates"; \
    { command -v gcc && command -v g++; } >/dev/null 2>&1 || pkgs="$pkgs gcc g++"; \
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
      2>/dev/null || pkgs="$pkgs python3-dev"; \
    if [ -z "$pkgs" ]; then echo "python3, its headers and a C/C++ compiler from the base image"; \
    else apt-get update \
      && apt-get install -y --no-install-recommends $pkgs \
      && rm -rf /var/lib/apt/lists/*; fi

# Non-root user; models and generated files live on a volume.
RUN useradd --create-home --uid 10001 kame
# Kernels torch.compile built (inductor, Triton) stay on the volume: a restart loads them instead of compiling.
ENV HOME=/home/kame \
    HF_HOME=/data/huggingface \
    KAME_CACHE_DIR=/data/kame \
    TORCHINDUCTOR_CACHE_DIR=/data/torchinductor \
    TRITON_CACHE_DIR=/data/triton
RUN mkdir -p /data /opt/kame && chown -R kame:kame /data /opt/kame
VOLUME ["/data"]

WORKDIR /opt/kame
USER kame
# Dependency layer first (torch, moshi, the pinned dependencies: minutes), from the files that name
# them only, so a change to the code rebuilds just the layers below (seconds).
COPY --chown=kame:kame pyproject.toml setup.py ./
COPY --chown=kame:kame requirements/ requirements/
COPY --chown=kame:kame scripts/install.sh scripts/install.sh
RUN --mount=type=secret,id=ca,uid=10001 --mount=type=secret,id=pip_conf,uid=10001 \
    --mount=type=cache,target=/home/kame/.cache/pip,uid=10001 \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca; fi; \
    if [ -f /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    ./scripts/install.sh --deps-only
COPY --chown=kame:kame . .
RUN --mount=type=secret,id=ca,uid=10001 --mount=type=secret,id=pip_conf,uid=10001 \
    --mount=type=cache,target=/home/kame/.cache/pip,uid=10001 \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca; fi; \
    if [ -f /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    ./scripts/install.sh

# Listen address and port as settings (not flags) so the healthcheck reads the same port.
ENV KAME_SERVER__HOST=0.0.0.0 \
    KAME_SERVER__PORT=8998
EXPOSE 8998
# Models take minutes to download and load: /health answers "starting" meanwhile (HTTP 200),
# so the check passes once the server listens; /ready tells load balancers when to route.
# Python's urllib, not curl (the image has none): any non-2xx or no answer is a failure.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD ["/opt/kame/.venv/bin/python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('KAME_SERVER__PORT', '8998'), timeout=4)"]
# SIGTERM drains: no new sessions at once (/ready 503, new websockets 1001), live sessions are
# told and run on for server.drain_grace_s (2 s), then get 1001 and drain_timeout_s (3 s) to
# close: exit within 8 s, inside Docker's default 10 s grace period. Raise drain_grace_s only
# with a longer grace (docker stop -t, compose stop_grace_period; Kubernetes: deploy/kubernetes).
STOPSIGNAL SIGTERM
ARG KAME_VERSION=unknown
ARG GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="kame" \
      org.opencontainers.image.version="${KAME_VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
ENTRYPOINT [".venv/bin/kame", "serve"]
