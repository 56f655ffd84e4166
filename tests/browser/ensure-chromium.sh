#!/usr/bin/env bash
# Installs Debian's chromium for the browser tests (tests/test_review.py) when it is missing.
# Never fails the build: without chromium the browser tests skip with a reason.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: no apt-get here; the browser tests will skip" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "ensure-chromium: not root and no password-less sudo; the browser tests will skip" >&2
    exit 0
  fi
fi
echo "ensure-chromium: installing chromium with apt-get" >&2
if $SUDO apt-get update -qq && \
   DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
  exit 0
fi
echo "ensure-chromium: apt-get could not install chromium; the browser tests will skip" >&2
exit 0
