# syntax=docker/dockerfile:1
# The GPU worker image: the official PyTorch CUDA runtime image (torch, torchrun, CUDA, cuDNN, NCCL)
# plus the project. Its torch is the one pyproject pins (2.13.0) and is never replaced: pip sees it
# pinned as installed (see docker/runtime_requirements.py) and the build checks it afterwards.
# Build from the repository root:  docker build -f docker/worker.Dockerfile -t twinkle-jobs-worker .
# cuda12.6 runs on drivers >= 560; on a host with an older driver pick a base with an older CUDA.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
FROM ${BASE_IMAGE}

ARG TWINKLE_UID=10001

# `utility` makes the NVIDIA runtime mount nvidia-smi, which the worker uses to discover its GPUs.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TWINKLE_DATA_DIR=/data \
    HF_HOME=/data/hf-cache \
    TWINKLE_HUB_CACHE=/data/hub-cache \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Dependencies in their own layer (with the `trackers` extra: training.report_to must work out of
# the box, and the server refuses a tracker whose library it lacks), torch pinned to the base image's build. The final check fails
# the build if that torch lost CUDA or changed version (e.g. a dependency forced a reinstall).
COPY pyproject.toml docker/runtime_requirements.py /tmp/build/
RUN torch_before="$(python -c 'import torch; print(torch.__version__)')" \
    && python /tmp/build/runtime_requirements.py /tmp/build/pyproject.toml --keep-installed torch --extra trackers \
        > /tmp/build/requirements.txt \
    && pip install --no-cache-dir -r /tmp/build/requirements.txt \
    && python -c "import sys, torch; sys.exit(0 if torch.version.cuda and torch.__version__ == sys.argv[1] else \
        f'torch changed: {sys.argv[1]} -> {torch.__version__} (cuda {torch.version.cuda})')" "$torch_before" \
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

# Numeric, so that a runtime (Kubernetes runAsNonRoot) can verify it is not root.
USER ${TWINKLE_UID}:${TWINKLE_UID}

# Healthy = a live worker process in this container heartbeats in the workers table (see
# docker/healthcheck.py for why this and not `celery inspect ping`). The start period covers
# CUDA initialisation and the first registration.
HEALTHCHECK --interval=30s --timeout=15s --start-period=120s --retries=3 \
    CMD ["twinkle-healthcheck", "worker"]

ENTRYPOINT ["twinkle-entrypoint"]
CMD ["twinkle-jobs", "worker"]
