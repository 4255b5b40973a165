#!/usr/bin/env bash
# Idempotent set-up of everything streamrec needs on a fresh Debian machine:
#   .venv with the pinned Python stack, Debian's redis-server and prometheus, a Java runtime
#   and Maven, and the JVM jars (Kafka broker, Flink Kafka connector) from Maven Central.
# Safe to rerun; quiet when there is nothing to do. Called by `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
die() { printf '\nsetup failed: %s\n' "$*" >&2; exit 1; }

hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

apt_updated=0
apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  command -v apt-get >/dev/null || die "apt-get not found: install $* with your system's package manager."
  if [ "$apt_updated" -eq 0 ]; then
    $sudo apt-get update -qq || die "apt-get update failed: is the Debian package mirror reachable?"
    apt_updated=1
  fi
  say "installing Debian packages: $*"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || die "apt-get install $* failed (see the messages above)."
}

# 1. Python 3.11 and the virtual environment -------------------------------------------------
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY="$cand"; break
    fi
  done
fi
[ -n "$PY" ] || die "Python 3.11 is required (TensorFlow 2.16 + TFRA 0.8.1 are pinned to it). Set PYTHON=/path/to/python3.11."

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PY"
  "$PY" -m venv .venv || die "could not create .venv (Debian: apt-get install python3.11-venv)."
fi
want=$(hash_of pyproject.toml)
have=$(cat .venv/.streamrec-installed 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  say "installing Python packages into .venv (first time takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev]' || die "pip install failed: is PyPI reachable?"
  echo "$want" > .venv/.streamrec-installed
fi

# 2. System packages: Redis, Java, Maven ------------------------------------------------------
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
# Headless Chromium loads the dashboard page in its test.
command -v chromium >/dev/null || need+=(chromium fonts-dejavu-core)
# Prometheus and promtool (the stack's monitoring; promtool tests the alert rules).
fresh_prometheus=0
command -v prometheus >/dev/null && command -v promtool >/dev/null || { need+=(prometheus); fresh_prometheus=1; }
[ "${#need[@]}" -eq 0 ] || apt_install "${need[@]}"
if [ "$fresh_prometheus" -eq 1 ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  # The package starts a system-wide Prometheus on :9090; `streamrec up` runs its own there.
  say "stopping and disabling the system prometheus service the package started"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

# 3. JVM artifacts from Maven Central ---------------------------------------------------------
want=$(hash_of deploy/jvm/pom.xml)
have=$(cat deploy/jvm/lib/.fetched 2>/dev/null || true)
if [ "$want" != "$have" ] || ! ls deploy/jvm/lib/kafka/kafka_2.13-*.jar >/dev/null 2>&1; then
  say "fetching Kafka and the Flink Kafka connector from Maven Central"
  rm -rf deploy/jvm/lib
  mvn -q -B -Dstyle.color=never -f deploy/jvm/pom.xml package \
    || die "Maven could not fetch the jars listed in deploy/jvm/pom.xml. Check that Maven Central is reachable (proxy settings in ~/.m2/settings.xml), then run make setup again."
  echo "$want" > deploy/jvm/lib/.fetched
fi

# 4. The connector jar inside the Flink distribution that PyFlink ships -----------------------
.venv/bin/python -c 'from deploy.components import install_connector; install_connector()' \
  || die "could not place the Flink Kafka connector jar into pyflink/lib."
