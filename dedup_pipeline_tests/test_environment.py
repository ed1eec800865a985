"""The environment is read in one place (dedup_pipeline.environment), and that place names every variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dedup_pipeline
from dedup_pipeline import environment
from dedup_pipeline.core.errors import ConfigurationError

PACKAGE = Path(dedup_pipeline.__file__).parent


def test_only_the_environment_module_reads_the_environment():
    readers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "environment.py" and re.search(r"\bos\.(environ|getenv|putenv)\b|\bgetenv\(", path.read_text())
    )
    assert readers == []


def test_its_docstring_lists_every_variable_the_package_names():
    named = {name for path in PACKAGE.rglob("*.py") for name in re.findall(r"\bDEDUP_[A-Z_]+\b", path.read_text())}
    listed = set(re.findall(r"``(DEDUP_[A-Z_]+)``", environment.__doc__))
    assert named - {"DEDUP_"} <= listed | {"DEDUP_TEST_PG_URL"}


def test_unset_and_blank_variables_take_their_defaults(monkeypatch):
    for name in (environment.CELERY_QUEUE_ENV, environment.URL_PREFIX_ENV, environment.ERASURE_RUN_RETENTION_ENV):
        monkeypatch.setenv(name, "")
    assert (environment.celery_queue(), environment.url_prefix(), environment.erasure_run_hours()) == (
        "dagster",
        "dedup:url",
        24,
    )
    monkeypatch.setenv(environment.RETENTION_DAYS_ENV["history_days"], " ")
    assert environment.retention_days("history_days") is None
    monkeypatch.setenv(environment.REDIS_PREFIX_ENV, "")  # set but empty: no prefix, as it always was
    assert environment.redis_prefix() == ""


def test_a_malformed_number_names_its_variable(monkeypatch):
    monkeypatch.setenv(environment.ERASURE_RUN_RETENTION_ENV, "a day")
    with pytest.raises(ConfigurationError, match="DEDUP_ERASURE_RUN_RETENTION_HOURS must be a whole number of hours"):
        environment.erasure_run_hours()
    monkeypatch.setenv(environment.SEEN_TTL_ENV, "0")
    with pytest.raises(ConfigurationError, match="DEDUP_SEEN_TTL_SECONDS"):
        environment.seen_ttl_seconds()
    assert environment.seen_ttl_seconds(60) == 60  # a value given wins over the variable
