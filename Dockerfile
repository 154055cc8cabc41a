# One image for every Gangway service; the compose file picks the module to run.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app

# Dependencies first, so that a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p schemas core services gangway \
    && touch schemas/__init__.py core/__init__.py services/__init__.py gangway/__init__.py \
    && pip install . \
    && pip uninstall -y gangway

COPY schemas ./schemas
COPY core ./core
COPY services ./services
COPY gangway ./gangway
RUN pip install --no-deps .

# The code stays root-owned and read-only to the services; what they write (the API's admin
# token, the agents' rank directories and logs, checkpoints, faults) lives under
# /var/lib/gangway, owned by the service user (a named volume mounted there starts with it).
RUN useradd --system --uid 10001 --home-dir /var/lib/gangway gangway \
    && mkdir -p /var/lib/gangway/api /var/lib/gangway/agent /var/lib/gangway/checkpoints \
        /var/lib/gangway/faults \
    && chown -R gangway /var/lib/gangway
ENV GANGWAY_ADMIN_TOKEN_FILE=/var/lib/gangway/api/admin.token \
    GANGWAY_WORK_DIR=/var/lib/gangway/agent \
    GANGWAY_LOGS_DIR=/var/lib/gangway/agent \
    GANGWAY_CHECKPOINT_ROOT=/var/lib/gangway/checkpoints \
    GANGWAY_FAULT_DIR=/var/lib/gangway/faults
USER gangway
WORKDIR /var/lib/gangway

# Overridden per service in docker-compose.yml.
CMD ["python", "-m", "services.api"]
