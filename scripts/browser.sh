#!/usr/bin/env bash
# Installs the distribution's Chromium for the dashboard's browser test (Playwright drives it;
# Playwright's own browser download is not used). `make test` runs this first.
set -euo pipefail

log() { printf '[browser] %s\n' "$*" >&2; }

command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing the distribution's chromium package"
    install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            chromium >/dev/null 2>&1
    }
    install || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 && install; } \
        || log "apt-get install chromium failed; the browser test will fail"
else
    log "chromium is missing (apt-get install chromium as root); the browser test will fail"
fi
