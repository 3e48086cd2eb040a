# A Node sandbox image with checkpointd inside: the single executable (no Python
# needed, glibc >= 2.31) beside the agent. Build from the repository root after
# `make wheel binary`:
#
#   docker build -f deploy/docker/node-sandbox.Dockerfile -t agent-sandbox .
#
# On Alpine (node:22-alpine) install the musllinux wheel with Alpine's python3
# instead: the executable needs glibc.
FROM node:22-bookworm-slim
COPY dist/checkpointd /usr/local/bin/checkpointd
# The image's own unprivileged user (node, uid 1000) runs the agent and the daemon.
RUN mkdir -p /workspace /var/lib/checkpointd \
 && chown node:node /workspace /var/lib/checkpointd \
 && chmod 0700 /var/lib/checkpointd
USER 1000:1000
ENV CHECKPOINTD_DATA_DIR=/var/lib/checkpointd
VOLUME ["/workspace", "/var/lib/checkpointd"]
HEALTHCHECK --interval=10s --timeout=5s CMD ["checkpointd", "health"]
# The agent's own process is started beside it by the image's entry point or the
# orchestrator; here the daemon alone, restoring the thread and capturing each minute.
# For TCP (an orchestrator in another container) add --listen tcp://0.0.0.0:50051,
# pass CHECKPOINTD_TOKEN as a secret and EXPOSE 50051.
CMD ["checkpointd", "serve", "--workspace", "/workspace", \
     "--thread", "sandbox", "--restore-on-start", "--capture-every", "60s"]
