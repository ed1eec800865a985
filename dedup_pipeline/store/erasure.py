"""Erasure in the warehouse: remove every copy of a subject in one transaction, and leave tombstones.

`erase` finds the subject's rows (current records, history, staged canonical
rows), follows their content digests to every other copy (the same content
under another URL or key is the same data), deletes them with everything
derived from them (hash rows of every version, the `near_index` row and its
pending mark, near-duplicate links; the clusters they were in are recomputed), deletes the
decision-log rows that name them (a natural key can itself be personal data)
and the quarantined lines that hold them, and writes tombstones: keyed
fingerprints (see `dedup_pipeline.core.erasure`) of the subject, of the
matched keys and canonical URLs, and of the erased contents' digests under
every registered hash version. It reports counts per table, never values (the digests and URLs it returns
go to the seen-sets only).

The rungs consult the tombstones through `dedup_pipeline.store.tombstones`,
which also holds the key and the lock that serialises erasure against ingestion.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import (
    JSON,
    Connection,
    String,
    and_,
    case,
    cast,
    delete,
    false,
    func,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy import column as sql_column
from sqlalchemy.dialects.postgresql import JSONB

from dedup_pipeline.core import erasure as core
from dedup_pipeline.core.clustering import DEFAULT_RULE
from dedup_pipeline.core.erasure import RawLineMatcher, Subject, SubjectKind
from dedup_pipeline.core.url import URL_VERSION
from dedup_pipeline.store import near_graph
from dedup_pipeline.store.bulk import chunked, delete_in
from dedup_pipeline.store.schema import (
    canonical_records,
    crawl_batches,
    dedup_decisions,
    erasure_requests,
    erasure_scopes,
    erasure_tombstones,
    metadata,
    near_duplicate_clusters,
    near_duplicate_links,
    near_index,
    quarantine,
    record_hashes,
    record_history,
    records,
    settings,
)
from dedup_pipeline.store.tombstones import (
    checked_key,
    existing_fingerprints,
    load_catalogue,
    lock_for_erasure,
    tombstone_key,
)
from dedup_pipeline.store.warehouse import upsert_ignore, utcnow

ERASED = "[erased]"
_QUARANTINE_PAGE = 1000
_MAX_ROUNDS = 20

#: Tables this module handles by name. Any other table of the schema with a `record_id`,
#: `natural_key` or (`hash_version`, `content_hash`) column is swept by those columns.
_HANDLED = {
    t.name
    for t in (
        records,
        record_hashes,
        record_history,
        dedup_decisions,
        quarantine,
        canonical_records,
        near_index,
        near_duplicate_links,
        near_duplicate_clusters,
        crawl_batches,
        settings,
        erasure_requests,
        erasure_tombstones,
        erasure_scopes,
    )
}


@dataclass
class ErasureResult:
    """What one erasure did. `removed` is rows per table (counts only); `digests` feed the seen-set, never a report."""

    erasure_id: int
    removed: dict[str, int]
    tombstones_added: int
    clusters_recomputed: int
    links_added: int = 0  # links among the records that stay, made when those that linked to an erased one relinked
    digests: dict[str, set[bytes]] = field(repr=False, default_factory=dict)
    urls: set[str] = field(repr=False, default_factory=set)  # for the crawlers' URL seen-set


@dataclass
class _Found:
    record_ids: set[int] = field(default_factory=set)
    history_ids: set[int] = field(default_factory=set)
    staged: set[tuple[str, int]] = field(default_factory=set)
    digests: dict[str, set[bytes]] = field(default_factory=lambda: defaultdict(set))
    keys: set[str] = field(default_factory=set)  # natural keys of erased current and staged rows
    urls: set[str] = field(default_factory=set)  # canonical URLs of erased current and staged rows
    direct_keys: set[str] = field(default_factory=set)  # natural keys of the rows the subject names itself
    direct_urls: set[str] = field(default_factory=set)  # and their canonical URLs

    def add_digest(self, version: str, digest: bytes | str | None) -> bool:
        if not digest:
            return False
        raw = bytes.fromhex(digest) if isinstance(digest, str) else bytes(digest)
        if raw in self.digests[version]:
            return False
        self.digests[version].add(raw)
        return True


def _json_text(column, path: Sequence[str]):
    """A JSON field's value as text, on PostgreSQL (->>, #>>) and SQLite (json_extract)."""
    target = column[path[0]] if len(path) == 1 else column[tuple(path)]
    return cast(target.as_string(), String)


def _digest_condition(version_column, digest_column, digests: dict[str, set[bytes]]):
    parts = [
        and_(version_column == version, digest_column.in_(sorted(part)))
        for version, values in digests.items()
        for part in chunked(sorted(values))
    ]
    return or_(false(), *parts)


def _field_holds(column, path: Sequence[str], value: str, dialect: str):
    """Whether a JSON column's field at `path` is `value` or a list holding it: `core.field_texts` in SQL.

    A list's elements that are strings or numbers count, compared as their text (stored payloads are
    canonical, so normalised already); nested lists and objects do not. Set-based: one EXISTS per row, the
    elements expanded by the database (PostgreSQL `jsonb_array_elements`, SQLite `json_each`).
    """
    scalar = _json_text(column, path) == value
    if dialect == "postgresql":
        target = column[tuple(path)]
        only_lists = case((func.jsonb_typeof(target) == "array", target))  # elements of a scalar would be an error
        elements = func.jsonb_array_elements(only_lists).table_valued(sql_column("value", JSONB))
        holds = (
            select(1)
            .select_from(elements)
            .where(
                func.jsonb_typeof(elements.c.value).in_(("string", "number")),
                elements.c.value.op("#>>")(literal_column("'{}'")) == value,
            )
        )
    else:
        json_path = "$" + "".join(f'."{name}"' for name in path)  # names are [A-Za-z0-9_-] (Subject.parse)
        elements = func.json_each(column, json_path).table_valued("value", "type")
        holds = (
            select(1)
            .select_from(elements)
            .where(elements.c.type.in_(("text", "integer", "real")), cast(elements.c.value, String) == value)
        )
    return or_(scalar, holds.exists())


def _subject_conditions(subject: Subject, dialect: str):
    """(records, record_history, canonical_records) conditions that name the subject directly."""
    value, names = subject.value, list(subject.identifiers)
    if subject.kind is SubjectKind.NATURAL_KEY:
        return (
            records.c.natural_key.in_(names),
            record_history.c.natural_key.in_(names),
            canonical_records.c.natural_key.in_(names),
        )
    if subject.kind is SubjectKind.CANONICAL_URL:
        return (
            or_(records.c.canonical_url.in_(names), records.c.natural_key.in_(names)),
            or_(_json_text(record_history.c.payload, ("url",)).in_(names), record_history.c.natural_key.in_(names)),
            or_(canonical_records.c.canonical_url.in_(names), canonical_records.c.natural_key.in_(names)),
        )
    if subject.kind is SubjectKind.FIELD:
        return tuple(
            _field_holds(table.c.payload, subject.path, value, dialect)
            for table in (records, record_history, canonical_records)
        )
    digest = bytes.fromhex(value)
    return (
        records.c.record_id.in_(
            select(record_hashes.c.record_id).where(
                record_hashes.c.hash_version == subject.scope, record_hashes.c.content_hash == digest
            )
        ),
        and_(record_history.c.hash_version == subject.scope, record_history.c.content_hash == digest),
        _json_text(canonical_records.c.hashes, (subject.scope,)) == value,
    )


def _find(conn: Connection, subject: Subject) -> _Found:
    """The subject's rows, then every other copy of their contents, to a fixed point."""
    found = _Found()
    if subject.kind is SubjectKind.CONTENT_DIGEST:
        found.add_digest(subject.scope, subject.value)
    on_records, on_history, on_staged = _subject_conditions(subject, conn.dialect.name)
    new_records = {
        row.record_id: row
        for row in conn.execute(
            select(records.c.record_id, records.c.natural_key, records.c.canonical_url).where(on_records)
        )
    }
    found.direct_keys = {row.natural_key for row in new_records.values()}
    found.direct_urls = {row.canonical_url for row in new_records.values()}
    new_history = set(conn.execute(select(record_history.c.history_id).where(on_history)).scalars())
    new_staged = {
        tuple(row)
        for row in conn.execute(select(canonical_records.c.batch_id, canonical_records.c.line_no).where(on_staged))
    }
    new_record_ids = set(new_records)
    for _ in range(_MAX_ROUNDS):
        new_record_ids -= found.record_ids
        new_history -= found.history_ids
        new_staged -= found.staged
        if not (new_record_ids or new_history or new_staged):
            break
        fresh: dict[str, set[bytes]] = defaultdict(set)

        def absorb(version: str, digest, fresh=fresh) -> None:  # this round's `fresh`
            if found.add_digest(version, digest):
                fresh[version].add(bytes.fromhex(digest) if isinstance(digest, str) else bytes(digest))

        found.record_ids |= new_record_ids
        found.history_ids |= new_history
        found.staged |= new_staged
        for part in chunked(sorted(new_record_ids)):
            for row in conn.execute(
                select(records.c.natural_key, records.c.canonical_url, records.c.payload).where(
                    records.c.record_id.in_(part)
                )
            ):
                found.keys.add(row.natural_key)
                found.urls.add(row.canonical_url)
                for version, digest in core.payload_digests(row.payload).items():
                    absorb(version, digest)
            for version, digest in conn.execute(
                select(record_hashes.c.hash_version, record_hashes.c.content_hash).where(
                    record_hashes.c.record_id.in_(part), record_hashes.c.content_hash.is_not(None)
                )
            ):
                absorb(version, digest)
        for part in chunked(sorted(new_history)):
            for row in conn.execute(
                select(record_history.c.hash_version, record_history.c.content_hash, record_history.c.payload).where(
                    record_history.c.history_id.in_(part)
                )
            ):
                absorb(row.hash_version, row.content_hash)
                for version, digest in core.payload_digests(row.payload).items():
                    absorb(version, digest)
        staged_names: set[tuple[str, str]] = set()
        for batch_id, lines in _group_lines(new_staged).items():
            for part in chunked(lines):
                for row in conn.execute(
                    select(
                        canonical_records.c.natural_key,
                        canonical_records.c.canonical_url,
                        canonical_records.c.hashes,
                        canonical_records.c.payload,
                    ).where(canonical_records.c.batch_id == batch_id, canonical_records.c.line_no.in_(part))
                ):
                    staged_names.add((row.natural_key, row.canonical_url))
                    for version, digest in {**core.payload_digests(row.payload), **row.hashes}.items():
                        absorb(version, digest)
        # A staged listing not stored yet is erased like a stored one: its key and URL name the subject. One whose
        # key a current row holds that is not erased (the listing changed hands since) does not: the subject's
        # decision rows and copies go by their digests, the new owner's stay.
        held = _stored_keys(conn, {key for key, _ in staged_names}) - found.keys
        for key, url in staged_names:
            if key not in held:
                found.keys.add(key)
                found.urls.add(url)
        # Every other copy of a content just found: current rows holding it under any version,
        # history rows of erased records or of that content, staged lines hashed to it.
        new_record_ids = (
            set(
                conn.execute(
                    select(record_hashes.c.record_id).where(
                        _digest_condition(record_hashes.c.hash_version, record_hashes.c.content_hash, fresh)
                    )
                ).scalars()
            )
            if fresh
            else set()
        )
        history_by_id = [record_history.c.record_id.in_(part) for part in chunked(sorted(found.record_ids))]
        new_history = set(
            conn.execute(
                select(record_history.c.history_id).where(
                    or_(
                        false(),
                        *history_by_id,
                        _digest_condition(record_history.c.hash_version, record_history.c.content_hash, fresh),
                    )
                )
            ).scalars()
        )
        new_staged = set()
        for version, values in fresh.items():
            for part in chunked(sorted(v.hex() for v in values)):
                new_staged |= {
                    tuple(row)
                    for row in conn.execute(
                        select(canonical_records.c.batch_id, canonical_records.c.line_no).where(
                            _json_text(canonical_records.c.hashes, (version,)).in_(part)
                        )
                    )
                }
    else:
        raise RuntimeError(f"erasure did not converge in {_MAX_ROUNDS} rounds of following copies")
    return found


def _group_lines(pairs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for batch_id, line_no in sorted(pairs):
        grouped[batch_id].append(line_no)
    return grouped


def _stored_keys(conn: Connection, keys: set[str]) -> set[str]:
    """The natural keys among `keys` that a current row holds."""
    return {
        key
        for part in chunked(sorted(keys))
        for key in conn.execute(select(records.c.natural_key).where(records.c.natural_key.in_(part))).scalars()
    }


#: Appended to the reason of a quarantined line whose bytes an erasure emptied.
ERASED_LINE = "; raw line erased with its subject"


def _redact_decisions(conn: Connection, found: _Found) -> int:
    """Decision-log rows naming an erased key or digest lose both; their decision, batch, line and run stay, so a
    batch's decisions still add up to its lines and its first decisions stay what they were."""
    d = dedup_decisions
    by_key = [d.c.natural_key.in_(part) for part in chunked(sorted(found.keys))]
    condition = or_(false(), *by_key, _digest_condition(d.c.hash_version, d.c.content_hash, found.digests))
    return conn.execute(update(d).where(condition).values(natural_key=None, content_hash=None)).rowcount


def _redact_quarantine(conn: Connection, matcher: RawLineMatcher) -> int:
    """Scan quarantined lines a page at a time and empty the ones that hold the subject: the row (batch, line,
    rung, reason) stays, so the line is still accounted for, and its reason says its bytes were erased."""
    q = quarantine
    matched: list[tuple[str, int]] = []
    after: tuple[str, int] | None = None
    while True:
        query = (
            select(q.c.batch_id, q.c.line_no, q.c.raw_line).order_by(q.c.batch_id, q.c.line_no).limit(_QUARANTINE_PAGE)
        )
        if after is not None:
            query = query.where(tuple_(q.c.batch_id, q.c.line_no) > tuple_(*after))
        rows = conn.execute(query).all()
        if not rows:
            break
        matched += [(row.batch_id, row.line_no) for row in rows if matcher.matches(bytes(row.raw_line))]
        after = (rows[-1].batch_id, rows[-1].line_no)
    redacted = 0
    for batch_id, lines in _group_lines(matched).items():
        for part in chunked(lines):
            where = (q.c.batch_id == batch_id, q.c.line_no.in_(part))
            redacted += conn.execute(
                update(q).where(*where).values(raw_line=b"", reason=q.c.reason + ERASED_LINE)
            ).rowcount
    return redacted


def swept_tables() -> list:
    """Tables of the schema, beyond the ones handled by name, that name records by id, natural key or digest."""
    return [
        table
        for table in metadata.sorted_tables
        if table.name not in _HANDLED
        and (
            {"record_id", "natural_key"} & set(table.c.keys())
            or {"hash_version", "content_hash"} <= set(table.c.keys())
        )
    ]


def _sweep_other_tables(conn: Connection, found: _Found) -> dict[str, int]:
    """Tables added by other features that name records by id, natural key or digest lose those rows too."""
    counts = {}
    for table in swept_tables():
        columns = table.c
        conditions = []
        if "record_id" in columns:
            conditions += [columns.record_id.in_(part) for part in chunked(sorted(found.record_ids))]
        if "natural_key" in columns:
            conditions += [columns.natural_key.in_(part) for part in chunked(sorted(found.keys))]
        if "hash_version" in columns and "content_hash" in columns:
            conditions.append(_digest_condition(columns.hash_version, columns.content_hash, found.digests))
        # every table counted, 0 too, even with nothing to look for: a report keeps its shape from one erasure to
        # another
        counts[table.name] = conn.execute(delete(table).where(or_(false(), *conditions))).rowcount if conditions else 0
    return counts


def redacted_tables() -> list:
    """Tables of the schema, beyond the ones handled by name, with JSON columns (reports, audits, figures)."""
    return [
        table
        for table in metadata.sorted_tables
        if table.name not in _HANDLED and table.primary_key.columns and any(isinstance(c.type, JSON) for c in table.c)
    ]


def _redact(value, needles: set[str]):
    """`value` with every string equal to a needle replaced by ERASED; (new value, whether anything changed)."""
    if isinstance(value, str):
        return (ERASED, True) if value in needles else (value, False)
    if isinstance(value, list):
        pairs = [_redact(item, needles) for item in value]
        return [v for v, _ in pairs], any(changed for _, changed in pairs)
    if isinstance(value, dict):
        pairs = {k: _redact(v, needles) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(changed for _, changed in pairs.values())
    return value, False


def _redact_json_columns(conn: Connection, found: _Found) -> dict[str, int]:
    """Reports of other features (rehash comparisons and events, run figures) keep their shape, without the subject.

    Any JSON value equal to an erased natural key, canonical URL or digest (hex, any version) becomes "[erased]".
    """
    needles = found.keys | found.urls | {d.hex() for digests in found.digests.values() for d in digests}
    counts = {}
    if not needles:
        return counts
    for table in redacted_tables():
        key_columns = list(table.primary_key.columns)
        json_columns = [c for c in table.c if isinstance(c.type, JSON)]
        changed_rows = 0
        for row in conn.execute(select(*key_columns, *json_columns)).all():
            values, changed = {}, False
            for column in json_columns:
                values[column.name], hit = _redact(row._mapping[column], needles)
                changed |= hit
            if changed:
                where = and_(*[c == row._mapping[c] for c in key_columns])
                conn.execute(update(table).where(where).values(values))
                changed_rows += 1
        if changed_rows:
            counts[f"{table.name} (redacted)"] = changed_rows
    return counts


def _tombstones(key: bytes, subject: Subject, found: _Found) -> list[tuple[bytes, str, str]]:
    """(fingerprint, kind, scope) of every identifier that must never come back."""
    rows = [(core.subject_fingerprint(key, subject), subject.kind.value, subject.scope)]
    keys, urls = set(), set()
    if subject.kind in (SubjectKind.NATURAL_KEY, SubjectKind.CANONICAL_URL):
        # "This listing": its key and its URL (under either scheme) name it, whatever the natural-key configuration.
        keys |= found.direct_keys
        urls |= {variant for url in found.direct_urls for variant in core.page_variants(url)}
        names = set(subject.identifiers)
        keys |= names
        if subject.kind is SubjectKind.CANONICAL_URL or subject.value.startswith(("http://", "https://")):
            urls |= names
    rows += [(core.natural_key_fingerprint(key, k), SubjectKind.NATURAL_KEY.value, "") for k in sorted(keys)]
    rows += [(core.url_fingerprint(key, u), SubjectKind.CANONICAL_URL.value, URL_VERSION) for u in sorted(urls)]
    rows += [
        (core.digest_fingerprint(key, version, digest.hex()), SubjectKind.CONTENT_DIGEST.value, version)
        for version, digests in sorted(found.digests.items())
        for digest in sorted(digests)
    ]
    # The erasure removed broken lines naming any erased row's URL or key (RawLineMatcher); so that such lines
    # are not kept again, these are tombstoned for the quarantine only: they never suppress a record.
    quarantined_urls = {variant for url in found.urls for variant in core.page_variants(url)}
    rows += [
        (
            core.fingerprint(key, SubjectKind.CANONICAL_URL.value, core.QUARANTINE_SCOPE, u),
            SubjectKind.CANONICAL_URL.value,
            core.QUARANTINE_SCOPE,
        )
        for u in sorted(quarantined_urls)
    ]
    rows += [
        (
            core.fingerprint(key, SubjectKind.NATURAL_KEY.value, core.QUARANTINE_SCOPE, k),
            SubjectKind.NATURAL_KEY.value,
            core.QUARANTINE_SCOPE,
        )
        for k in sorted(found.keys)
    ]
    return list({fp: (fp, kind, scope) for fp, kind, scope in rows}.values())


def erase(
    conn: Connection,
    subject: Subject,
    request_id: str,
    representative: str = DEFAULT_RULE,
) -> ErasureResult:
    """Remove every copy of `subject` and leave its tombstones, inside the caller's transaction."""
    lock_for_erasure(conn)  # excludes every near-rung chunk (they hold it shared), so no lock cycle with them
    key = tombstone_key(conn)
    checked_key(conn, load_catalogue(conn))
    kid = core.key_id(key)
    now = utcnow()
    found = _find(conn, subject)

    removed: dict[str, int] = {}
    removed.update(_sweep_other_tables(conn, found))
    removed.update(_redact_json_columns(conn, found))
    near = near_graph.remove_from_index(conn, found.record_ids, representative)
    removed.update(near.removed)
    removed["record_hashes"] = delete_in(conn, record_hashes, [record_hashes.c.record_id], found.record_ids)
    history_ids = found.history_ids
    removed["record_history"] = delete_in(conn, record_history, [record_history.c.history_id], history_ids)
    removed["records"] = delete_in(conn, records, [records.c.record_id], found.record_ids)
    removed["canonical_records"] = sum(
        conn.execute(
            delete(canonical_records).where(
                canonical_records.c.batch_id == batch_id, canonical_records.c.line_no.in_(part)
            )
        ).rowcount
        for batch_id, lines in _group_lines(found.staged).items()
        for part in chunked(lines)
    )
    removed["dedup_decisions (redacted)"] = _redact_decisions(conn, found)
    fields = {subject.scope: {subject.value}} if subject.kind is SubjectKind.FIELD else {}
    keys = found.keys | (set(subject.identifiers) if subject.kind is SubjectKind.NATURAL_KEY else set())
    urls = found.urls | (set(subject.identifiers) if subject.kind is SubjectKind.CANONICAL_URL else set())
    matcher = RawLineMatcher(urls, keys, fields, {v: {d.hex() for d in ds} for v, ds in found.digests.items()})
    removed["quarantine (redacted)"] = _redact_quarantine(conn, matcher)

    erasure_id = conn.execute(
        erasure_requests.insert()
        .values(
            request_id=request_id,
            subject_kind=subject.kind.value,
            subject_scope=subject.scope,
            key_id=kid,
            removed={},
            requested_at=now,
        )
        .returning(erasure_requests.c.erasure_id)
    ).scalar_one()
    tombstones = _tombstones(key, subject, found)
    known = existing_fingerprints(conn, [fp for fp, _, _ in tombstones])
    added = [row for row in tombstones if row[0] not in known]
    if added:
        conn.execute(
            upsert_ignore(conn, erasure_tombstones),
            [
                {
                    "fingerprint": fp,
                    "kind": kind,
                    "scope": scope,
                    "key_id": kid,
                    "erasure_id": erasure_id,
                    "created_at": now,
                }
                for fp, kind, scope in added
            ],
        )
    scopes = {(kind, scope) for _, kind, scope in tombstones}
    conn.execute(
        upsert_ignore(conn, erasure_scopes), [{"kind": k, "scope": s, "key_id": kid} for k, s in sorted(scopes)]
    )
    summary = {
        **removed,
        "tombstones_added": len(added),
        "clusters_recomputed": near.clusters,
        "links_added": near.links_added,
    }
    conn.execute(update(erasure_requests).where(erasure_requests.c.erasure_id == erasure_id).values(removed=summary))
    erased_urls = {variant for url in urls for variant in core.page_variants(url)}
    return ErasureResult(
        erasure_id, removed, len(added), near.clusters, near.links_added, dict(found.digests), erased_urls
    )


def record_seen_set_removals(conn: Connection, erasure_id: int, removed: dict[str, int]) -> None:
    """Add seen-set counts to an erasure's audit row (seen-sets are cleared after the transaction commits)."""
    row = conn.execute(
        select(erasure_requests.c.removed).where(erasure_requests.c.erasure_id == erasure_id)
    ).scalar_one()
    conn.execute(
        update(erasure_requests).where(erasure_requests.c.erasure_id == erasure_id).values(removed={**row, **removed})
    )
