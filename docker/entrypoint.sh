#!/bin/sh
# Entrypoint of the server and worker images. It fails early, with a message that says what to fix:
# - when .env still holds the placeholder secrets of .env.example (an admin token that anyone who
#   read the repository knows);
# - when the data volume is not writable by the image's non-root user (a bind mount of a
#   root-owned host directory is the usual cause).
# Then it runs the command (compose's init is PID 1 and reaps orphans).
set -eu

case "${TWINKLE_BOOTSTRAP_TOKEN:-} ${TWINKLE_DATABASE_URL:-}" in
  *change-me*)
    echo "twinkle-entrypoint: TWINKLE_BOOTSTRAP_TOKEN or TWINKLE_DATABASE_URL still holds a 'change-me'" >&2
    echo "  placeholder from .env.example. Set real secrets in .env (see docs/deploy.md)." >&2
    exit 1
    ;;
esac

data_dir="${TWINKLE_DATA_DIR:-/data}"
if ! mkdir -p "$data_dir" 2>/dev/null || [ ! -w "$data_dir" ]; then
  echo "twinkle-entrypoint: TWINKLE_DATA_DIR=$data_dir is not writable by uid $(id -u)." >&2
  echo "  Use the named volume from docker-compose.yml, or chown the host directory to $(id -u):$(id -g)." >&2
  exit 1
fi

exec "$@"
