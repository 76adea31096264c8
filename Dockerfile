# commplan service. Build: docker build -t commplan .   Run: docker run -p 8000:8000 --memory 2560m commplan
# The base image is pinned by digest (python:3.11-slim, linux/amd64 + arm64 index; docs/hardening.md says
# where the digest comes from and how to refresh it); the runtime dependencies by constraints.txt.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${PYTHON_IMAGE}

# Workers: one process each, ~80 MiB idle; each computes COMMPLAN_WORK_SLOTS requests at once, budget about
# (80 + slots x 500) MiB per worker (docs/hardening.md): 2 workers x 2 slots = 2,160 MiB, so
# `docker run --memory 2560m` (the README's command); 4 workers: -e COMMPLAN_WORKERS=4 --memory 5g. Each worker
# computes in COMMPLAN_WORKER_PROCESSES pool processes (app/runner.py), set here as the slots are: the CPU count
# Python sees is the host's, not the container's.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    COMMPLAN_WORKERS=2 \
    COMMPLAN_WORK_SLOTS=2 \
    COMMPLAN_WORKER_PROCESSES=2

WORKDIR /srv
# Dependencies first, in their own layer: constraints.txt pins exactly the runtime closure, so a code change
# reuses this layer and only the project itself is reinstalled below (--no-deps).
COPY constraints.txt ./
RUN pip install --no-cache-dir -r constraints.txt \
 && useradd --create-home --uid 10001 commplan
COPY pyproject.toml README.md ./
COPY app ./app
COPY planner ./planner
COPY collectives ./collectives
COPY frontend ./frontend
RUN pip install --no-cache-dir --no-deps .
USER commplan

EXPOSE 8000
# /healthz is answered on the event loop, never behind the work: p99 under 0.2 s in the 32-client load
# test (tests/app/test_load.py), so 5 s holds under load with a wide margin.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"
# `commplan serve` applies the header deadline, keep-alive timeout and connection limit (app/cli.py);
# it imports app.main from /srv (its working directory), next to frontend/
CMD ["sh", "-c", "exec commplan serve --host 0.0.0.0 --port 8000 --workers ${COMMPLAN_WORKERS}"]
