# Prometheus from Debian's package, for hosts without a registry (compose.yaml names
# prom/prometheus; deploy/test/override.yaml swaps this in). Build from the repository
# root: docker build -f deploy/prometheus.Dockerfile -t antdt-prometheus deploy
# Build argument: BASE, a Debian bookworm image.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus && \
    rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus
EXPOSE 9090
# prom/prometheus's own defaults: its configuration, storage and the web console
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.listen-address=:9090"]
