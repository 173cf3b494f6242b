#!/usr/bin/env bash
# Installs what tileweave needs on a fresh Debian machine (idempotent: installs only what is missing).
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config python3 libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libfmt-dev libcpp-httplib-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
