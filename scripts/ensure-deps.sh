#!/usr/bin/env bash
# Installs what a fresh clone lacks before the tests or the demo run: the system packages
# (install-deps.sh: nats-server, chromium) and the npm packages (npm ci, when node_modules is
# missing or older than package-lock.json). Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
