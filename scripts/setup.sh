#!/usr/bin/env bash
# Create .venv and install the project from the repo's own files.
#   scripts/setup.sh          the service and the training library (enough for `twinkle-jobs demo`)
#   scripts/setup.sh --test   also the test tools, the optional Ray and tracker groups and, where apt is usable,
#                             Debian's Chromium for the dashboard's browser tests
# torch is installed first at the pinned version: on the project's CPU machines pip takes the
# wheel that lies on disk; an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WITH_TESTS=0
[ "${1:-}" = "--test" ] && WITH_TESTS=1

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
if [ "$WITH_TESTS" = 1 ]; then
  .venv/bin/python -m pip install -q -e ".[dev,ray,trackers]"
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else
      echo "note: /usr/bin/chromium is missing; the dashboard's browser tests will be skipped" >&2
    fi
  fi
else
  .venv/bin/python -m pip install -q -e .
fi
echo "set-up done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
