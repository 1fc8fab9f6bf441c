#!/usr/bin/env bash
# A real image registry on loopback: the distribution registry (Debian's `docker-registry` package), plain HTTP on
# 127.0.0.1 only, its blobs under a state folder. The kit's images are pushed to it (`invoke images.push`) and
# pulled from it by digest (`invoke images.pull`) by the container tier and `make kick-the-tires`.
#
#   images/local/registry.sh install   # apt packages (root), and the engines' permission to speak HTTP to it
#   images/local/registry.sh start     # start it; prints the DRAFTSCOPE_REGISTRY line to export
#   images/local/registry.sh stop      # stop it (its blobs stay until the state folder is removed)
#
# Engines refuse plain HTTP to a registry unless it is listed as insecure: `install` writes that for the address in
# /etc/containers/registries.conf.d/ (read when an engine service starts: install before starting the engine).
# Nothing listens beyond loopback. DRAFTSCOPE_REGISTRY_PORT (default 5000) and DRAFTSCOPE_REGISTRY_DIR choose the
# port and the state folder.
set -euo pipefail

PORT=${DRAFTSCOPE_REGISTRY_PORT:-5000}
ADDR="127.0.0.1:$PORT"
STATE_DIR=${DRAFTSCOPE_REGISTRY_DIR:-${XDG_RUNTIME_DIR:-/tmp}/draftscope-registry-$PORT}
DROP_IN=/etc/containers/registries.conf.d/50-draftscope-loopback-$PORT.conf

install_packages() {
  if ! command -v docker-registry >/dev/null || ! command -v skopeo >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker-registry skopeo >/dev/null
  fi
  # The Debian package starts a registry of its own on :5000 where an init system runs; this script runs its own.
  if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
  mkdir -p "$(dirname "$DROP_IN")"
  cat > "$DROP_IN" <<CONF
# Written by draftscope images/local/registry.sh: the loopback registry speaks plain HTTP.
[[registry]]
location = "$ADDR"
insecure = true
CONF
}

answering() {
  python3 - "$ADDR" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}/v2/", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

start_registry() {
  if answering; then
    echo "export DRAFTSCOPE_REGISTRY=$ADDR"
    return
  fi
  command -v docker-registry >/dev/null || { echo "docker-registry is not installed: run $0 install" >&2; exit 1; }
  mkdir -p "$STATE_DIR/blobs"
  cat > "$STATE_DIR/config.yml" <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE_DIR/blobs
  delete:
    enabled: true
http:
  addr: $ADDR
CONF
  setsid docker-registry serve "$STATE_DIR/config.yml" >"$STATE_DIR/registry.log" 2>&1 < /dev/null &
  echo $! > "$STATE_DIR/registry.pid"
  for _ in $(seq 100); do
    if answering; then
      echo "export DRAFTSCOPE_REGISTRY=$ADDR"
      return
    fi
    sleep 0.1
  done
  echo "the registry did not answer on $ADDR; see $STATE_DIR/registry.log" >&2
  exit 1
}

stop_registry() {
  if [ -f "$STATE_DIR/registry.pid" ]; then
    kill "$(cat "$STATE_DIR/registry.pid")" 2>/dev/null || true
    rm -f "$STATE_DIR/registry.pid"
  fi
}

case "${1:-}" in
  install) install_packages ;;
  start) start_registry ;;
  stop) stop_registry ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
