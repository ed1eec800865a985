"""The resources name the environment variables their values come from (`dg.EnvVar`), keeping the defaults."""

from __future__ import annotations

import dagster as dg

from dedup_pipeline.defs.resources import default_resources


def test_set_variables_become_env_vars_the_launchpad_names_and_unset_ones_keep_the_defaults(tmp_path, monkeypatch):
    """Breaks: the resources read the environment inside their methods, so the launchpad never showed where a
    value came from."""
    for name in ("DEDUP_DATABASE_URL", "DEDUP_LANDING_DIR", "DEDUP_REDIS_URL", "DEDUP_SEEN_TTL_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    unset = default_resources()
    assert unset["warehouse"].database_url is None and unset["landing"].folder is None
    assert unset["seen_set"].redis_url is None and unset["seen_set"].ttl_seconds is None

    url = f"sqlite:///{tmp_path / 'w.sqlite'}"
    monkeypatch.setenv("DEDUP_DATABASE_URL", url)
    monkeypatch.setenv("DEDUP_LANDING_DIR", str(tmp_path / "in"))
    monkeypatch.setenv("DEDUP_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("DEDUP_SEEN_TTL_SECONDS", "3600")
    resources = default_resources()
    named = {
        (key, field): getattr(resources[key], field).env_var_name
        for key, field in [
            ("warehouse", "database_url"),
            ("landing", "folder"),
            ("seen_set", "redis_url"),
            ("seen_set", "ttl_seconds"),
        ]
    }
    assert named == {
        ("warehouse", "database_url"): "DEDUP_DATABASE_URL",
        ("landing", "folder"): "DEDUP_LANDING_DIR",
        ("seen_set", "redis_url"): "DEDUP_REDIS_URL",
        ("seen_set", "ttl_seconds"): "DEDUP_SEEN_TTL_SECONDS",
    }
    with dg.build_resources({k: resources[k] for k in ("warehouse", "landing", "seen_set")}) as built:
        assert str(built.warehouse.get().engine.url) == url
        assert built.landing.path() == (tmp_path / "in").resolve()
        assert built.seen_set.ttl_seconds == 3600 and built.seen_set.redis_url == "redis://127.0.0.1:6379/0"
