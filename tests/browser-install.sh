#!/usr/bin/env bash
# The headless browser of the report tests (tests/browser.py): Debian's chromium-headless-shell, without
# Recommends. Root; a no-op where it is installed. Without it those tests skip locally and fail under CI=true.
set -euo pipefail
command -v chromium-headless-shell >/dev/null && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null
chromium-headless-shell --version
