#!/usr/bin/env bash
# The local base images the compose deployment builds on where Docker Hub cannot be reached (the tests, CI):
#
#   mjoin-local/python:3.11-bookworm   Debian bookworm (debootstrap, minbase) + its python3 (3.11), python3-venv
#                                      and ca-certificates: what docker/Dockerfile needs of python:3.11-slim-bookworm
#   mjoin-local/postgres:bookworm      that base + Debian's postgresql (15), started by docker/postgres/entrypoint.sh
#                                      with the environment contract of the public postgres image
#
#   bash docker/local-base.sh          # make what is missing (about 3 minutes), print the two names
#   bash docker/local-base.sh --force  # make them again
#
# Cached: an image is kept while its label org.mjoin.recipe (the hash of this script and docker/postgres/)
# matches. Debian's mirror: $DEBIAN_MIRROR (default http://deb.debian.org/debian). The CA certificates the
# build machine added (/usr/local/share/ca-certificates/*.crt, e.g. a proxy that intercepts TLS) are trusted in
# the base, and PIP_CERT points pip at the system bundle; nothing else of the machine goes in. Needs root
# (debootstrap), docker and debootstrap (apt-get install debootstrap). Builds use the host network.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${MJOIN_LOCAL_BASE:-mjoin-local/python:3.11-bookworm}
POSTGRES=${MJOIN_LOCAL_POSTGRES:-mjoin-local/postgres:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
FORCE=${1:-}
RECIPE=$(cat docker/local-base.sh docker/postgres/* | sha256sum | cut -c1-16)

current() {  # is image $1 there, made by this recipe?
    [ "$(docker image inspect -f '{{ index .Config.Labels "org.mjoin.recipe" }}' "$1" 2>/dev/null)" = "$RECIPE" ]
}

if [ "$FORCE" = --force ] || ! current "$BASE"; then
    command -v debootstrap >/dev/null || { echo "local-base: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
    root=$(mktemp -d /tmp/mjoin-base.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    echo "local-base: debootstrap bookworm into $root ($MIRROR)"
    t0=$SECONDS
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" \
        > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
    rm -f "$root.log"
    # the suites and the slim images' documentation filter (debian:bookworm-slim's), for every later apt-get
    cat > "$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
SOURCES
    cat > "$root/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
DPKG
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/tmp/*
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    tar -C "$root" --numeric-owner -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change "LABEL org.mjoin.recipe=$RECIPE" \
        --change 'CMD ["python3"]' - "$BASE" >/dev/null
    rm -rf "$root"
    trap - EXIT
    echo "local-base: $BASE made in $((SECONDS - t0)) s"
fi

if [ "$FORCE" = --force ] || ! current "$POSTGRES"; then
    t0=$SECONDS
    docker build --quiet --network host --build-arg "BASE_IMAGE=$BASE" --label "org.mjoin.recipe=$RECIPE" \
        -t "$POSTGRES" docker/postgres >/dev/null
    echo "local-base: $POSTGRES made in $((SECONDS - t0)) s"
fi
echo "MJOIN_BASE_IMAGE=$BASE"
echo "MJOIN_POSTGRES_IMAGE=$POSTGRES"
