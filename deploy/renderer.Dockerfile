# syntax=docker/dockerfile:1
# The CPU tier: `tokenfront render` by default, and `tokenfront route` from the same image (the router's
# manifest sets `command`). The package is installed without its `worker` extra, so the image has no torch:
# the renderer and the router never import it (tests/test_layering.py, tests/renderer/test_no_torch.py).
#
# Build from the repository root (the context .dockerignore keeps small):
#   docker build -f deploy/renderer.Dockerfile -t tokenfront-renderer:0.1.0 .
# Run on a checkpoint folder (tokenizer, config and template files are enough; no weights are read):
#   docker run -p 8100:8100 -v /models/Qwen3-0.6B:/model:ro tokenfront-renderer:0.1.0

# Python 3.11: the version the project's test suite runs on.
FROM python:3.11-slim AS build
# gcc compiles the render hot path into the wheel (setup.py, mypyc); only this stage has it, the image does not.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# `.`, never `.[worker]`: no torch, gguf, accelerate or xgrammar in this image.
RUN /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim
# A fixed numeric uid, so Kubernetes' `runAsNonRoot` can verify it without reading /etc/passwd.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tokenfront
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /home/tokenfront
EXPOSE 8100
# No HEALTHCHECK: Kubernetes ignores it; the manifests probe GET /health, which answers without an API key.
ENTRYPOINT ["tokenfront", "render"]
# --host 0.0.0.0: the command's default (127.0.0.1) is unreachable from outside the container.
CMD ["--model", "/model", "--host", "0.0.0.0", "--port", "8100"]
