# Placeholder until the deployment issue: see README "Install strategy".
FROM python:3.11-slim
WORKDIR /opt/kame
COPY . .
RUN ./scripts/install.sh
CMD [".venv/bin/kame", "serve", "--host", "0.0.0.0"]
