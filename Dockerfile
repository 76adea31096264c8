# commplan service. Build: docker build -t commplan .   Run: docker run -p 8000:8000 commplan
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    COMMPLAN_WORKERS=2

WORKDIR /srv
COPY pyproject.toml README.md ./
COPY app ./app
COPY planner ./planner
COPY collectives ./collectives
COPY frontend ./frontend
RUN pip install --no-cache-dir . \
 && useradd --create-home --uid 10001 commplan
USER commplan

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=15s --retries=3 \
  CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"
# uvicorn imports app.main from /srv (its working directory), next to frontend/
CMD ["sh", "-c", "exec uvicorn app.main:app --host 0.0.0.0 --port 8000 --workers ${COMMPLAN_WORKERS}"]
