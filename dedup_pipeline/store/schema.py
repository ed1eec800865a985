"""The warehouse schema (SQLAlchemy Core). One module so every table is in one place.

Digests are stored compactly as 32 raw bytes (BYTEA on PostgreSQL, BLOB on
SQLite) beside their version string. `records` holds one current row per
natural key; its UNIQUE (hash_version, content_hash) index is the authority on
"is this content already stored".
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

# BIGINT ids on PostgreSQL; SQLite only auto-increments INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
Payload = JSON().with_variant(JSONB(), "postgresql")
Digest = LargeBinary(32)


def _now_column(name: str, **kwargs) -> Column:
    return Column(name, DateTime(timezone=True), **kwargs)


settings = Table(
    "dedup_settings",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    _now_column("updated_at", nullable=False),
)

crawl_batches = Table(
    "crawl_batches",
    metadata,
    Column("batch_id", String(255), primary_key=True),
    Column("file_path", Text, nullable=False),
    Column("file_sha256", String(64), nullable=False),
    Column("file_bytes", BigInteger, nullable=False),
    Column("lines", Integer, nullable=False),
    Column("parsed", Integer, nullable=False),
    Column("quarantined", Integer, nullable=False),
    _now_column("landed_at", nullable=False),
    _now_column("registered_at", nullable=False),
)

quarantine = Table(
    "quarantine",
    metadata,
    Column("batch_id", String(255), primary_key=True),
    Column("line_no", Integer, primary_key=True),
    Column("rung", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("raw_line", LargeBinary, nullable=False),
    _now_column("quarantined_at", nullable=False),
)

canonical_records = Table(
    "canonical_records",
    metadata,
    Column("batch_id", String(255), primary_key=True),
    Column("line_no", Integer, primary_key=True),
    Column("natural_key", Text, nullable=False),
    Column("canonical_url", Text, nullable=False),
    Column("url_version", String(16), nullable=False),
    Column("hashes", Payload, nullable=False),
    Column("hash_errors", Payload, nullable=False),
    Column("payload", Payload, nullable=False),
    _now_column("crawled_at"),
)

records = Table(
    "records",
    metadata,
    Column("record_id", Id, primary_key=True, autoincrement=True),
    Column("natural_key", Text, nullable=False, unique=True),
    Column("canonical_url", Text, nullable=False),
    Column("url_version", String(16), nullable=False),
    Column("hash_version", String(32), nullable=False),
    Column("content_hash", Digest, nullable=False),
    Column("payload", Payload, nullable=False),
    _now_column("first_seen_at", nullable=False),
    _now_column("last_crawled_at", nullable=False),
    Column("first_batch_id", String(255), nullable=False),
    Column("last_batch_id", String(255), nullable=False),
    # Order of the version held: (last_landed_at, last_batch_id, last_line_no); newer batches win.
    _now_column("last_landed_at", nullable=False),
    Column("last_line_no", Integer, nullable=False),
    UniqueConstraint("hash_version", "content_hash", name="uq_records_version_hash"),
    Index("ix_records_last_batch", "last_batch_id", "record_id"),  # a batch's records in id order, page by page
)
#: Every column of `records`, in table order: a whole row as COPY takes it.
RECORD_COLUMNS = tuple(column.name for column in records.columns)

record_hashes = Table(
    "record_hashes",
    metadata,
    Column("record_id", Id, ForeignKey("records.record_id", ondelete="CASCADE"), primary_key=True),
    Column("hash_version", String(32), primary_key=True),
    Column("content_hash", Digest),
    Column("error", Text),
    Index("ix_record_hashes_version_hash", "hash_version", "content_hash"),
)

record_history = Table(
    "record_history",
    metadata,
    Column("history_id", Id, primary_key=True, autoincrement=True),
    Column("record_id", Id, nullable=False, index=True),
    Column("natural_key", Text, nullable=False),
    Column("hash_version", String(32), nullable=False),
    Column("content_hash", Digest, nullable=False),
    Column("payload", Payload, nullable=False),
    _now_column("valid_from", nullable=False),
    _now_column("superseded_at", nullable=False),
    Column("superseded_by_batch_id", String(255), nullable=False),
)
#: What of a stored row its history row keeps, in `record_history`'s column order (its six after `history_id`).
SUPERSEDED_COLUMNS = (
    records.c.record_id,
    records.c.natural_key,
    records.c.hash_version,
    records.c.content_hash,
    records.c.payload,
    records.c.last_crawled_at,
)

dedup_decisions = Table(
    "dedup_decisions",
    metadata,
    Column("decision_id", Id, primary_key=True, autoincrement=True),
    Column("batch_id", String(255), nullable=False),
    Column("line_no", Integer, nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("natural_key", Text),
    Column("hash_version", String(32)),
    Column("content_hash", Digest),
    Column("decision", String(32), nullable=False),
    _now_column("decided_at", nullable=False),
    Index("ix_decisions_batch", "batch_id", "line_no"),
)

#: Band-key columns of `near_index` (b0, b1, ...): an index uses as many as its identity has bands (or SimHash blocks),
#: each under a B-tree index of its own. The indexes are partial (non-NULL keys only), so the unused columns' stay
#: empty, and the schema's owner creates them all with the tables (the writer role cannot create indexes).
MAX_BANDS = 64
NEAR_INDEX_FILLFACTOR = 92

# One row per sketched record (layout near-index/2): the order of first landing (which of two records is "older", the
# same whatever order batches ran in), a compact signature (one byte per MinHash permutation, or the 8-byte SimHash
# fingerprint), the first 16 bytes of the digest of the content sketched (`store.near.indexed_digest`) and the band
# keys as 32-bit integers. The columns go from the widest alignment to the narrowest (8-byte integers, the signature,
# the digest) but for the band keys, which follow the digest: 3 bytes of padding before them, which a page's 8-byte
# alignment of each row would take anyway: 320 bytes with 26 bands. Part of each page is left free (PostgreSQL's
# fillfactor), room for two more versions of such a row: a re-crawl with the same text and a new price re-labels its
# row's digest, and with room on the page that update is HOT, leaving the row's 27 index entries as they are (else it
# adds 27 more, about six times the time and most of the index's growth from updates). At 92% a page holds 23 such
# rows and the room for two more (22 and two in a warehouse made before this column order, whose rows keep their
# padding).
near_index = Table(
    "near_index",
    metadata,
    Column("record_id", Id, ForeignKey("records.record_id", ondelete="CASCADE"), primary_key=True),
    Column("first_landed_us", BigInteger, nullable=False),
    Column("first_seen_us", BigInteger, nullable=False),
    Column("key_order", BigInteger, nullable=False),
    Column("signature", LargeBinary, nullable=False),
    Column("content_hash", Digest, nullable=False),
    *[Column(f"b{band}", Integer) for band in range(MAX_BANDS)],
    postgresql_with={"fillfactor": NEAR_INDEX_FILLFACTOR},
)
for _band in range(MAX_BANDS):
    _key = near_index.c[f"b{_band}"]
    Index(f"ix_near_index_b{_band}", _key, postgresql_where=_key.is_not(None), sqlite_where=_key.is_not(None))

# Index rows stored and visible to other workers but not linked and clustered yet: between a chunk's two
# transactions, or left by a chunk that stopped between them (a re-run links them). A table of its own, so that
# linking deletes a small row instead of rewriting the index row and its band keys' index entries.
near_pending = Table(
    "near_pending",
    metadata,
    Column("record_id", Id, ForeignKey("records.record_id", ondelete="CASCADE"), primary_key=True),
)

# A record's links go to at most `max_links` earlier-landed near duplicates, its nearest (record_b is the record,
# record_a the earlier one); its cluster may hold many more records than it links to.
near_duplicate_links = Table(
    "near_duplicate_links",
    metadata,
    Column("record_a", Id, ForeignKey("records.record_id", ondelete="CASCADE"), primary_key=True),
    Column("record_b", Id, ForeignKey("records.record_id", ondelete="CASCADE"), primary_key=True),
    Column("similarity", Float, nullable=False),
    Column("method", String(16), nullable=False),
    Column("batch_id", String(255), nullable=False),
    Index("ix_links_b", "record_b"),
)

near_duplicate_clusters = Table(
    "near_duplicate_clusters",
    metadata,
    Column("record_id", Id, ForeignKey("records.record_id", ondelete="CASCADE"), primary_key=True),
    Column("cluster_id", Id, nullable=False, index=True),
    Column("is_representative", Boolean, nullable=False),
)


#: The run id of a near-index rebuild's figures in `near_rung_runs`, before a uuid: it links again what runs linked.
REBUILD_RUN_PREFIX = "rebuild-"


def _rung_runs(name: str) -> Table:
    """Figures (counts, no keys or values) of each run of a rung over a batch, kept for the warehouse's life."""
    return Table(
        name,
        metadata,
        Column("batch_id", String(255), primary_key=True),
        Column("run_id", String(64), primary_key=True),
        _now_column("finished_at", nullable=False),
        Column("stats", Payload, nullable=False),
    )


# Never pruned, unlike the decision log, the quarantine and the links: the Prometheus counters are their sums
# (dedup_pipeline/metrics.py). The exact rung's also hold what the decision log cannot give back: seen-set hits,
# fallbacks, replays.
exact_rung_runs = _rung_runs("exact_rung_runs")
near_rung_runs = _rung_runs("near_rung_runs")

# ---------------------------------------------------------------- rehash migration (dedup_pipeline/ladder/rehash.py)

# Figures of each comparison; its examples name rows by key and digest (an erasure redacts them).
rehash_comparisons = Table(
    "rehash_comparisons",
    metadata,
    Column("comparison_id", Id, primary_key=True, autoincrement=True),
    Column("source_version", String(32), nullable=False),
    Column("target_version", String(32), nullable=False),
    _now_column("compared_at", nullable=False),
    Column("passed", Boolean, nullable=False),
    Column("figures", Payload, nullable=False),
    Index("ix_rehash_comparisons_pair", "source_version", "target_version", "comparison_id"),
)

# Audit of every switch and retire of the active hash version, forced or not, with its reason (counts, no keys).
hash_version_events = Table(
    "hash_version_events",
    metadata,
    Column("event_id", Id, primary_key=True, autoincrement=True),
    Column("action", String(16), nullable=False),
    Column("from_version", String(32), nullable=False),
    Column("to_version", String(32), nullable=False),
    _now_column("occurred_at", nullable=False),
    _now_column("overlap_until"),
    Column("forced", Boolean, nullable=False),
    Column("reason", Text),
    Column("run_id", String(64)),
    Column("details", Payload, nullable=False),
)

# Rows a retire moved to record_history because their content merged into another row under the new version.
# Ids only: the key, digest and payload are in record_history, where erasure finds them.
rehash_merged_records = Table(
    "rehash_merged_records",
    metadata,
    Column("event_id", Id, primary_key=True),
    Column("record_id", Id, primary_key=True),
    Column("merged_into_record_id", Id, nullable=False),
    Column("reason", Text, nullable=False),
)

# ---------------------------------------------------------------- erasure (dedup_pipeline/store/erasure.py)

# One row per erasure request: who asked (an operator's reference, never the subject) and what was removed (counts).
erasure_requests = Table(
    "erasure_requests",
    metadata,
    Column("erasure_id", Id, primary_key=True, autoincrement=True),
    Column("request_id", Text, nullable=False),
    Column("subject_kind", String(32), nullable=False),
    Column("subject_scope", String(255), nullable=False),
    Column("key_id", String(16), nullable=False),
    Column("removed", Payload, nullable=False),
    _now_column("requested_at", nullable=False),
)

# Keyed fingerprints (HMAC-SHA256) of erased identifiers, checked before every insert. Never the raw value.
erasure_tombstones = Table(
    "erasure_tombstones",
    metadata,
    Column("fingerprint", Digest, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("scope", String(255), nullable=False),
    Column("key_id", String(16), nullable=False),
    Column("erasure_id", Id, nullable=False, index=True),
    _now_column("created_at", nullable=False),
)

# Which (kind, scope, key) combinations have tombstones: tiny, read once per chunk by the exact rung.
erasure_scopes = Table(
    "erasure_scopes",
    metadata,
    Column("kind", String(32), primary_key=True),
    Column("scope", String(255), primary_key=True),
    Column("key_id", String(16), primary_key=True),
)
