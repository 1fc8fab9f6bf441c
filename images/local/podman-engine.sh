#!/usr/bin/env bash
# A registry-free container engine for tests and CI on a Linux host without a Docker engine:
# podman from the distribution (run with runc), reached by the docker CLI through podman's Docker-compatible API.
#
#   images/local/podman-engine.sh install   # apt packages (root) and /etc/containers/containers.conf
#   images/local/podman-engine.sh start     # start the API service; prints the DOCKER_HOST line to export
#   images/local/podman-engine.sh stop
#
# DRAFTSCOPE_ENGINE_DIR (its socket, pid and log) and DRAFTSCOPE_ENGINE_STORAGE (a folder for its image storage,
# instead of the host's) start a second engine beside the first: an empty machine, as a reviewer's is, that has
# only what it pulls (the container tier's registry test; `make kick-the-tires`).
#
# Why each setting (observed on Debian 12 / podman 4.3): crun fails on hybrid cgroup hosts, so runc;
# podman's default rlimits exceed what an unprivileged sandbox may set, so they are capped at the caller's hard
# limits; no systemd, so cgroupfs and a file events log. The config is read once, when the service starts.
set -euo pipefail

STATE_DIR=${DRAFTSCOPE_ENGINE_DIR:-${XDG_RUNTIME_DIR:-/tmp}/draftscope-engine}
SOCK="$STATE_DIR/podman.sock"

install_packages() {
  if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null \
     || ! command -v catatonit >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Keep Recommends: catatonit (--init), netavark/aardvark-dns and iptables come with them.
    apt-get install -y -qq podman runc mmdebstrap catatonit uidmap >/dev/null
  fi
  if ! command -v docker >/dev/null; then
    apt-get install -y -qq docker.io >/dev/null 2>&1 || apt-get install -y -qq docker-cli >/dev/null
  fi
  mkdir -p /etc/containers
  engine_conf > /etc/containers/containers.conf
}

engine_conf() {  # engine_conf [EXTRA [engine] LINE…]: the containers.conf every engine of this script reads
  local nofile nproc
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  echo "# Written by draftscope images/local/podman-engine.sh"
  echo "[containers]"
  echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
  echo
  echo "[engine]"
  echo 'runtime = "runc"'
  echo 'cgroup_manager = "cgroupfs"'
  echo 'events_logger = "file"'
  local line
  for line in "$@"; do echo "$line"; done
}

own_storage() {  # a storage.conf of its own under DRAFTSCOPE_ENGINE_STORAGE, for the service started below
  local dir=$1
  mkdir -p "$dir/graph" "$dir/run"
  cat > "$dir/storage.conf" <<CONF
# Written by draftscope images/local/podman-engine.sh: a separate, initially empty image storage.
[storage]
driver = "overlay"
graphroot = "$dir/graph"
runroot = "$dir/run"
CONF
  # Its own state folder too (tmp_dir, else /run/libpod, shared with the first engine). The shared-memory lock table
  # stays shared: both engines allocate from it, which is safe, but `podman system reset` of this storage frees the
  # first engine's locks as well (seen here: its containers stuck in "Created (starting)"): remove the folder instead.
  engine_conf "tmp_dir = \"$dir/tmp\"" > "$dir/containers.conf"
  export CONTAINERS_STORAGE_CONF="$dir/storage.conf" CONTAINERS_CONF="$dir/containers.conf"
}

start_service() {
  mkdir -p "$STATE_DIR"
  if [ -n "${DRAFTSCOPE_ENGINE_STORAGE:-}" ]; then own_storage "$DRAFTSCOPE_ENGINE_STORAGE"; fi
  if DOCKER_HOST="unix://$SOCK" docker version >/dev/null 2>&1; then
    echo "export DOCKER_HOST=unix://$SOCK DOCKER_BUILDKIT=0"
    return
  fi
  # --time=0: without it the service exits after 5 s idle. setsid: it outlives this script.
  setsid podman system service --time=0 "unix://$SOCK" >"$STATE_DIR/service.log" 2>&1 < /dev/null &
  echo $! > "$STATE_DIR/service.pid"
  for _ in $(seq 200); do
    if DOCKER_HOST="unix://$SOCK" docker version >/dev/null 2>&1; then
      echo "export DOCKER_HOST=unix://$SOCK DOCKER_BUILDKIT=0"
      return
    fi
    sleep 0.1
  done
  echo "podman API service did not answer; see $STATE_DIR/service.log" >&2
  exit 1
}

stop_service() {
  if [ -f "$STATE_DIR/service.pid" ]; then
    kill "$(cat "$STATE_DIR/service.pid")" 2>/dev/null || true
    rm -f "$STATE_DIR/service.pid"
  fi
}

case "${1:-}" in
  install) install_packages ;;
  start) start_service ;;
  stop) stop_service ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
