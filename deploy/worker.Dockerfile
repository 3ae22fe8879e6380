# syntax=docker/dockerfile:1
# The worker: `tokenfront serve`, the package with its `worker` extra (torch, gguf, accelerate, xgrammar).
#
# Build from the repository root:
#   docker build -f deploy/worker.Dockerfile -t tokenfront-worker:0.1.0 .
# torch comes from TORCH_INDEX_URL, PyTorch's CPU-only index by default (a few hundred MB instead of the
# CUDA wheels' several GB). For NVIDIA GPUs point it at an index with a CUDA build of the same torch version
# (PyPI's own Linux x86_64 torch wheels are CUDA builds), e.g.
#   docker build -f deploy/worker.Dockerfile --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#     -t tokenfront-worker:0.1.0-cuda .
# The CUDA wheels carry their CUDA runtime libraries, so the slim base stays; the node needs the NVIDIA
# driver and device plugin, and the pod `nvidia.com/gpu` and `--device cuda` (docs/deployment.md).

# Python 3.11: the version the project's test suite runs on.
FROM python:3.11-slim AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The version pyproject.toml pins in the `worker` extra (tests/test_deploy.py checks they agree).
ARG TORCH_VERSION=2.13.0
# gcc compiles the render hot path into the wheel (setup.py, mypyc); only this stage has it, the image does not.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
# torch first, from the chosen index; the `worker` extra's pin is then already satisfied.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
RUN /opt/venv/bin/pip install --no-cache-dir ".[worker]"

FROM python:3.11-slim
# A fixed numeric uid, so Kubernetes' `runAsNonRoot` can verify it without reading /etc/passwd.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tokenfront
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /home/tokenfront
EXPOSE 8000
# No HEALTHCHECK: Kubernetes ignores it; the manifests probe GET /health, which answers without an API key.
ENTRYPOINT ["tokenfront", "serve"]
# --host 0.0.0.0: the command's default (127.0.0.1) is unreachable from outside the container.
CMD ["--model", "/model", "--host", "0.0.0.0", "--port", "8000"]
