"""Move a warehouse's keys to a new URL version (`url/1` -> `url/2`): `dedup-pipeline migrate-url`.

A warehouse made before `url/2` keeps `url/1` keys until this runs. In one
transaction, under the erasure lock (the rungs' chunks wait; an erasure
waits for it), it rewrites every row whose URL or URL key changes under the
target (userinfo dropped, IPv6 hosts compressed) with its digests, files a
row whose new key or digest another row already holds in `record_history`
(`superseded_by_batch_id` = ``migrate:url/2``; of two rows with one key the
newer version stays), rewrites the keys of history, the decision log and
staged rows, drops the userinfo of URLs in quarantined lines, and sets
`active_url_version`. It is audited in `hash_version_events` (action
``url-switch``). Idempotent: a second run finds nothing to change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import insert, select, update

from dedup_pipeline.core.clustering import DEFAULT_RULE
from dedup_pipeline.core.errors import ConfigurationError
from dedup_pipeline.core.hashing import compute_hashes
from dedup_pipeline.core.records import migrated_key
from dedup_pipeline.core.url import URL_VERSION, URL_VERSIONS, canonical_url
from dedup_pipeline.store import url_migration as store
from dedup_pipeline.store.schema import hash_version_events, settings
from dedup_pipeline.store.tombstones import lock_for_erasure
from dedup_pipeline.store.warehouse import ACTIVE_URL_VERSION, Warehouse, active_url_version, as_utc, utcnow


@dataclass(frozen=True)
class UrlMigrationReport:
    from_version: str
    to_version: str
    rows_rewritten: int
    rows_filed: int  # moved to record_history: their new key or digest was another row's
    rows_relabelled: int  # every current row now under the target (most keep their key as it was)
    history_rewritten: int
    decisions_rewritten: int
    staged_rewritten: int
    quarantine_redacted: int

    def as_metadata(self) -> dict:
        return asdict(self)


def _order(row) -> tuple:
    return (as_utc(row.last_landed_at), row.last_batch_id, row.last_line_no)


def migrate_url_version(
    warehouse: Warehouse,
    target: str = URL_VERSION,
    *,
    run_id: str | None = None,
    now: datetime | None = None,
    representative: str = DEFAULT_RULE,
) -> UrlMigrationReport:
    """Rewrite the warehouse's keys to URL version `target` and make it the active one (see the module docstring)."""
    if target not in URL_VERSIONS:
        raise ConfigurationError(f"unknown URL version {target!r}; known: {list(URL_VERSIONS)}")
    now = now or utcnow()
    tag = f"migrate:{target}"
    rewritten = filed = 0
    with warehouse.engine.begin() as conn:
        conn.execute(select(settings.c.value).where(settings.c.name == ACTIVE_URL_VERSION).with_for_update())
        lock_for_erasure(conn)
        source = active_url_version(conn)
        if URL_VERSIONS.index(target) < URL_VERSIONS.index(source):
            raise ConfigurationError(f"the warehouse is on {source}; a URL version is never moved back to {target}")
        gone: set[int] = set()
        for row in store.record_candidates(conn, target):
            if row.record_id in gone:
                continue
            key, url = migrated_key(row.natural_key, target), canonical_url(row.canonical_url, version=target)
            if (key, url) == (row.natural_key, row.canonical_url):
                continue
            holder = store.key_holder(conn, key, row.record_id)
            if holder is not None:  # the same page stored twice (with and without userinfo): the newer stays
                loser = row.record_id if _order(row) < _order(holder) else holder.record_id
                store.retire_row(conn, loser, tag, now, representative)
                gone.add(loser)
                filed += 1
                if loser == row.record_id:
                    continue
            payload = store.migrated_payload(row.payload, target)
            versions = sorted({row.hash_version, *store.stored_versions(conn, row.record_id)})
            digests, errors = compute_hashes(payload, versions)
            values = {"natural_key": key, "canonical_url": url, "url_version": target, "payload": payload}
            digest = digests.get(row.hash_version)
            if digest is not None:
                if store.digest_holder(conn, row.hash_version, bytes.fromhex(digest), row.record_id) is not None:
                    store.retire_row(conn, row.record_id, tag, now, representative)  # its content is another row's
                    gone.add(row.record_id)
                    filed += 1
                    continue
                values["content_hash"] = bytes.fromhex(digest)
            store.rewrite_record(conn, row.record_id, values, digests, errors)
            rewritten += 1
        report = UrlMigrationReport(
            source,
            target,
            rewritten,
            filed,
            store.set_url_version(conn, target),
            store.rewrite_history(conn, target),
            store.rewrite_decisions(conn, target),
            store.rewrite_staged(conn, target),
            store.redact_quarantine(conn),
        )
        conn.execute(update(settings).where(settings.c.name == ACTIVE_URL_VERSION).values(value=target, updated_at=now))
        conn.execute(
            insert(hash_version_events).values(
                action="url-switch",
                from_version=source,
                to_version=target,
                occurred_at=now,
                forced=False,
                run_id=run_id,
                details=report.as_metadata(),
            )
        )
    return report
