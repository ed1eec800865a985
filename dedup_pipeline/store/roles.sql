-- Least-privilege roles for the dedup warehouse on PostgreSQL.
--
-- Applied by `dedup-pipeline grant-roles` (dedup_pipeline/store/roles.py) as the schema owner, after
-- the schema exists; idempotent, so run it again after every upgrade that adds tables. The {placeholders}
-- are role, database and column names, quoted as identifiers by the loader, and the analyst's hidden
-- field names (a text array of checked names); this file
-- holds no value and no credential. The four roles are NOLOGIN groups: give each service or person
-- their own LOGIN role, with a password or certificate from your secret store, and GRANT it one group.

DO $$ BEGIN CREATE ROLE ${writer} NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE ${analyst} NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE ${eraser} NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE ${monitor} NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;

-- Start from nothing: no table is readable by PUBLIC, and earlier grants to the four roles are reset.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM ${writer}, ${analyst}, ${eraser}, ${monitor};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM ${writer}, ${analyst}, ${eraser}, ${monitor};
GRANT USAGE ON SCHEMA public TO ${writer}, ${analyst}, ${eraser}, ${monitor};

-- Pipeline writer: reads and writes every pipeline table (the ladder, retention, the rehash jobs).
-- It reads tombstones (ingestion checks them) but can neither add nor remove one, and cannot read
-- the erasure audit.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ${writer};
REVOKE INSERT, UPDATE, DELETE ON erasure_tombstones, erasure_scopes FROM ${writer};
REVOKE ALL ON erasure_requests FROM ${writer};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO ${writer};
-- The exact rung stages chunks in temporary tables.
GRANT TEMPORARY ON DATABASE ${database} TO ${writer};

-- Analyst: the deduplicated records through the view analyst_records (every column but the content digest,
-- and the payload without the personal fields, which are part of every hash version's identity, so the
-- analyst can neither read them nor rebuild a digest from what it reads), near-duplicate links and clusters,
-- batch registrations and settings. Not: the records table itself, hash tables (record_hashes, near_index),
-- history, staged rows, the decision log, quarantine, tombstones or the erasure audit. The view runs with its
-- owner's rights; it is made again on every run, so a column added to records appears in it.
DROP VIEW IF EXISTS analyst_records;
CREATE VIEW analyst_records AS
    SELECT ${analyst_record_columns}, payload - ${analyst_hidden_fields} AS payload FROM records;
GRANT SELECT ON analyst_records, near_duplicate_links, near_duplicate_clusters, crawl_batches, dedup_settings
    TO ${analyst};

-- Erasure operator: finds and deletes a subject's rows, recomputes the clusters they were in (and the links
-- of the records that linked to them), empties its key and digest in the decision log and its bytes in
-- quarantine, adds tombstones and writes the audit. It cannot insert or change records, nor remove a
-- tombstone. (UPDATE on near_index: the row locks of records whose links change.)
GRANT SELECT, DELETE ON records, record_hashes, record_history, canonical_records,
    near_index, near_pending, near_duplicate_links, near_duplicate_clusters TO ${eraser};
GRANT SELECT ON dedup_decisions, quarantine TO ${eraser};
GRANT UPDATE (natural_key, content_hash) ON dedup_decisions TO ${eraser};
GRANT UPDATE (raw_line, reason) ON quarantine TO ${eraser};
GRANT UPDATE ON near_index TO ${eraser};
GRANT INSERT ON near_duplicate_links TO ${eraser};
GRANT INSERT, UPDATE ON near_duplicate_clusters TO ${eraser};
GRANT SELECT ON dedup_settings, crawl_batches TO ${eraser};
GRANT SELECT, INSERT ON erasure_tombstones, erasure_scopes TO ${eraser};
GRANT SELECT, INSERT, UPDATE ON erasure_requests TO ${eraser};
GRANT USAGE ON SEQUENCE erasure_requests_erasure_id_seq TO ${eraser};

-- Monitor: the metrics exporter (`dedup-pipeline metrics`). The rungs' run figures (counts, no key or
-- value) and the settings; nothing else.
GRANT SELECT ON exact_rung_runs, near_rung_runs, dedup_settings TO ${monitor};
