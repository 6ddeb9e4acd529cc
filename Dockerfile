# kame on a GPU box. Build: docker build -t kame .   Run: see docker-compose.yml / README "Deploying".
# Installs exactly as the README does (scripts/install.sh creates .venv/ in the checkout);
# torch comes from PyPI as its standard Linux (CUDA) build, which bundles the CUDA libraries.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Non-root user; models and generated files live on a volume.
RUN useradd --create-home --uid 10001 kame
ENV HOME=/home/kame \
    HF_HOME=/data/huggingface \
    KAME_CACHE_DIR=/data/kame
RUN mkdir -p /data /opt/kame && chown -R kame:kame /data /opt/kame
VOLUME ["/data"]

WORKDIR /opt/kame
COPY --chown=kame:kame . .
USER kame
RUN ./scripts/install.sh

EXPOSE 8998
# Models take minutes to download and load: /health answers "starting" meanwhile (HTTP 200),
# so the check passes once the server listens; /ready tells load balancers when to route.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8998/health || exit 1
# SIGTERM drains: no new sessions at once (/ready 503, new websockets 1001), live sessions are
# told and run on for server.drain_grace_s (2 s), then get 1001 and drain_timeout_s (3 s) to
# close: exit within 8 s, inside Docker's default 10 s grace period. Raise drain_grace_s only
# with a longer grace (docker stop -t, compose stop_grace_period; Kubernetes: deploy/kubernetes).
STOPSIGNAL SIGTERM
ENTRYPOINT [".venv/bin/kame", "serve", "--host", "0.0.0.0", "--port", "8998"]
