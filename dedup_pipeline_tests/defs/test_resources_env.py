"""The resources name the environment variables their values come from (`dg.EnvVar`), keeping the defaults."""

from __future__ import annotations

import secrets

import dagster as dg
from dagster._core.remote_representation.external_data import RepositorySnap, ResourceConfigEnvVarSnap

from dedup_pipeline.core.erasure import key_id
from dedup_pipeline.defs.resources import default_resources
from dedup_pipeline.store.tombstones import tombstone_key

FIELDS = {
    ("warehouse", "database_url"): "DEDUP_DATABASE_URL",
    ("warehouse", "tombstone_key"): "DEDUP_TOMBSTONE_KEY",
    ("landing", "folder"): "DEDUP_LANDING_DIR",
    ("seen_set", "redis_url"): "DEDUP_REDIS_URL",
    ("seen_set", "ttl_seconds"): "DEDUP_SEEN_TTL_SECONDS",
}


def test_set_variables_become_env_vars_the_launchpad_names_and_unset_ones_keep_the_defaults(tmp_path, monkeypatch):
    """Breaks: the resources read the environment inside their methods, so the launchpad never showed where a
    value came from (the tombstone key was read by the store itself)."""
    for name in FIELDS.values():
        monkeypatch.delenv(name, raising=False)
    unset = default_resources()
    assert all(getattr(unset[key], field) is None for key, field in FIELDS)

    url = f"sqlite:///{tmp_path / 'w.sqlite'}"
    key = secrets.token_hex(32)
    monkeypatch.setenv("DEDUP_DATABASE_URL", url)
    monkeypatch.setenv("DEDUP_TOMBSTONE_KEY", key)
    monkeypatch.setenv("DEDUP_LANDING_DIR", str(tmp_path / "in"))
    monkeypatch.setenv("DEDUP_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("DEDUP_SEEN_TTL_SECONDS", "3600")
    resources = default_resources()
    assert {(k, f): getattr(resources[k], f).env_var_name for k, f in FIELDS} == FIELDS
    with dg.build_resources({k: resources[k] for k in ("warehouse", "landing", "seen_set")}) as built:
        assert str(built.warehouse.get().engine.url) == url
        assert built.landing.path() == (tmp_path / "in").resolve()
        assert built.seen_set.ttl_seconds == 3600 and built.seen_set.redis_url == "redis://127.0.0.1:6379/0"
        monkeypatch.delenv("DEDUP_TOMBSTONE_KEY")  # the warehouse holds the key it was given, not the variable
        with built.warehouse.get().engine.connect() as conn:
            assert key_id(tombstone_key(conn)) == key_id(key.encode())
        assert key not in repr(built.warehouse)  # a secret: not in the resource's repr either


def test_the_resource_page_shows_the_tombstone_keys_variable_never_its_value(monkeypatch):
    """What the UI's resource page reads (the code location's snapshot): the variable's name, not the secret."""
    key = secrets.token_hex(32)
    monkeypatch.setenv("DEDUP_TOMBSTONE_KEY", key)
    repository = dg.Definitions(resources=default_resources()).get_repository_def()
    snap = RepositorySnap.from_def(repository)
    [warehouse] = [resource for resource in snap.resources if resource.name == "warehouse"]
    assert warehouse.configured_values["tombstone_key"] == ResourceConfigEnvVarSnap(name="DEDUP_TOMBSTONE_KEY")
    assert key not in dg.serialize_value(snap)
