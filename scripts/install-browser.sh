#!/usr/bin/env bash
# The browser tests drive Debian's Chromium with Playwright (Playwright cannot download its own browser
# here). Installs it once; a no-op where /usr/bin/chromium already exists.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
