# gitops images. No Docker engine runs on the project's build machines, so this file is not
# built in CI; it uses only Debian packages and the package's own pyproject.
#
#   docker build -t gitops .                      # the controller: `gitops watch`
#   docker build -t gitops-agent --target agent . # the files agent each node pod runs

# The files agent: sh, openssl and coreutils, nothing else (see README, "How files reach containers").
FROM debian:bookworm-slim AS agent
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssl coreutils \
 && rm -rf /var/lib/apt/lists/*
STOPSIGNAL SIGKILL
CMD ["sleep", "infinity"]

# The controller.
FROM python:3.11-slim AS gitops
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client gnupg ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN pip install --no-cache-dir /src \
 && rm -rf /src \
 && useradd --system --uid 10001 --home-dir /var/lib/gitops --create-home gitops
USER gitops
WORKDIR /var/lib/gitops
ENV GITOPS_WORKDIR=/var/lib/gitops/work \
    GITOPS_IDENTITY=/etc/gitops/identity.txt
EXPOSE 9100
ENTRYPOINT ["gitops", "watch", "--metrics-address", "0.0.0.0:9100"]
CMD ["--help"]
