# syntax=docker/dockerfile:1
#
# kvwatch sidecar image.
#
#   docker build -t kvwatch:0.1.0 .
#
# No image is published: build it and push it to your registry (deploy/README.md). Dependencies install at the
# versions pinned in constraints.txt, so two builds of one commit hold the same code.
#   docker run --rm --read-only --tmpfs /tmp -p 9847:9847 kvwatch:0.1.0 \
#       --target http://host.docker.internal:8000/metrics
#
# Runs as UID:GID 65532:65532 (numeric, so the kubelet can verify runAsNonRoot) with a read-only root
# filesystem: all bytecode is compiled at build time and PYTHONDONTWRITEBYTECODE is set, so the only
# writable path it may touch is /tmp -- mount a tmpfs there (deploy/ mounts a memory emptyDir).
#
# tests/test_dockerfile.py runs this file's build-stage RUN steps verbatim in a fresh venv and starts the
# result as 65532:65532 on a read-only root with a tmpfs /tmp, so keep those steps portable: only
# "$VENV", "$WHEELHOUSE" and paths relative to WORKDIR.

ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# ---------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VENV=/opt/kvwatch \
    WHEELHOUSE=/tmp/wheelhouse

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY kvwatch/ kvwatch/

# Build the wheel, install it and its dependencies (at constraints.txt's versions) into a venv without pip, then
# compile every module to bytecode that never needs rewriting (unchecked-hash: valid whatever the file times
# become after COPY).
RUN python -m pip wheel --no-deps --wheel-dir "$WHEELHOUSE" . \
 && python -m venv --without-pip "$VENV" \
 && python -m pip --python "$VENV/bin/python" install --no-compile --constraint constraints.txt \
        "$WHEELHOUSE"/kvwatch-*.whl \
 && "$VENV/bin/python" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$VENV/lib" \
 && "$VENV/bin/kvwatch" --help >/dev/null

# ---------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=https://github.com/kvwatch/kvwatch

LABEL org.opencontainers.image.title="kvwatch" \
      org.opencontainers.image.description="Sidecar that scrapes vLLM /metrics, diagnoses KV-cache and queueing limits, and re-exports them for Prometheus" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# The base image's standard library, compiled the same way (a no-op for modules it already ships compiled
# in this mode), so that nothing is compiled, or written, at run time.
RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash /usr/local/lib

COPY --from=build /opt/kvwatch /opt/kvwatch

ENV PATH=/opt/kvwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp

USER 65532:65532
WORKDIR /tmp
EXPOSE 9847
ENTRYPOINT ["kvwatch"]
CMD ["run"]
