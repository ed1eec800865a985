"""The near-duplicate rung on SQLite and the real PostgreSQL: capped buckets, exact verification, runaway clusters."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sqlalchemy import select

from dedup_pipeline.core.near import NearDupParams, cluster_near_duplicates
from dedup_pipeline.ladder.canonical import canonicalise_batch
from dedup_pipeline.ladder.exact import deduplicate_batch
from dedup_pipeline.ladder.near import cluster_batch, near_text, runaway_clusters
from dedup_pipeline.ladder.raw import ingest_raw_batch
from dedup_pipeline.ladder.settings import LadderSettings, NearSettings
from dedup_pipeline.landing import find_batch
from dedup_pipeline.store.near import _selected_rows, indexed_digest, link_settings, load_rows
from dedup_pipeline.store.near_graph import band_count, signature_width
from dedup_pipeline.store.schema import near_duplicate_clusters, near_duplicate_links, near_index, records
from dedup_pipeline_tests.helpers import description, listing, new_run_id, write_batch

RUNAWAY_CHECK = NearSettings(max_cluster_share=0.2, min_records_for_cluster_check=50)
SMALL_BATCHES_PASS = NearSettings(max_cluster_share=0.2, min_records_for_cluster_check=81)

BOILERPLATE = (
    "Free shipping on all orders over fifty euros. Returns accepted within thirty days of delivery. "
    "Sign up to our newsletter for weekly deals on kettles, pans and every kitchen tool you need."
)


def near_copy(i: int) -> str:
    """The boilerplate and one word of letters that differs (a word with digits would be a code of its own)."""
    return f"{BOILERPLATE} item {chr(97 + i % 26)}{chr(97 + i // 26 % 26)}"


def land(warehouse, folder, key, rows, landed=1e9):
    """Write a batch and take it through the raw, canonical and exact rungs."""
    write_batch(folder, key, rows, landed=landed)
    ingest_raw_batch(warehouse, find_batch(folder, key))
    canonicalise_batch(warehouse, key, LadderSettings(chunk_size=50))
    deduplicate_batch(warehouse, key, new_run_id(key), LadderSettings(chunk_size=50))


def stored(warehouse):
    """(texts by record id, links, clusters as sorted member lists)."""
    with warehouse.engine.connect() as conn:
        texts = {rid: near_text(p) for rid, p in conn.execute(select(records.c.record_id, records.c.payload))}
        links = {
            (a, b): s
            for a, b, s in conn.execute(
                select(
                    near_duplicate_links.c.record_a, near_duplicate_links.c.record_b, near_duplicate_links.c.similarity
                )
            )
        }
        groups: dict = {}
        for rid, cid in conn.execute(select(near_duplicate_clusters.c.record_id, near_duplicate_clusters.c.cluster_id)):
            groups.setdefault(cid, []).append(rid)
    return texts, links, sorted(sorted(g) for g in groups.values())


def test_boilerplate_caps_the_candidates_a_record_meets_and_still_forms_one_cluster(warehouse, tmp_path):
    n, cap = 60, 5
    land(
        warehouse,
        tmp_path / "landing",
        "b1",
        [listing(i, title="Kitchen shop", description=BOILERPLATE) for i in range(n)],
    )
    report = cluster_batch(warehouse, "b1", NearSettings(chunk_size=25, max_candidates=cap))

    # every record meets at most `cap` others (the first stored), not n - 1; each had more (its chunk's, at least)
    assert report.candidate_pairs <= n * cap
    assert len(report.capped) == n and report.as_metadata()["capped_records"] == n
    _, links, clusters = stored(warehouse)
    assert [len(c) for c in clusters] == [n]  # linking to the first members keeps the cluster whole
    assert report.clusters == {clusters[0][0]: n}


def test_each_record_keeps_links_to_its_nearest_earlier_records_only(warehouse, tmp_path):
    """Breaks: 30 identical texts, no cap: every pair is a near duplicate (435 pairs).

    Must hold: all 435 are verified and form one cluster, but a record keeps at most `max_links` links, each
    to a record landed before it; with ties in similarity, to the oldest: 0 + 1 + 2 + 3 * 27 links.
    """
    n = 30
    land(
        warehouse,
        tmp_path / "landing",
        "b1",
        [listing(i, title="Kitchen shop", description=BOILERPLATE) for i in range(n)],
    )
    report = cluster_batch(warehouse, "b1", NearSettings(chunk_size=n, max_candidates=None, max_links=3))
    assert report.candidate_pairs == report.pairs == n * (n - 1) // 2 and not report.capped
    _, links, clusters = stored(warehouse)
    assert [len(c) for c in clusters] == [n]
    assert len(links) == 0 + 1 + 2 + 3 * (n - 3)
    by_owner: dict = {}
    for earlier, later in links:
        by_owner.setdefault(later, []).append(earlier)
    ids = sorted(clusters[0])
    assert all(sorted(e) == ids[: min(3, ids.index(later))] for later, e in by_owner.items())


def _variants(seed: int, count: int) -> list[str]:
    """A base text and copies with a few words replaced: similarities around the threshold."""
    rng = random.Random(seed)
    base = description(seed, words=40).split()
    out = [" ".join(base)]
    for k in range(1, count):
        words = list(base)
        for _ in range(k):
            words[rng.randrange(len(words))] = f"w{rng.randrange(10_000)}"
        out.append(" ".join(words))
    return out


@pytest.mark.parametrize(
    "method, verify", [("minhash", "auto"), ("minhash", "estimate"), ("minhash", "exact"), ("simhash", "estimate")]
)
def test_the_warehouse_path_links_what_the_library_links(warehouse, tmp_path, method, verify):
    texts = [t for seed in (1, 2, 3) for t in _variants(seed, 6)] + [description(100 + i) for i in range(5)]
    rows = [listing(i, title="", description=t) for i, t in enumerate(texts)]
    land(warehouse, tmp_path / "landing", "b1", rows[:10])
    land(warehouse, tmp_path / "landing", "b2", rows[10:])  # partners across batches too
    params = NearDupParams(method=method, verify=verify)
    cluster_batch(warehouse, "b1", NearSettings(params=params, chunk_size=4))
    report = cluster_batch(warehouse, "b2", NearSettings(params=params, chunk_size=4))
    meta = report.as_metadata()
    if method == "minhash":
        assert meta["verify"] == verify and meta["threshold"] == 0.5 and meta["bands_rows"] == "26x3"
    else:  # settings that do not apply to SimHash are not shown as if they did
        assert not {"verify", "threshold", "bands_rows"} & set(meta)
        assert (meta["simhash_max_distance"], meta["similarity_floor"]) == (3, round(1 - 3 / 64, 4))

    by_id, links, clusters = stored(warehouse)
    ids = sorted(by_id)
    labels = cluster_near_duplicates([by_id[i] for i in ids], method=method, verify=verify)
    expected: dict = {}
    for rid, label in zip(ids, labels):
        expected.setdefault(label, []).append(rid)
    assert clusters == sorted(g for g in expected.values() if len(g) > 1)
    assert links and all(s >= (params.threshold if method == "minhash" else 1 - 3 / 64) for s in links.values())
    if verify == "exact":  # the stored similarity is the exact Jaccard of the shingles
        for (a, b), s in links.items():
            sa, sb = (set(params.normaliser.shingle_bytes(by_id[x])) for x in (a, b))
            assert s == pytest.approx(len(sa & sb) / len(sa | sb))


@pytest.mark.parametrize("method", ["minhash", "simhash"])
def test_index_rows_read_back_are_the_rows_a_plain_select_gives(warehouse, tmp_path, method):
    """Breaks: PostgreSQL reads index rows as one row of packed columns (big-endian integers, signatures end to
    end), asked for out of order and with an id the index does not hold; one record has no shingles.

    Must hold: the rows a plain SELECT gives, in id order, the missing id left out, the record without shingles
    not indexable."""
    texts = [t for seed in (1, 2) for t in _variants(seed, 4)] + ["— … —", description(7)]
    rows = [listing(i, title="" if t == "— … —" else f"Kettle {i}", description=t) for i, t in enumerate(texts)]
    land(warehouse, tmp_path / "landing", "b1", rows)
    params = NearDupParams(method=method)
    cluster_batch(warehouse, "b1", NearSettings(params=params, chunk_size=4))
    width, bands = signature_width(params), band_count(params)
    with warehouse.engine.connect() as conn:
        ids = sorted(conn.execute(select(near_index.c.record_id)).scalars())
        got = load_rows(conn, [*reversed(ids), max(ids) + 1000], width, bands)
        selected = _selected_rows(conn, ids, width, bands)
    assert got.ids.tolist() == ids and got.signatures.shape == (len(ids), width)
    for name in ("ids", "signatures", "order", "indexable"):
        np.testing.assert_array_equal(getattr(got, name), getattr(selected, name))
    np.testing.assert_array_equal(got.keys[got.indexable], selected.keys[selected.indexable])
    assert got.indexable.sum() == len(ids) - 1


def test_the_texts_read_back_are_the_texts_of_the_whole_stored_payloads(warehouse, tmp_path):
    """Breaks: PostgreSQL sends only the payload's text fields; titles that are numbers, objects, lists, null or
    missing, a description alone, curly quotes, and a payload far longer than its text.

    Must hold: each record's text is `near_text` of its whole stored payload, on both dialects."""
    from dedup_pipeline.store.near import load_texts, records_to_index

    odd = [12.50, {"en": "Kettle", "n": [1, 2.5]}, ["a", None], None, "“Curly” kettle — 1.7 l", True]
    rows = [listing(i, title=title, notes="x" * 3000) for i, title in enumerate(odd)]
    rows += [{k: v for k, v in listing(9).items() if k != "title"}, listing(10, description="")]
    land(warehouse, tmp_path / "landing", "b1", rows)
    with warehouse.engine.connect() as conn:
        whole = {rid: near_text(p) for rid, p in conn.execute(select(records.c.record_id, records.c.payload))}
        ids = sorted(whole)
        assert load_texts(conn, [*ids, max(ids) + 1]) == whole
        to_index = records_to_index(conn, "b1", 0, 100, band_count(NearDupParams()))
    assert {row.record_id: near_text(row.payload) for row in to_index} == whole
    assert len(set(whole.values())) == len(rows)


def test_records_naming_different_codes_are_not_linked_however_alike(warehouse, tmp_path):
    """Breaks: listings alike but for their model numbers (two products of one line), and a copy whose model
    number is written another way.

    Must hold: the copy links to its original and the other product to neither, in the warehouse as in the
    library call; with `require_shared_code` off, all three are one cluster.
    """
    titles = [
        "iLuv 9.7 Inch Neoprene Sleeve for iPad Pink iCC2010PNK",
        "iLuv 9.7 Inch Neoprene Sleeve for iPad Black iCC2010BLK",
        "iLuv 9.7 inch neoprene sleeve for iPad pink ICC-2010PNK",
    ]
    land(warehouse, tmp_path / "landing", "b1", [listing(i, title=t, description="") for i, t in enumerate(titles)])
    for rule, expected in ((True, [[0, 2]]), (False, [[0, 1, 2]])):
        with warehouse.engine.begin() as conn:  # the index rebuilt under each setting
            for table in (near_duplicate_links, near_duplicate_clusters, near_index):
                conn.execute(table.delete())
        report = cluster_batch(warehouse, "b1", NearSettings(params=NearDupParams(require_shared_code=rule)))
        meta = report.as_metadata()
        assert (meta["require_shared_code"], meta["pairs_apart_by_codes"]) == (rule, 2 if rule else 0)
        texts, _, clusters = stored(warehouse)
        position = {rid: titles.index(text) for rid, text in texts.items()}
        assert [sorted(position[r] for r in c) for c in clusters] == expected
        labels = cluster_near_duplicates(titles, require_shared_code=rule)
        assert [
            m for m in ([i for i, x in enumerate(labels) if x == k] for k in sorted(set(labels))) if len(m) > 1
        ] == (expected)


def test_a_batch_of_near_copies_of_one_text_is_a_runaway_cluster(warehouse, tmp_path):
    folder = tmp_path / "landing"
    land(warehouse, folder, "good", [listing(i) for i in range(80)])
    cluster_batch(warehouse, "good", NearSettings())
    good = runaway_clusters(warehouse, "good", RUNAWAY_CHECK)
    assert good.passed and good.batch_records == 80

    # every record a near copy of one text (one word differs): one cluster swallows the whole batch
    land(warehouse, folder, "bad", [listing(1000 + i, description=near_copy(i)) for i in range(80)])
    cluster_batch(warehouse, "bad", NearSettings())
    bad = runaway_clusters(warehouse, "bad", RUNAWAY_CHECK)
    assert not bad.passed
    [(cluster_id, in_batch, size)] = bad.offenders
    assert in_batch == size == 80 and bad.batch_records == 80
    meta = bad.as_metadata()
    assert meta["offending_clusters"] == [cluster_id] and meta["offending_sizes"] == [80]
    assert "shipping" not in str(meta) and "Product" not in str(meta)  # ids and counts only
    assert "too small" in runaway_clusters(warehouse, "bad", SMALL_BATCHES_PASS).description()
    assert runaway_clusters(warehouse, "bad", SMALL_BATCHES_PASS).passed


def test_unchanged_recrawls_are_not_the_batch_s_records_for_the_runaway_check(warehouse, tmp_path):
    """Breaks: re-crawls, dated to the batch but bringing nothing, beside 60 new near copies of one text; then a
    batch of nothing but re-crawls of those copies.

    Must hold: the first batch fails (its 60 new records are one cluster; once, 300 re-crawls diluted them to
    a pass); the second passes (no new or changed record; once, its re-crawls were counted as a runaway).
    """
    folder = tmp_path / "landing"
    land(warehouse, folder, "b1", [listing(i) for i in range(300)])
    cluster_batch(warehouse, "b1", NearSettings())
    copies = [listing(1000 + i, description=near_copy(i)) for i in range(60)]
    land(warehouse, folder, "b2", [listing(i) for i in range(300)] + copies, landed=1e9 + 10)
    cluster_batch(warehouse, "b2", NearSettings())
    diluted = runaway_clusters(warehouse, "b2", RUNAWAY_CHECK)
    assert not diluted.passed and diluted.batch_records == 60 and diluted.offenders[0][1] == 60
    land(warehouse, folder, "b3", copies, landed=1e9 + 20)
    cluster_batch(warehouse, "b3", NearSettings())
    recrawled = runaway_clusters(warehouse, "b3", RUNAWAY_CHECK)
    assert recrawled.passed and recrawled.batch_records == 0


def test_a_record_changed_by_another_worker_while_this_one_sketched_it_keeps_the_newer_sketch(
    warehouse, tmp_path, monkeypatch
):
    """Breaks: worker X reads record 1 (text A) to sketch it; before X takes the index lock, worker Y changes record 1
    to text B and indexes it (the interleaving is forced by running Y inside X's read).

    Must hold: X does not overwrite Y's sketch with A's: record 1 stays linked to its true partner (text B plus a
    word), not to A's, and its sketch is of the content it holds.
    """
    from dedup_pipeline.ladder import near
    from dedup_pipeline.store.schema import near_index

    text_a, text_b = description(1, words=120), description(2, words=120)
    folder = tmp_path / "landing"
    land(
        warehouse,
        folder,
        "X",
        [listing(1, title="", description=text_a), listing(3, title="", description=text_a + " more")],
    )
    real = near.index.records_to_index

    def y_runs_in_the_window(conn, batch_id, after, limit, bands):
        rows = real(conn, batch_id, after, limit, bands)
        if batch_id == "X" and after == 0:
            land(
                warehouse,
                folder,
                "Y",
                [listing(1, title="", description=text_b), listing(2, title="", description=text_b + " more")],
                landed=1e9 + 10,
            )
            cluster_batch(warehouse, "Y", NearSettings())
        return rows

    monkeypatch.setattr(near.index, "records_to_index", y_runs_in_the_window)
    cluster_batch(warehouse, "X", NearSettings())
    _, links, _ = stored(warehouse)
    with warehouse.engine.connect() as conn:
        ids = dict(conn.execute(select(records.c.natural_key, records.c.record_id)).all())
        stale = conn.execute(
            select(near_index.c.record_id)
            .join(records, records.c.record_id == near_index.c.record_id)
            .where(near_index.c.content_hash != indexed_digest(records.c.content_hash))
        ).all()
    one, two = ids[listing(1)["url"]], ids[listing(2)["url"]]
    assert (min(one, two), max(one, two)) in links and not stale


def test_a_record_that_meets_exactly_the_cap_is_not_capped(warehouse, tmp_path):
    """The newest of `cap` + 1 identical records meets all the others: nothing is left out, so nothing is reported
    capped; one more, and the newest is."""
    folder = tmp_path / "landing"
    land(warehouse, folder, "b1", [listing(i, title="Kitchen shop", description=BOILERPLATE) for i in range(5)])
    cluster_batch(warehouse, "b1", NearSettings(max_candidates=5))
    land(warehouse, folder, "b2", [listing(5, title="Kitchen shop", description=BOILERPLATE)], landed=1e9 + 10)
    report = cluster_batch(warehouse, "b2", NearSettings(max_candidates=5))
    assert (report.candidate_pairs, len(report.capped)) == (5, 0)
    land(warehouse, folder, "b3", [listing(6, title="Kitchen shop", description=BOILERPLATE)], landed=1e9 + 20)
    report = cluster_batch(warehouse, "b3", NearSettings(max_candidates=5))
    assert (report.candidate_pairs, len(report.capped)) == (5, 1)


def test_a_new_price_keeps_the_sketch_links_and_cluster_and_a_new_text_leaves_its_cluster(warehouse, tmp_path):
    """Breaks: two near copies of one text are clustered; then a batch changes the first's price only, and another
    rewrites the second's text entirely.

    Must hold: the price change re-sketches nothing (the text is the same: `kept_sketches`), the cluster and link
    stay; the text change takes the record out of its cluster (the cluster of two is gone) and leaves no link.
    """
    folder = tmp_path / "landing"
    text = description(7, words=80)
    land(
        warehouse, folder, "b1", [listing(1, title="", description=text), listing(2, title="", description=text + " x")]
    )
    cluster_batch(warehouse, "b1", NearSettings())
    _, links, clusters = stored(warehouse)
    assert len(links) == 1 and [len(c) for c in clusters] == [2]

    land(warehouse, folder, "b2", [listing(1, title="", description=text, price="99.00")], landed=1e9 + 10)
    report = cluster_batch(warehouse, "b2", NearSettings())
    assert (report.sketched, report.kept_sketches) == (0, 1)
    assert stored(warehouse)[1:] == (links, clusters)

    land(warehouse, folder, "b3", [listing(2, title="", description=description(8, words=80))], landed=1e9 + 20)
    report = cluster_batch(warehouse, "b3", NearSettings())
    assert report.sketched == 1 and not report.near_duplicates
    assert stored(warehouse)[1:] == ({}, [])


def test_an_index_row_keeps_part_of_the_digest_and_one_written_with_the_whole_digest_stays_current(warehouse, tmp_path):
    """Breaks: the index keeps the first 16 bytes of a record's digest; an earlier version kept all 32.

    Must hold: a sketched record's row holds the part; a row holding the whole digest is current, so an unchanged
    re-crawl re-sketches and re-labels nothing; a price change then re-labels it with the part of the new digest.
    """
    from sqlalchemy import update

    folder = tmp_path / "landing"
    text = description(9, words=80)

    def digests() -> tuple[bytes, bytes]:
        with warehouse.engine.connect() as conn:
            row = conn.execute(
                select(records.c.content_hash, near_index.c.content_hash).join(
                    near_index, near_index.c.record_id == records.c.record_id
                )
            ).one()
        return bytes(row[0]), bytes(row[1])

    land(warehouse, folder, "b1", [listing(1, title="", description=text)])
    cluster_batch(warehouse, "b1", NearSettings())
    whole, kept = digests()
    assert len(whole) == 32 and kept == whole[:16] == indexed_digest(whole)

    with warehouse.engine.begin() as conn:
        conn.execute(update(near_index).values(content_hash=whole))  # as an earlier version wrote it
    land(warehouse, folder, "b2", [listing(1, title="", description=text)], landed=1e9 + 10)
    report = cluster_batch(warehouse, "b2", NearSettings())
    assert (report.sketched, report.kept_sketches) == (0, 0) and digests() == (whole, whole)

    land(warehouse, folder, "b3", [listing(1, title="", description=text, price="99.00")], landed=1e9 + 20)
    report = cluster_batch(warehouse, "b3", NearSettings())
    new, kept = digests()
    assert (report.sketched, report.kept_sketches) == (0, 1) and new != whole and kept == new[:16]


def test_an_index_of_the_earlier_layout_is_refused_with_the_command_that_rebuilds_it(warehouse, tmp_path):
    from dedup_pipeline.store.near import INDEX_IDENTITY, REBUILD_COMMAND, IndexMismatch
    from dedup_pipeline.store.schema import settings
    from dedup_pipeline.store.warehouse import utcnow

    land(warehouse, tmp_path / "landing", "b1", [listing(1)])
    with warehouse.engine.begin() as conn:
        conn.execute(
            settings.insert().values(name=INDEX_IDENTITY, value="neardup/1;method=minhash;...", updated_at=utcnow())
        )
    with pytest.raises(IndexMismatch, match="earlier version") as refused:
        cluster_batch(warehouse, "b1", NearSettings())
    assert REBUILD_COMMAND in str(refused.value)
    with pytest.raises(IndexMismatch, match="keep the original sketch settings"):
        with warehouse.engine.begin() as conn:
            conn.execute(settings.delete())
        cluster_batch(warehouse, "b1", NearSettings())
        cluster_batch(warehouse, "b1", NearSettings(params=NearDupParams(num_perm=64)))


def test_rebuilding_the_index_gives_what_building_it_batch_by_batch_gave(warehouse, tmp_path):
    """Breaks: an index built batch by batch, then dropped and rebuilt in one go (as after an upgrade, or to change
    the sketch settings), including the tables an earlier layout left.

    Must hold: the same links and clusters; the old tables are gone.
    """
    from sqlalchemy import inspect, text

    from dedup_pipeline.ladder.near import rebuild_index

    texts = [t for seed in (1, 2) for t in _variants(seed, 5)]
    folder = tmp_path / "landing"
    land(warehouse, folder, "b1", [listing(i, title="", description=t) for i, t in enumerate(texts[:5])])
    land(
        warehouse,
        folder,
        "b2",
        [listing(i, title="", description=t) for i, t in enumerate(texts[5:], 5)],
        landed=1e9 + 10,
    )
    for key in ("b1", "b2"):
        cluster_batch(warehouse, key, NearSettings())
    before = stored(warehouse)
    with warehouse.engine.begin() as conn:
        conn.execute(text("CREATE TABLE lsh_buckets (band INTEGER)"))
    reports = rebuild_index(warehouse, NearSettings())
    assert [r.batch_id for r in reports] == ["b1", "b2"] and sum(r.sketched for r in reports) == 10
    assert stored(warehouse) == before and before[2]
    assert "lsh_buckets" not in inspect(warehouse.engine).get_table_names()


def test_a_new_threshold_runs_on_an_index_built_at_another_and_warns_when_it_loses_recall(warehouse, tmp_path):
    """Breaks: an index built at the default threshold (0.5: 26 bands of 3 rows); later runs ask for 0.7, then 0.3.

    Must hold: both run on the same index (its bands stay, the threshold filters verified pairs: no link of the
    0.7 run is below 0.7); the run at 0.3, far below what 26 x 3 finds, says so in its figures; bands pinned to
    other values are refused, with the command that rebuilds.
    """
    from dedup_pipeline.store.near import IndexMismatch

    folder = tmp_path / "landing"
    texts = [t for seed in (1, 2, 3) for t in _variants(seed, 6)]
    for b in range(3):
        rows = [listing(10 * b + i, title="", description=t) for i, t in enumerate(texts[6 * b : 6 * b + 6])]
        land(warehouse, folder, f"b{b}", rows, landed=1e9 + b)
    first = cluster_batch(warehouse, "b0", NearSettings())
    assert first.as_metadata()["bands_rows"] == "26x3" and "threshold_warning" not in first.as_metadata()

    strict = cluster_batch(warehouse, "b1", NearSettings(params=NearDupParams(threshold=0.7)))
    meta = strict.as_metadata()
    assert meta["bands_rows"] == "26x3" and meta["threshold"] == 0.7 and "threshold_warning" not in meta
    _, links, _ = stored(warehouse)
    with warehouse.engine.connect() as conn:
        b1 = set(conn.execute(select(records.c.record_id).where(records.c.last_batch_id == "b1")).scalars())
    assert strict.pairs and all(s >= 0.7 for (a, b), s in links.items() if b in b1)

    loose = cluster_batch(warehouse, "b2", NearSettings(params=NearDupParams(threshold=0.3))).as_metadata()
    assert loose["bands_rows"] == "26x3" and "26 bands of 3 rows" in loose["threshold_warning"]

    with pytest.raises(IndexMismatch, match="rebuild-near-index"):
        cluster_batch(warehouse, "b2", NearSettings(params=NearDupParams(bands=20, rows=4), from_index=frozenset()))

    # A batch run again at another threshold indexes nothing: it says its records were indexed already, not 0s
    # that read as "no near duplicates".
    again = cluster_batch(warehouse, "b1", NearSettings(params=NearDupParams(threshold=0.4))).as_metadata()
    assert (again["sketched"], again["already_indexed"]) == (0, 6)
    assert strict.as_metadata()["already_indexed"] == 0


def test_a_warehouse_whose_near_rung_never_ran_changes_its_index_with_the_rungs_defaults(warehouse):
    """Erasure, the retire step and the URL migration link with the settings the rung last used, else the rung's
    own defaults: the same `max_links` and `max_candidates` as a run of the near rung at its defaults."""
    defaults = NearSettings()
    with warehouse.engine.connect() as conn:
        assert link_settings(conn) == (defaults.params, defaults.max_links, defaults.max_candidates)
