#!/usr/bin/env bash
# Build a local base image without any registry: a minimal Debian bookworm with Python 3.11, venv and pip,
# bootstrapped from the Debian mirror apt is configured with and imported into podman.
#
#   images/local/base-image.sh [REFERENCE]     # default localhost/debian-py:ci
#
# The host's extra CA certificates are copied in: where egress re-signs TLS, pip inside the image needs them.
# apt caches and lists are trimmed; a Dockerfile that installs Debian packages on top runs apt-get update first.
set -euo pipefail
REF=${1:-localhost/debian-py:ci}
case "$REF" in localhost/*) ;; *) echo "use a localhost/ reference (an unqualified name triggers a registry lookup)" >&2; exit 2 ;; esac
if podman image exists "$REF"; then echo "$REF exists"; exit 0; fi

MIRROR=$(apt-get indextargets --format '$(SITE)' 'Release: bookworm' 'Identifier: Packages' 'Component: main' | head -n 1)
[ -n "$MIRROR" ] || MIRROR=$(apt-get indextargets --format '$(SITE)' 'Identifier: Packages' 'Component: main' | head -n 1)
[ -n "$MIRROR" ] || { echo "no Debian mirror found in apt's configuration" >&2; exit 1; }

# merged-usr hook: without it mmdebstrap installs usrmerge, which pulls in perl (+38 MB).
if ! mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    --customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
        cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/";
        chroot "$1" update-ca-certificates >/dev/null 2>&1; fi' \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/apt/* "$1"/etc/hostname; : > "$1/etc/resolv.conf"' \
    bookworm - "deb $MIRROR bookworm main" \
  | podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$REF" >/dev/null; then
  echo "building $REF failed" >&2
  exit 1
fi
echo "$REF built"
