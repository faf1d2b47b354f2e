#!/usr/bin/env bash
# Daemon-less container builds: prepares a machine with no Docker daemon and no image registry to
# build and run this project's image with buildah/podman, then prints the environment to use.
#
#   eval "$(bash docker/container-env.sh)"      # as root; idempotent; a few minutes the first time
#
# It installs buildah, podman, runc, slirp4netns, uidmap and debootstrap from apt when missing;
# writes private storage/engine config (overlay driver; runc, which works where crun's cgroup
# handling does not; explicit small ulimits, which unprivileged sandboxes accept); and, when the
# `python:3.11-slim` base image cannot be pulled, builds a stand-in for it (Debian bookworm
# minbase with python3, pip and venv, by debootstrap from the host's apt mirror), so
# docker/Dockerfile builds unchanged. Its Python is Debian's 3.11. docker/smoke.sh calls it.
# Build with `--format docker` (the OCI format drops HEALTHCHECK); without systemd, run health
# checks with `podman healthcheck run NAME`.
set -euo pipefail
WORK=${CONTAINER_WORK:-/tmp/container-env}
BASE=${BASE_IMAGE:-docker.io/library/python:3.11-slim}
mkdir -p "$WORK"
log() { echo "container-env: $*" >&2; }

if ! { command -v buildah && command -v podman && command -v runc && command -v debootstrap; } >/dev/null 2>&1; then
  log "installing buildah podman runc slirp4netns uidmap debootstrap"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    buildah podman runc slirp4netns uidmap debootstrap curl >&2
fi

cat >"$WORK/storage.conf" <<EOC
[storage]
driver = "overlay"
runroot = "$WORK/run"
graphroot = "$WORK/storage"
EOC
cat >"$WORK/containers.conf" <<'EOC'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOC
export CONTAINERS_STORAGE_CONF="$WORK/storage.conf" CONTAINERS_CONF="$WORK/containers.conf"

if ! podman image exists "$BASE"; then
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$MIRROR" ] || { log "no apt mirror found in /etc/apt"; exit 1; }
  log "building stand-in $BASE with debootstrap (about 80 s)"
  R="$WORK/rootfs"; rm -rf "$R"
  debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,curl \
    bookworm "$R" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
  # the machine's own CA bundle, so pip inside a build reaches the registry as the host does
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$R" update-ca-certificates >/dev/null 2>&1 || true
  rm -f "$R"/usr/lib/python3*/EXTERNALLY-MANAGED
  ln -sf /usr/bin/python3 "$R/usr/local/bin/python"; ln -sf /usr/bin/python3 "$R/usr/local/bin/python3"
  rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/archives/*.deb
  # pip configuration of the host (index settings), so `pip install` in a build resolves the same way
  [ -f /etc/pip.conf ] && cp /etc/pip.conf "$R/etc/pip.conf"
  tar -C "$R" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
    podman import \
      --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
      --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
      --change 'CMD ["python3"]' - "$BASE" >/dev/null
  rm -rf "$R"
fi
echo "export CONTAINERS_STORAGE_CONF='$WORK/storage.conf' CONTAINERS_CONF='$WORK/containers.conf'"
