# gitops images, on Debian bookworm. Built and run in CI by tests/test_image.py (buildah, see
# scripts/build-image.sh); docker or podman build it as they are:
#
#   docker build -t gitops .                      # the controller: `gitops watch`
#   docker build -t gitops-agent --target agent . # the files agent each node pod runs
#
# BASE: the Debian bookworm image both are built on; the default is the upstream one users pull.
# Where no registry is reachable, scripts/build-image.sh makes an equivalent base with
# mmdebstrap and passes it here (--build-arg BASE=localhost/gitops-base:bookworm).
# Behind a TLS-intercepting proxy, give pip its CA bundle as a build secret (not kept in the
# image): --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt
ARG BASE=docker.io/library/debian:bookworm-slim

# The files agent: sh, openssl and coreutils, nothing else (see README, "How files reach containers").
# It runs as root: it writes the node's files, owned by root, on the hypervisor.
FROM ${BASE} AS agent
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssl coreutils \
 && rm -rf /var/lib/apt/lists/*
STOPSIGNAL SIGKILL
CMD ["sleep", "infinity"]

# The controller's virtualenv, built apart so pip and the build tools stay out of the image.
FROM ${BASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN --mount=type=secret,id=ca-bundle,required=false \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python3 -m venv /opt/gitops \
 && /opt/gitops/bin/pip install --no-cache-dir --disable-pip-version-check /src \
 && /opt/gitops/bin/pip uninstall -y -q pip setuptools

# The controller: the venv on Debian's python3 (same base, so its interpreter link holds), git and
# ssh for the repo's transports, GnuPG for signed commits, restic and etcdctl for etcd backups.
# Runs as uid/gid 10001, not root.
FROM ${BASE} AS gitops
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 git openssh-client gnupg ca-certificates restic etcd-client \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/gitops --create-home gitops
COPY --from=build /opt/gitops /opt/gitops
USER 10001:10001
WORKDIR /var/lib/gitops
# /metrics listens on every address (Prometheus scrapes it from the pod network); the web UI (`--ui`) does
# not follow it there: it listens on $GITOPS_UI_ADDRESS, loopback (reach it with `kubectl port-forward`, or
# set it, and GITOPS_UI_ALLOWED_HOSTS, to serve it to a reverse proxy that adds TLS and sign-in).
ENV PATH=/opt/gitops/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GITOPS_WORKDIR=/var/lib/gitops/work \
    GITOPS_IDENTITY=/etc/gitops/identity.txt \
    GITOPS_METRICS_ADDRESS=0.0.0.0:9100 \
    GITOPS_UI_ADDRESS=127.0.0.1:8080
EXPOSE 9100
# /healthz answers 200 while the reconcile loop turns (gitops/metrics.py), on $GITOPS_METRICS_ADDRESS.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python3", "-c", "import os, urllib.request as u; h, _, p = os.environ['GITOPS_METRICS_ADDRESS'].rpartition(':'); h = '127.0.0.1' if h in ('', '0.0.0.0', '[::]') else h; u.urlopen('http://%s:%s/healthz' % (h, p), timeout=4)"]
ENTRYPOINT ["gitops", "watch"]
CMD ["--help"]
