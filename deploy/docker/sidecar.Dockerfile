# The checkpointd daemon alone, from the manylinux wheel: the sidecar container of
# a pod (deploy/kubernetes/sidecar-pod.yaml) or of a compose file. Build from the
# repository root after `make wheel`:
#
#   docker build -f deploy/docker/sidecar.Dockerfile -t checkpointd:0.1.0 .
#
# It runs as uid 1000, the agent's uid, which owns the workspace files; it needs no
# capability and writes only to its two volumes (and /tmp), so it runs on a
# read-only root filesystem.
FROM python:3.12-slim-bookworm
COPY dist/checkpointd-*-manylinux2014_x86_64*.whl /tmp/
RUN pip install --no-cache-dir /tmp/checkpointd-*.whl \
 && rm /tmp/checkpointd-*.whl \
 && useradd --uid 1000 --user-group --no-create-home --home-dir /nonexistent checkpointd \
 && mkdir -p /workspace /var/lib/checkpointd \
 && chown 1000:1000 /workspace /var/lib/checkpointd \
 && chmod 0700 /var/lib/checkpointd
USER 1000:1000
# The data dir (stat cache, owner id, socket, and the embedded store) stays out of
# the workspace, on a volume of its own.
ENV CHECKPOINTD_DATA_DIR=/var/lib/checkpointd \
    PYTHONDONTWRITEBYTECODE=1
VOLUME ["/workspace", "/var/lib/checkpointd"]
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s CMD ["checkpointd", "health"]
ENTRYPOINT ["checkpointd"]
CMD ["serve", "--workspace", "/workspace"]
