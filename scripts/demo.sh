#!/usr/bin/env bash
# `npm run demo`: installs what is missing on a fresh machine, builds, and starts the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npm run build --silent
exec node bin/jetroute.js demo "$@"
