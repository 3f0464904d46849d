#!/usr/bin/env bash
# A Docker engine for the compose test on a Debian bookworm machine without one (CI: root, no systemd):
#
#   bash docker/engine.sh install   # Debian's docker.io and debootstrap, and `docker compose` (v2)
#   bash docker/engine.sh start     # dockerd in the background (pid in $MJOIN_DOCKERD_DIR/dockerd.pid), wait for it
#   bash docker/engine.sh stop      # stop the dockerd that `start` started (by its recorded pid)
#
# `docker compose` v2: bookworm packages only compose v1 (docker-compose 1.29); Debian trixie's docker-compose
# package (2.26, one static binary, depends on libc6 >= 2.34 alone) is the v2 plugin, so `install` downloads that
# one package from Debian's mirror with a private package list (the machine's apt sources stay as they are) and
# installs it with dpkg. `start` runs dockerd without its bridge network and without iptables rules: the compose
# test puts every container on the host network (docker-compose.host.yml) and builds there too, so no traffic
# leaves the loopback. dockerd keeps its data in /var/lib/docker (the local base images stay cached there).
set -euo pipefail
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DIR=${MJOIN_DOCKERD_DIR:-/tmp/mjoin-dockerd}

install() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if ! docker compose version >/dev/null 2>&1; then
        local tmp
        tmp=$(mktemp -d)
        mkdir -p "$tmp/lists/partial"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" > "$tmp/sources.list"
        local opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
                    -o "Dir::State::Lists=$tmp/lists" -o APT::Sandbox::User=root)
        apt-get "${opts[@]}" update -qq
        (cd "$tmp" && apt-get "${opts[@]}" download -qq docker-compose)
        dpkg -i "$tmp"/docker-compose_*.deb >/dev/null
        rm -rf "$tmp"
    fi
    docker compose version
}

start() {
    if docker info >/dev/null 2>&1; then
        echo "engine: a Docker engine already answers"
        return 0
    fi
    mkdir -p "$DIR"
    setsid dockerd --bridge=none --iptables=false --ip6tables=false >"$DIR/dockerd.log" 2>&1 < /dev/null &
    echo $! > "$DIR/dockerd.pid"
    for _ in $(seq 120); do
        if docker info >/dev/null 2>&1; then
            echo "engine: dockerd $(cat "$DIR/dockerd.pid") up (log $DIR/dockerd.log)"
            return 0
        fi
        if ! kill -0 "$(cat "$DIR/dockerd.pid")" 2>/dev/null; then
            break
        fi
        sleep 1
    done
    echo "engine: dockerd did not start:" >&2
    tail -15 "$DIR/dockerd.log" >&2
    return 1
}

stop() {
    local pid
    pid=$(cat "$DIR/dockerd.pid" 2>/dev/null) || { echo "engine: no dockerd started by this script"; return 0; }
    if kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline"; then
        kill -TERM "$pid"
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        echo "engine: dockerd $pid stopped"
    fi
    rm -f "$DIR/dockerd.pid"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
