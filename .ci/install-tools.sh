#!/usr/bin/env bash
# Install the real programs the tests run: prometheus, promtool (Debian package `prometheus`) and
# alertmanager, amtool (`prometheus-alertmanager`) for the alert tests; the openssl command line, which makes
# the TLS tests' certificates (tests/helpers/certs.py; present on most systems already); headless Chromium
# (`chromium`, with `fonts-dejavu-core` so that its screenshots have a font) for the status page's browser tests;
# `libgomp1` (OpenMP runtime) for the real llama.cpp server of the xllamacpp wheel.
#
# Idempotent and non-interactive: a no-op (well under a second) when all four binaries are on PATH,
# /usr/bin/chromium exists and the dynamic linker knows libgomp.so.1; otherwise `apt-get update` (only when the
# package lists are missing or older than a day) and `apt-get install` of what is missing. Must run as root on
# Debian/Ubuntu.
#
# Debian's maintainer scripts would start both daemons (prometheus on :9090, alertmanager on :9093,
# plus a node exporter pulled in as a recommendation). The tests start their own instances on free
# ports, so we forbid service starts during the install (policy-rc.d exit 101), do not install
# recommends, and stop/disable anything that started anyway.
set -euo pipefail

# Debian names the Alertmanager binary `prometheus-alertmanager`; upstream tarballs call it
# `alertmanager`. Either satisfies us (tests/helpers/prometheus.py looks for both).
have() {
    if [ "$1" = alertmanager ]; then
        command -v alertmanager >/dev/null 2>&1 || command -v prometheus-alertmanager >/dev/null 2>&1
    else
        command -v "$1" >/dev/null 2>&1
    fi
}
need=(prometheus promtool alertmanager amtool openssl)
missing=()
for b in "${need[@]}"; do have "$b" || missing+=("$b"); done
packages=()
if [ "${#missing[@]}" -gt 0 ]; then packages+=(prometheus prometheus-alertmanager openssl); fi
# Debian's chromium (no downloaded browser): tests/helpers/browser.py drives it over DevTools.
chromium=/usr/bin/chromium
if [ ! -x "$chromium" ]; then missing+=(chromium); packages+=(chromium fonts-dejavu-core); fi
# GNU OpenMP's runtime: the llama.cpp inside the xllamacpp wheel links libgomp.so.1 (tests/helpers/llamacpp.py).
# (grep without -q: under pipefail, an early exit would SIGPIPE ldconfig and fail the pipeline.)
have_libgomp() { ldconfig -p 2>/dev/null | grep 'libgomp\.so\.1 ' >/dev/null; }
if ! have_libgomp; then missing+=(libgomp1); packages+=(libgomp1); fi
if [ "${#packages[@]}" -eq 0 ]; then
    echo "install-tools: prometheus, promtool, alertmanager, amtool, openssl, chromium and libgomp1 already installed"
    exit 0
fi
echo "install-tools: missing ${missing[*]}; installing ${packages[*]}"

if [ "$(id -u)" -ne 0 ]; then
    echo "install-tools: must run as root (apt-get install)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive

# Forbid invoke-rc.d from starting services while we install; restore whatever was there after.
policy=/usr/sbin/policy-rc.d
saved=""
if [ -e "$policy" ]; then saved="$(mktemp)"; cp -p "$policy" "$saved"; fi
restore_policy() {
    if [ -n "$saved" ]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' >"$policy"
chmod 755 "$policy"

# Another apt run (a parallel job) may hold the dpkg lock: wait for it rather than fail.
# Refresh package lists only if there are none or they are older than a day.
lists=/var/lib/apt/lists
if ! ls "$lists"/*_Packages* >/dev/null 2>&1 \
    || [ -n "$(find "$lists" -maxdepth 1 -name '*_Packages*' -mmin +1440 -print -quit)" ]; then
    apt-get update -qq -o DPkg::Lock::Timeout=600
fi

apt_install() {
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${packages[@]}"
}
if ! apt_install; then
    # Stale lists (a package moved): refresh once and retry.
    apt-get update -qq -o DPkg::Lock::Timeout=600
    apt_install
fi

# Belt and braces: if a service manager started the daemons anyway, stop them so nothing holds
# :9090 / :9093 (tests use free ports, but a stray daemon wastes CPU and confuses debugging).
for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif [ -x "/etc/init.d/$svc" ]; then
        "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
    fi
done

for b in "${need[@]}"; do
    have "$b" || { echo "install-tools: $b still missing" >&2; exit 1; }
done
[ -x "$chromium" ] || { echo "install-tools: $chromium still missing" >&2; exit 1; }
have_libgomp || { echo "install-tools: libgomp.so.1 still missing" >&2; exit 1; }
echo "install-tools: $(prometheus --version 2>&1 | head -1)"
am="$(command -v alertmanager || command -v prometheus-alertmanager)"
echo "install-tools: $("$am" --version 2>&1 | head -1)"
# (Debian's chromium wrapper script may print a harmless shell warning before the version.)
echo "install-tools: $("$chromium" --version 2>/dev/null | tail -1)"
