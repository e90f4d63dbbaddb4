#!/usr/bin/env bash
# Installs the system packages jetroute needs (Debian): nats-server, chromium for the browser
# test of the replay report (services/replay/report-html.test.ts), kubectl for the tests that
# drive the Kubernetes API stand-in with the real client (Debian's `kubernetes-client`; an
# existing kubectl is never replaced), and python3-jinja2, the independent chat-template renderer
# of the real-tokenizer tests (test/real-tokenizer.test.ts). Node 20 and npm are assumed.
set -euo pipefail
need_nats=1
if command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || [ -n "${NATS_SERVER_BIN:-}" ]; then
  need_nats=0
fi
need_chromium=1
if [ -x /usr/bin/chromium ]; then
  need_chromium=0
fi
need_kubectl=1
if command -v kubectl >/dev/null 2>&1; then
  need_kubectl=0
fi
need_jinja=1
if command -v python3 >/dev/null 2>&1 && python3 -c 'import jinja2' >/dev/null 2>&1; then
  need_jinja=0
fi
if [ "$need_nats" = 0 ] && [ "$need_chromium" = 0 ] && [ "$need_kubectl" = 0 ] && [ "$need_jinja" = 0 ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  if [ "$need_nats" = 1 ]; then
    echo "installing nats-server (Debian package)..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null
    # The package enables a system service; jetroute starts its own servers on free ports.
    systemctl disable --now nats-server >/dev/null 2>&1 || true
  fi
  if [ "$need_chromium" = 1 ]; then
    echo "installing chromium (Debian package, the headless browser of the report test)..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  if [ "$need_kubectl" = 1 ]; then
    echo "installing kubectl (Debian package kubernetes-client)..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
  fi
  if [ "$need_jinja" = 1 ]; then
    echo "installing python3-jinja2 (Debian package, the real-tokenizer tests' template renderer)..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-jinja2 >/dev/null
  fi
  exit 0
fi
if [ "$need_nats" = 1 ]; then
  cat >&2 <<'MSG'
nats-server is not installed. Install it, then run this again:
  Debian/Ubuntu:  sudo apt-get install -y nats-server
  elsewhere:      https://docs.nats.io/running-a-nats-service/introduction/installation
  or point NATS_SERVER_BIN at a nats-server binary (2.9 or newer).
MSG
fi
if [ "$need_jinja" = 1 ]; then
  cat >&2 <<'MSG'
python3 with jinja2 is not available (the real-tokenizer tests render chat templates with it).
Install it, then run this again:
  Debian/Ubuntu:  sudo apt-get install -y python3-jinja2
MSG
fi
if [ "$need_chromium" = 1 ]; then
  cat >&2 <<'MSG'
chromium is not installed at /usr/bin/chromium (the browser of the replay report test).
Install it, then run this again:
  Debian/Ubuntu:  sudo apt-get install -y chromium
MSG
fi
if [ "$need_kubectl" = 1 ]; then
  cat >&2 <<'MSG'
kubectl is not installed (the Kubernetes stand-in tests drive it). Install it, then run this again:
  Debian/Ubuntu:  sudo apt-get install -y kubernetes-client
MSG
fi
exit 1
