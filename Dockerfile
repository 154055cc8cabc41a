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

RUN useradd --system --uid 10001 gangway
USER gangway

# Overridden per service in docker-compose.yml.
CMD ["python", "-m", "services.api"]
