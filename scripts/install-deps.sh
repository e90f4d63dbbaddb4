#!/usr/bin/env bash
# Installs the system packages jetroute needs (Debian): nats-server. Node 20 and npm are assumed.
set -euo pipefail
if command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || [ -n "${NATS_SERVER_BIN:-}" ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing nats-server (Debian package)..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null
  # The package enables a system service; jetroute starts its own servers on free ports.
  systemctl disable --now nats-server >/dev/null 2>&1 || true
  exit 0
fi
cat >&2 <<'MSG'
nats-server is not installed. Install it, then run this again:
  Debian/Ubuntu:  sudo apt-get install -y nats-server
  elsewhere:      https://docs.nats.io/running-a-nats-service/introduction/installation
  or point NATS_SERVER_BIN at a nats-server binary (2.9 or newer).
MSG
exit 1
