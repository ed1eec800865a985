"""Every environment variable the pipeline reads: its name, its default and how it is parsed, in this one module.

Nothing else in the package reads `os.environ`; each variable has one function here, and its callers pass
the value on. A setting that the Dagster resources or a settings dataclass also hold keeps its default
there, and the function here returns None when the variable is unset (noted "the setting's default").

| variable | unset means | function |
|---|---|---|
| ``DEDUP_DATABASE_URL`` | a SQLite file in the data folder | `database_url` |
| ``DEDUP_DATA_DIR`` | ``./.dedup`` (the embedded default's files) | `data_dir` |
| ``DEDUP_LANDING_DIR`` | ``landing`` in the data folder | `landing_dir` |
| ``DEDUP_REDIS_URL`` | no Redis: the Bloom seen-set; `erase` clears no URL seen-set | `redis_url` |
| ``DEDUP_REDIS_PREFIX`` | ``dedup:seen`` (the seen-set's keys) | `redis_prefix` |
| ``DEDUP_URL_PREFIX`` | ``dedup:url`` (the crawlers' URL seen-set's keys) | `url_prefix` |
| ``DEDUP_SEEN_TTL_SECONDS`` | 30 days (2,592,000 s) | `seen_ttl_seconds` |
| ``DEDUP_BLOOM_CAPACITY`` | 10,000,000 digests | `bloom_capacity` |
| ``DEDUP_BLOOM_ERROR_RATE`` | 0.001 | `bloom_error_rate` |
| ``DEDUP_TOMBSTONE_KEY`` | a key file beside a SQLite warehouse (PostgreSQL: an error) | `tombstone_key` |
| ``DEDUP_AUTOMATION`` | off (``1``, ``on``, ``true``, ``yes`` turn it on) | `automation_enabled` |
| ``DEDUP_ON_CHANGED`` | the `ladder` resource's `on_changed` default (``upsert``) | `resource_variables` |
| ``DEDUP_CELERY_BROKER_URL`` | ``pyamqp://guest@127.0.0.1:5672//`` | `celery_broker_url` |
| ``DEDUP_CELERY_BACKEND_URL`` | ``rpc://`` | `celery_backend_url` |
| ``DEDUP_CELERY_QUEUE`` | ``dagster`` | `celery_queue` |
| ``DEDUP_ERASURE_RUN_RETENTION_HOURS`` | 24 | `erasure_run_hours` |
| ``DEDUP_DECISION_RETENTION_DAYS`` | the setting's default (`RetentionSettings`, 90) | `retention_days` |
| ``DEDUP_HISTORY_RETENTION_DAYS`` | the setting's default (365) | `retention_days` |
| ``DEDUP_STAGING_RETENTION_DAYS`` | the setting's default (30) | `retention_days` |
| ``DEDUP_QUARANTINE_RETENTION_DAYS`` | the setting's default (30) | `retention_days` |

Read here too, though not ours: ``DAGSTER_HOME`` (`dagster_home`), libpq's ``PGOPTIONS`` and
``PGCONNECT_TIMEOUT`` (`libpq_setting`); and set, for Great Expectations, ``GX_ANALYTICS_ENABLED``
(`quiet_great_expectations`). The tests and benchmarks read ``DEDUP_TEST_PG_URL`` (the PostgreSQL server
they make scratch databases on, `dedup_pipeline_tests.helpers`).
"""

from __future__ import annotations

import os
from pathlib import Path

from dedup_pipeline.core.errors import ConfigurationError

DATABASE_URL_ENV = "DEDUP_DATABASE_URL"
DATA_DIR_ENV = "DEDUP_DATA_DIR"
LANDING_DIR_ENV = "DEDUP_LANDING_DIR"
REDIS_URL_ENV = "DEDUP_REDIS_URL"
REDIS_PREFIX_ENV = "DEDUP_REDIS_PREFIX"  # one per warehouse when several share a Redis
URL_PREFIX_ENV = "DEDUP_URL_PREFIX"  # the URL seen-set's key prefix, one per crawl fleet when several share a Redis
SEEN_TTL_ENV = "DEDUP_SEEN_TTL_SECONDS"
BLOOM_CAPACITY_ENV = "DEDUP_BLOOM_CAPACITY"
BLOOM_ERROR_RATE_ENV = "DEDUP_BLOOM_ERROR_RATE"
TOMBSTONE_KEY_ENV = "DEDUP_TOMBSTONE_KEY"
AUTOMATION_ENV = "DEDUP_AUTOMATION"
ON_CHANGED_ENV = "DEDUP_ON_CHANGED"  # the duplicate policy of every run of the deployment, CLI and sensors alike
CELERY_BROKER_ENV = "DEDUP_CELERY_BROKER_URL"
CELERY_BACKEND_ENV = "DEDUP_CELERY_BACKEND_URL"
CELERY_QUEUE_ENV = "DEDUP_CELERY_QUEUE"
ERASURE_RUN_RETENTION_ENV = "DEDUP_ERASURE_RUN_RETENTION_HOURS"
#: The retention settings (`RetentionSettings` fields) and the variable of each.
RETENTION_DAYS_ENV = {
    "decision_days": "DEDUP_DECISION_RETENTION_DAYS",
    "history_days": "DEDUP_HISTORY_RETENTION_DAYS",
    "staging_days": "DEDUP_STAGING_RETENTION_DAYS",
    "quarantine_days": "DEDUP_QUARANTINE_RETENTION_DAYS",
}
#: Days each retention setting keeps its rows when its variable is unset (0 = forever).
DEFAULT_RETENTION_DAYS = {"decision_days": 90, "history_days": 365, "staging_days": 30, "quarantine_days": 30}

DEFAULT_REDIS_PREFIX = "dedup:seen"
DEFAULT_URL_PREFIX = "dedup:url"
DEFAULT_TTL_SECONDS = 30 * 86400  # the seeds' 30 days: about one re-crawl cycle
DEFAULT_BLOOM_CAPACITY = 10_000_000
DEFAULT_BLOOM_ERROR_RATE = 0.001
DEFAULT_CELERY_BROKER = "pyamqp://guest@127.0.0.1:5672//"
DEFAULT_CELERY_BACKEND = "rpc://"
DEFAULT_CELERY_QUEUE = "dagster"  # the queue dagster-celery workers listen on
DEFAULT_ERASURE_RUN_HOURS = 24
_TRUE = ("1", "on", "true", "yes")


def _set(name: str) -> str | None:
    """The variable's value, None when it is unset or empty."""
    return os.environ.get(name) or None


def _whole_number(name: str, unit: str) -> int | None:
    """The variable as a whole number, 0 or more (surrounding blanks ignored), None when unset or blank."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < 0:
        raise ConfigurationError(f"{name} must be a whole number of {unit}, 0 or more (0 keeps forever), got {raw!r}")
    return value


def resource_variables() -> dict[str, str]:
    """Which of the variables the Dagster resources take as `dg.EnvVar` are set: resource field -> variable.

    Only a set variable becomes an `EnvVar` (Dagster refuses an unset one), so an unset one keeps the field's
    default (the embedded warehouse, `.dedup/landing`, no Redis, 30 days, the embedded warehouse's key file), as
    before.
    """
    fields = {
        "warehouse.database_url": DATABASE_URL_ENV,
        "warehouse.tombstone_key": TOMBSTONE_KEY_ENV,
        "landing.folder": LANDING_DIR_ENV,
        "seen_set.redis_url": REDIS_URL_ENV,
        "seen_set.ttl_seconds": SEEN_TTL_ENV,
        "ladder.on_changed": ON_CHANGED_ENV,
    }
    return {field: name for field, name in fields.items() if _set(name)}


def database_url() -> str | None:
    """$DEDUP_DATABASE_URL: the warehouse's SQLAlchemy URL (None: the embedded SQLite warehouse)."""
    return _set(DATABASE_URL_ENV)


def data_dir() -> Path:
    """Where the embedded default keeps its files: $DEDUP_DATA_DIR, else ./.dedup."""
    return Path(_set(DATA_DIR_ENV) or Path.cwd() / ".dedup").resolve()


def landing_dir() -> Path:
    """$DEDUP_LANDING_DIR, else the `landing` folder of the data folder."""
    return Path(_set(LANDING_DIR_ENV) or data_dir() / "landing").resolve()


def redis_url() -> str | None:
    """$DEDUP_REDIS_URL: the Redis of the seen-sets (None: no Redis)."""
    return _set(REDIS_URL_ENV)


def redis_prefix() -> str:
    """$DEDUP_REDIS_PREFIX (set but empty means no prefix), else `dedup:seen`: the seen-set's key prefix."""
    return os.environ.get(REDIS_PREFIX_ENV, DEFAULT_REDIS_PREFIX)


def url_prefix() -> str:
    """$DEDUP_URL_PREFIX, else `dedup:url`: the key prefix of the crawlers' URL seen-set."""
    return _set(URL_PREFIX_ENV) or DEFAULT_URL_PREFIX


def seen_ttl_seconds(value: int | str | None = None) -> int:
    """The TTL of seen-set keys, in seconds: `value`, else $DEDUP_SEEN_TTL_SECONDS, else 30 days.

    At least 1: a seen-set key always expires (the set is never an unbounded store of identifiers), and Redis
    refuses `EX 0`, which would make every URL look new.
    """
    raw = value if value not in (None, "") else _set(SEEN_TTL_ENV) or DEFAULT_TTL_SECONDS
    try:
        ttl = int(raw)
    except (TypeError, ValueError):
        ttl = 0
    if ttl < 1:
        raise ConfigurationError(f"{SEEN_TTL_ENV} must be a whole number of seconds, at least 1, got {raw!r}")
    return ttl


def bloom_capacity() -> int:
    """$DEDUP_BLOOM_CAPACITY, else 10,000,000: the digests a Bloom seen-set is sized for, per hash version."""
    return int(os.environ.get(BLOOM_CAPACITY_ENV, DEFAULT_BLOOM_CAPACITY))


def bloom_error_rate() -> float:
    """$DEDUP_BLOOM_ERROR_RATE, else 0.001: a Bloom seen-set's false-positive rate at capacity."""
    return float(os.environ.get(BLOOM_ERROR_RATE_ENV, DEFAULT_BLOOM_ERROR_RATE))


def tombstone_key() -> str | None:
    """$DEDUP_TOMBSTONE_KEY: the secret the erasure tombstones are keyed with (checked by `store.tombstones`).

    The Dagster resources take it as a `dg.EnvVar` (`resource_variables`) and give it to the warehouse; the store
    reads it here only for a warehouse given none (the command line's).
    """
    return _set(TOMBSTONE_KEY_ENV)


def automation_enabled() -> bool:
    """$DEDUP_AUTOMATION is 1, on, true or yes: sensors and schedules start running."""
    return os.environ.get(AUTOMATION_ENV, "").lower() in _TRUE


def celery_broker_url() -> str:
    """$DEDUP_CELERY_BROKER_URL, else the local RabbitMQ."""
    return _set(CELERY_BROKER_ENV) or DEFAULT_CELERY_BROKER


def celery_backend_url() -> str:
    """$DEDUP_CELERY_BACKEND_URL, else `rpc://`."""
    return _set(CELERY_BACKEND_ENV) or DEFAULT_CELERY_BACKEND


def celery_queue() -> str:
    """$DEDUP_CELERY_QUEUE, else `dagster`."""
    return _set(CELERY_QUEUE_ENV) or DEFAULT_CELERY_QUEUE


def erasure_run_hours() -> int:
    """$DEDUP_ERASURE_RUN_RETENTION_HOURS, else 24: hours finished erase_subject runs are kept."""
    hours = _whole_number(ERASURE_RUN_RETENTION_ENV, "hours")
    return DEFAULT_ERASURE_RUN_HOURS if hours is None else hours


def retention_days(setting: str) -> int | None:
    """The variable of a retention setting (`RETENTION_DAYS_ENV`) in days; None when unset (the setting's default)."""
    return _whole_number(RETENTION_DAYS_ENV[setting], "days")


def dagster_home() -> str | None:
    """$DAGSTER_HOME: the Dagster instance's folder."""
    return _set("DAGSTER_HOME")


def use_dagster_home(folder: Path) -> None:
    """Make `folder` this process's (and its children's) Dagster instance."""
    os.environ["DAGSTER_HOME"] = str(folder)


def snapshot() -> dict[str, str]:
    """Every variable of this process, for a worker that must run in them (`adopt`)."""
    return dict(os.environ)


def adopt(variables: dict[str, str]) -> None:
    """Make `variables` (a `snapshot` of another process's) this process's, exactly."""
    if os.environ != variables:
        os.environ.clear()
        os.environ.update(variables)


def libpq_setting(name: str) -> str:
    """A libpq environment variable (`PGOPTIONS`, `PGCONNECT_TIMEOUT`), empty when unset."""
    return os.environ.get(name, "")


def quiet_great_expectations() -> None:
    """No usage statistics from Great Expectations, unless the operator chose otherwise."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
