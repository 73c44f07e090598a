# syntax=docker/dockerfile:1
# The API server image (also runs `migrate` and `beat` in docker-compose.yml). CPU-only: the server
# never trains, it only imports the project, so it takes torch's CPU wheel (~200 MB, not ~3 GB).
# Build from the repository root:  docker build -f docker/server.Dockerfile -t twinkle-jobs-server .
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TWINKLE_UID=10001

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TWINKLE_DATA_DIR=/data \
    HF_HOME=/data/hf-cache \
    TWINKLE_HUB_CACHE=/data/hub-cache

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# torch first, from the CPU index, at the version pyproject pins; the requirements step below then
# pins it as installed so no other dependency can pull a CUDA build from PyPI.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu

# Dependencies in their own layer (with the `trackers` extra: training.report_to must work out of
# the box, and the server refuses a tracker whose library it lacks): built from pyproject.toml alone, so a code change reuses it.
COPY pyproject.toml docker/runtime_requirements.py /tmp/build/
RUN python /tmp/build/runtime_requirements.py /tmp/build/pyproject.toml --keep-installed torch --extra trackers \
        > /tmp/build/requirements.txt \
    && pip install --no-cache-dir -r /tmp/build/requirements.txt \
    && rm -rf /tmp/build

# A plain (non-editable) install: the wheel carries the migrations package, and pip compiles the
# bytecode into site-packages as root (the non-root user could not write __pycache__ later).
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps /app \
    && install -m 0755 docker/entrypoint.sh /usr/local/bin/twinkle-entrypoint \
    && install -m 0755 docker/healthcheck.py /usr/local/bin/twinkle-healthcheck \
    && groupadd --gid "${TWINKLE_UID}" twinkle \
    && useradd --uid "${TWINKLE_UID}" --gid "${TWINKLE_UID}" --create-home --shell /usr/sbin/nologin twinkle \
    && mkdir -p /data/jobs \
    && chown -R twinkle:twinkle /data

# A named volume mounted on /data starts as a copy of this directory, owned by twinkle.
# Numeric, so that a runtime (Kubernetes runAsNonRoot) can verify it is not root.
USER ${TWINKLE_UID}:${TWINKLE_UID}
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["twinkle-healthcheck", "server"]

ENTRYPOINT ["twinkle-entrypoint"]
CMD ["twinkle-jobs", "server", "--host", "0.0.0.0", "--port", "8000"]
