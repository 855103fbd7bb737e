# One image for every Tessera service; the command picks it: gateway, scheduler, worker, finalizer,
# web.
#   docker build -t tessera .
#   docker run --rm -e TESSERA_NATS_URL=... -e TESSERA_DATABASE_URL=... tessera worker
# Validated by tests/deploy/test_files.py; not built here (no Docker engine in CI).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/tessera/numba

RUN groupadd --system --gid 10001 tessera \
 && useradd --system --uid 10001 --gid tessera --home-dir /home/tessera --create-home tessera

WORKDIR /opt/tessera
# Dependencies first (their layer survives code changes), then the code. The services need the
# render extra (numba, numpy, asyncpg, ...): plain `pip install .` is only the client.
COPY pyproject.toml README.md ./
RUN mkdir services shared kernel proto \
 && touch services/__init__.py shared/__init__.py kernel/__init__.py proto/__init__.py \
 && pip install '.[render]' && pip uninstall --yes tessera
COPY services ./services
COPY shared ./shared
COPY kernel ./kernel
COPY proto ./proto
RUN pip install --no-deps . && rm -rf build

# Compile the numba kernel now (several seconds) so no container pays for it at start-up.
COPY deploy/warm_numba.py /tmp/warm_numba.py
RUN mkdir -p "$NUMBA_CACHE_DIR" \
 && python /tmp/warm_numba.py \
 && rm /tmp/warm_numba.py \
 && chown -R tessera:tessera /var/cache/tessera

USER tessera:tessera
WORKDIR /home/tessera
# TESSERA_METRICS_PORT serves /metrics, /healthz and /readyz.
ENV TESSERA_METRICS_PORT=9090
EXPOSE 9090
ENTRYPOINT ["tessera"]
CMD ["worker"]
