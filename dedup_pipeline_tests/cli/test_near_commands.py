"""`dedup-pipeline rebuild-near-index` and `export-signatures` against a warehouse the ladder filled."""

from __future__ import annotations

import base64
import json
import re
import shlex

import pytest
from datasketch import LeanMinHash, MinHash
from xxhash import xxh32_intdigest

from dedup_pipeline.cli import main
from dedup_pipeline.core.near import NearDupParams, make_params, near_text, sketch_config
from dedup_pipeline.defs.resources import NearDupResource
from dedup_pipeline.ladder.near import cluster_batch
from dedup_pipeline.ladder.settings import NearSettings
from dedup_pipeline.store import near as index
from dedup_pipeline.store.near import IndexMismatch
from dedup_pipeline.store.schema import settings as settings_table
from dedup_pipeline.store.warehouse import utcnow
from dedup_pipeline_tests.helpers import description, listing
from dedup_pipeline_tests.ladder.test_near import land, stored


@pytest.fixture
def filled(warehouse, tmp_path, monkeypatch):
    monkeypatch.setenv("DEDUP_DATABASE_URL", str(warehouse.engine.url.render_as_string(hide_password=False)))
    text = description(3, words=60)
    rows = [listing(1, title="", description=text), listing(2, title="", description=text + " more"), listing(3)]
    land(warehouse, tmp_path / "landing", "b1", rows)
    cluster_batch(warehouse, "b1", NearSettings())
    return warehouse


def test_rebuild_replaces_an_earlier_layouts_index_and_links_the_same(filled, capsys):
    before = stored(filled)
    with filled.engine.begin() as conn:  # a warehouse of the earlier layout: its identity is refused
        conn.execute(
            settings_table.update()
            .where(settings_table.c.name == "near_dup_index_identity")
            .values(value="neardup/1;method=minhash", updated_at=utcnow())
        )
    assert main(["rebuild-near-index", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["batches"] == 1 and figures["sketched"] == 3 and figures["near_duplicates"] == 2
    assert stored(filled) == before and before[1]


def test_rebuild_with_other_bands_builds_the_index_with_them_and_runs_adopt_them(filled, tmp_path, capsys):
    assert main(["rebuild-near-index", "--config", '{"bands": 16, "rows": 8}']) == 0
    with filled.engine.connect() as conn:
        identity = index.stored_identity(conn)
        built = index.adopt_bands(conn, NearDupParams())
    assert "bands=16;rows=8" in identity
    assert (built.bands, built.rows) == (16, 8)
    land(filled, tmp_path / "landing2", "b2", [listing(4)])
    report = cluster_batch(filled, "b2", NearSettings())  # the defaults: bands from the index
    assert report.bands_rows == (16, 8)


def test_runs_that_leave_the_sketch_settings_empty_go_on_with_the_index_as_rebuilt(filled, tmp_path):
    """Breaks: after `rebuild-near-index --config` with other shingles, every run of the default config (the
    command line's `run`, the landing sensor's, the UI's) was refused, since only bands and rows were taken from
    the index. A run that names its own sketch settings is still refused."""
    assert main(["rebuild-near-index", "--config", '{"shingle": "word", "ngram": 2}']) == 0
    words = make_params(shingle="word", ngram=2)
    land(filled, tmp_path / "landing2", "b2", [listing(4)])
    report = cluster_batch(filled, "b2", NearDupResource().settings())
    assert report.bands_rows == (words.bands, words.rows)
    with filled.engine.connect() as conn:
        assert index.stored_identity(conn).endswith(words.identity())
        assert index.link_settings(conn)[0].normaliser == words.normaliser  # erasure relinks with them too
    land(filled, tmp_path / "landing3", "b3", [listing(5)])
    with pytest.raises(IndexMismatch, match="rebuild-near-index"):
        cluster_batch(filled, "b3", NearDupResource(shingle="char").settings())
    assert cluster_batch(filled, "b3", NearDupResource(ngram=2).settings()).sketched == 1  # the index's own


def test_an_index_built_before_its_settings_were_kept_gives_its_bands_and_then_keeps_them(filled, tmp_path):
    with filled.engine.begin() as conn:  # as an earlier version left it: the identity alone
        conn.execute(settings_table.delete().where(settings_table.c.name == index.INDEX_CONFIG))
    land(filled, tmp_path / "landing2", "b2", [listing(4)])
    assert cluster_batch(filled, "b2", NearDupResource(threshold=0.7).settings()).bands_rows == (26, 3)
    with filled.engine.connect() as conn:
        kept = json.loads(conn.execute(select_setting(index.INDEX_CONFIG)).scalar_one())
    assert (kept["method"], kept["bands"], kept["rows"], kept["shingle"]) == ("minhash", 26, 3, "auto")


@pytest.mark.parametrize("kept", ["nothing", "settings without marks"])
def test_an_index_of_text_2_goes_on_under_its_own_rule(warehouse, tmp_path, kept):
    """An index built before text/3 (combining marks stripped, under text/2's name) is every warehouse's until
    it is rebuilt: a run of the default config takes its rule, whether the index kept its settings (from today,
    but without `marks`) or not (before)."""
    text2 = make_params(marks="strip")
    land(warehouse, tmp_path / "landing", "b1", [listing(1), listing(2)])
    cluster_batch(warehouse, "b1", NearSettings(params=text2))
    with warehouse.engine.begin() as conn:
        assert ";text/2;" in index.stored_identity(conn)
        conn.execute(settings_table.delete().where(settings_table.c.name == index.INDEX_CONFIG))
        if kept != "nothing":
            config = {k: v for k, v in sketch_config(text2).items() if k != "marks"}
            conn.execute(
                settings_table.insert().values(name=index.INDEX_CONFIG, value=json.dumps(config), updated_at=utcnow())
            )
        # the link settings kept then (erasure relinks, export-signatures sketch with them) had no marks either
        linked = json.loads(conn.execute(select_setting(index.LINK_SETTINGS)).scalar_one())
        del linked["params"]["normaliser"]["marks"]
        conn.execute(
            settings_table.update()
            .where(settings_table.c.name == index.LINK_SETTINGS)
            .values(value=json.dumps(linked), updated_at=utcnow())
        )
        assert index.link_settings(conn)[0].normaliser.marks == "strip"
    land(warehouse, tmp_path / "landing2", "b2", [listing(3)])
    assert cluster_batch(warehouse, "b2", NearDupResource().settings()).sketched == 1
    with warehouse.engine.connect() as conn:
        assert index.link_settings(conn)[0].normaliser.marks == "strip"
    land(warehouse, tmp_path / "landing3", "b3", [listing(4)])
    with pytest.raises(IndexMismatch, match="rebuild-near-index"):  # naming text/3's rule asks for the rebuild
        cluster_batch(warehouse, "b3", NearDupResource(marks="keep").settings())


def select_setting(name):
    return settings_table.select().with_only_columns(settings_table.c.value).where(settings_table.c.name == name)


def test_export_refuses_a_simhash_index_and_an_unknown_batch_in_one_line(filled, tmp_path, capsys):
    """Breaks: a SimHash index gave a traceback and left an empty --out file; an unknown --batch wrote nothing and
    succeeded."""
    out = tmp_path / "sketches.jsonl"
    assert main(["export-signatures", "--out", str(out), "--batch", "nope"]) == 2
    assert "no batch 'nope' in the warehouse" in capsys.readouterr().err and not out.exists()
    assert main(["rebuild-near-index", "--config", '{"method": "simhash"}']) == 0
    capsys.readouterr()
    assert main(["export-signatures", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "index is simhash, not MinHash" in err and not out.exists()


def test_a_run_refused_for_other_sketch_settings_names_the_rebuild_that_accepts_it(filled, tmp_path):
    """The refusal's command, run as it is given, builds the index the refused run then goes through."""
    words = NearSettings(params=make_params(shingle="word", ngram=2))
    land(filled, tmp_path / "landing2", "b2", [listing(4)])
    with pytest.raises(IndexMismatch) as refused:
        cluster_batch(filled, "b2", words)
    command = re.search(r"`(dedup-pipeline rebuild-near-index --config '[^']+')`", str(refused.value)).group(1)
    assert main(shlex.split(command)[1:]) == 0
    report = cluster_batch(filled, "b2", words)
    with filled.engine.connect() as conn:
        assert index.stored_identity(conn).endswith(words.params.identity())
    assert report.bands_rows == (26, 3)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ('{"bandz": 16}', "no near_dup setting bandz"),
        ('{"bands": 16}', "give both bands and rows"),
        ('{"num_perm": "many"}', "num_perm"),
        ("[16, 8]", "must be a JSON object"),
        ("{bands: 16}", "is not JSON"),
    ],
)
def test_rebuild_refuses_a_wrong_setting_and_leaves_the_index_as_it_was(filled, capsys, config, says):
    """A typo must not rebuild the whole index with the defaults: one line of error, nothing changed."""
    before = stored(filled)
    with filled.engine.connect() as conn:
        identity = index.stored_identity(conn)
    assert main(["rebuild-near-index", "--config", config]) == 1
    assert says in capsys.readouterr().err
    with filled.engine.connect() as conn:
        assert index.stored_identity(conn) == identity
    assert stored(filled) == before


def test_exported_sketches_are_datasketchs_own(filled, tmp_path):
    out = tmp_path / "sketches.jsonl"
    assert main(["export-signatures", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3
    params = NearDupParams()
    by_key = {}
    with filled.engine.connect() as conn:
        from sqlalchemy import select

        from dedup_pipeline.store.schema import records

        by_key = {k: p for k, p in conn.execute(select(records.c.natural_key, records.c.payload))}
    for line in lines:
        sketch = LeanMinHash.deserialize(base64.b64decode(line["lean_minhash"]))
        theirs = MinHash(params.num_perm, seed=params.seed, scheme="affine32", hashfunc=xxh32_intdigest)
        theirs.update_batch(params.normaliser.shingle_bytes(near_text(by_key[line["natural_key"]])))
        assert (sketch.hashvalues == theirs.hashvalues).all()
