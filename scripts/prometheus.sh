#!/usr/bin/env bash
# Installs the distribution's Prometheus (apt-get install prometheus) for `make up`, which then
# starts it on loopback scraping every service (gangway/prometheus.py). GANGWAY_PROMETHEUS=0
# skips both. Without root or apt, `make up` runs on without it and says so.
set -euo pipefail

log() { printf '[prometheus] %s\n' "$*" >&2; }

[ "${GANGWAY_PROMETHEUS:-1}" = 0 ] && exit 0
command -v prometheus >/dev/null 2>&1 && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing the distribution's prometheus package"
    install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            prometheus >/dev/null 2>&1
    }
    if install || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 && install; }; then
        # The package's own service (port 9090) is not ours: `make up` starts its own.
        if command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true; fi
        exit 0
    fi
    log "apt-get install prometheus failed; make up runs without Prometheus"
else
    log "prometheus is missing (apt-get install prometheus as root); make up runs without it"
fi
