# The broker-jobs image: the package with the postgres extra, and the demo app
# (examples/demo) with the files compose/docker-compose.yml runs it with. Everything is
# installed at build time; nothing is downloaded when a container starts.
#
#   docker build -t broker-jobs .
#   docker run --rm broker-jobs broker-jobs --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The package first, so that a change to the examples does not reinstall it. tzdata:
# the IANA time zones for cron schedules, whatever the base image ships.
COPY pyproject.toml README.md ./
COPY broker_jobs broker_jobs
COPY topology topology
COPY scheduler scheduler
RUN pip install ".[postgres]" tzdata

# The app and what the compose services run from /app: --app examples.demo.tasks:app
# (imported from the working directory), --schedules compose/schedules.toml,
# python compose/publisher.py.
COPY examples examples
COPY compose/schedules.toml compose/publisher.py compose/

RUN useradd --system --uid 10001 --home-dir /app jobs
USER jobs

CMD ["broker-jobs", "--help"]
