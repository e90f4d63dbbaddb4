#!/usr/bin/env bash
# `npm run demo`: installs what is missing on a fresh machine, builds, and starts the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
npm run build --silent
exec node bin/jetroute.js demo "$@"
