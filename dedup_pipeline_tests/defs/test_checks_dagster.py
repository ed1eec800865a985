"""The asset checks in Dagster, in process: what they report, what blocks, and the failure alert."""

from __future__ import annotations

import logging

import dagster as dg
import pytest
from sqlalchemy import func, insert, select

from dedup_pipeline.cli.demo import write_demo_crawl
from dedup_pipeline.definitions import defs
from dedup_pipeline.defs.alerts import ladder_failure_alert
from dedup_pipeline.defs.assets import (
    COLLAPSE_CHECK,
    canonical_records,
    deduplicated_records,
    ladder_assets,
    raw_crawl_batches,
)
from dedup_pipeline.defs.checks import (
    GE_CHECK,
    INTEGRITY_CHECK,
    QUARANTINE_CHECK,
    RUNAWAY_CHECK,
    SEEN_SET_CHECK,
    collapse_rate_in_band,
    ladder_checks,
)
from dedup_pipeline.defs.partitions import crawl_batches_partitions
from dedup_pipeline.defs.resources import (
    SeenSetResource,
)
from dedup_pipeline.landing import list_batches
from dedup_pipeline.store.schema import dedup_decisions, records
from dedup_pipeline.store.warehouse import Warehouse, utcnow
from dedup_pipeline_tests.defs.common import ladder_resources
from dedup_pipeline_tests.helpers import listing, write_batch
from dedup_pipeline_tests.quality.common import sliding_batches


def run(instance, url, folder, key, selection=None, seen_set=None, **ladder):
    return dg.materialize(
        [*ladder_assets, *ladder_checks],
        partition_key=key,
        instance=instance,
        selection=selection,
        resources=ladder_resources(url, folder, seen_set, **ladder),
        raise_on_error=False,
    )


def evaluations(result) -> dict:
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def values(metadata) -> dict:
    return {k: v.value for k, v in metadata.items()}


def test_every_check_passes_on_the_demo_crawl_and_the_ui_gets_its_figures(tmp_path):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_demo_crawl(folder)
    keys = [b.key for b in list_batches(folder)]
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, keys)
    history_judged, syndication = 0, {}
    for key in keys:
        result = run(instance, url, folder, key)
        assert result.success
        checks = evaluations(result)
        if key == "2026-11-02-syndication":
            syndication = {"result": result, "checks": checks}
        assert set(checks) == {
            ("canonical_records", GE_CHECK),
            ("canonical_records", QUARANTINE_CHECK),
            ("deduplicated_records", COLLAPSE_CHECK),
            ("deduplicated_records", INTEGRITY_CHECK),
            ("deduplicated_records", GE_CHECK),
            ("deduplicated_records", SEEN_SET_CHECK),
            ("near_duplicate_clusters", RUNAWAY_CHECK),
        }
        # a check either passes, or could not judge and says so as a warning, never as a pass
        judged = {k: e for k, e in checks.items() if not e.description.startswith("not judged: ")}
        assert all(e.passed for e in judged.values()), {k: e.description for k, e in judged.items() if not e.passed}
        for name, e in checks.items():
            if name not in judged:
                assert not e.passed and e.severity == dg.AssetCheckSeverity.WARN and e.metadata["judged"].value is False
        assert all(e.partition == key for e in checks.values())
        collapse = checks[("deduplicated_records", COLLAPSE_CHECK)]
        asset_rate = result.asset_materializations_for_node("deduplicated_records")[0].metadata["collapse_rate"]
        assert collapse.metadata["collapse_rate"].value == asset_rate.value  # the check and the asset agree
        if key.endswith("-shop"):  # every shop crawl is big enough to judge; the fourth against its history
            assert ("deduplicated_records", COLLAPSE_CHECK) in judged, collapse.description
            history_judged += "trailing_median" in collapse.metadata
        else:
            assert collapse.description.startswith("not judged: batch too small to judge (8 < 100 records)")
    assert history_judged == 1

    result, checks = syndication["result"], syndication["checks"]
    suite = values(checks[("canonical_records", GE_CHECK)].metadata)
    assert suite["failed"] == 0 and suite["evaluated"] == 11 and suite["unexpected MatchRegex(canonical_url)"] == 0
    assert "`BeInSet(hash_version)` | passed" in suite["results"]
    near = values(result.asset_materializations_for_node("near_duplicate_clusters")[0].metadata)
    assert near["funnel"].startswith("![ladder funnel of batch 2026-11-02-syndication](data:image/png;base64,iVBOR")
    assert (near["funnel/lines"], near["funnel/exact_survivors"], near["funnel/near_distinct"]) == (8, 8, 0)
    clusters = near["largest_clusters"]
    assert isinstance(clusters, dg.TableMetadataValue)
    rows = [record.data for record in clusters.records]
    assert len(rows) == near["clusters_touched"] == 8 and all(row["records"] == 2 for row in rows)


def test_a_batch_of_mostly_broken_lines_is_blocked_before_the_warehouse(tmp_path):
    """Breaks: a batch of 3 records among 12 broken lines passed every check ("too small to judge")."""
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(3)] + ["{broken"] * 12, landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1"])
    result = run(instance, url, folder, "b1")

    assert not result.success
    check = evaluations(result)[("canonical_records", QUARANTINE_CHECK)]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert check.description.startswith("12 of 15 lines quarantined (80.0%") and "blocked" in check.description
    assert not result.asset_materializations_for_node("deduplicated_records")


def test_a_broken_canonicalisation_is_blocked_before_the_warehouse(tmp_path, monkeypatch):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(30)], landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1"])
    # A canonicaliser release that stamps rows with a URL version no rule knows.
    from dedup_pipeline.ladder import canonical_lines

    def stamped(*args, **kwargs):
        out = canonical_lines.canonicalise_lines(*args, **kwargs)
        out.rows = [row[:4] + ("url/0",) + row[5:] for row in out.rows]
        return out

    monkeypatch.setattr("dedup_pipeline.ladder.canonical.canonicalise_lines", stamped)
    result = run(instance, url, folder, "b1")

    assert not result.success
    suite = evaluations(result)[("canonical_records", GE_CHECK)]
    assert not suite.passed and suite.severity == dg.AssetCheckSeverity.ERROR
    assert "`BeInSet(url_version)` | FAILED | 30 | url/0" in suite.metadata["results"].value
    assert not result.asset_materializations_for_node("deduplicated_records")
    with Warehouse(url).engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 0


def test_an_integrity_failure_blocks_near_duplicates_and_raises_a_clear_alert(tmp_path, monkeypatch, caplog):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(30)], landed=1e9)
    monkeypatch.setenv("DEDUP_DATABASE_URL", url)
    monkeypatch.setenv("DEDUP_LANDING_DIR", str(folder))
    warehouse = Warehouse(url).create_schema()
    with warehouse.engine.begin() as conn:  # a buggy writer logged a truncated digest for this batch
        conn.execute(
            insert(dedup_decisions).values(
                batch_id="b1",
                line_no=0,
                run_id="rogue",
                natural_key="k",
                hash_version="content/1",
                content_hash=b"\x01" * 31,
                decision="new",
                decided_at=utcnow(),
            )
        )
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1"])
    result = defs.resolve_job_def("dedup_ladder").execute_in_process(
        partition_key="b1", instance=instance, raise_on_error=False
    )

    assert not result.success
    integrity = evaluations(result)[("deduplicated_records", INTEGRITY_CHECK)]
    assert not integrity.passed and integrity.metadata["malformed_hashes"].value == 1
    assert result.asset_materializations_for_node("deduplicated_records")
    assert not result.asset_materializations_for_node("near_duplicate_clusters")

    context = dg.build_run_status_sensor_context(
        sensor_name=ladder_failure_alert.name,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(),
    ).for_run_failure()
    with caplog.at_level(logging.ERROR, logger="dedup_pipeline.alerts"):
        ladder_failure_alert(context)
    [alert] = [r.getMessage() for r in caplog.records if r.name == "dedup_pipeline.alerts"]
    assert alert.startswith(
        "ALERT dedup run failed: job=dedup_ladder partition=b1 step=deduplicated_records_warehouse_integrity"
    )
    assert (
        "error=DagsterAssetCheckFailedError: 1 blocking asset check failed" in alert
        and f"run_id={result.run_id}" in alert
    )
    assert "warehouse_integrity" in alert.split("error=")[1] and alert.count("DagsterAssetCheckFailedError") == 1


def test_a_permanent_error_fails_its_step_at_once_and_the_alert_names_it(tmp_path, monkeypatch, caplog):
    """Breaks: a batch's near rung meets an index built another way (the near_dup resource switched to SimHash
    over a MinHash index), an error no retry can clear.

    Must hold: the step fails at once, without its retry policy's two retries; the alert gives the error itself
    (once it said "Exceeded max_retries of 2"); and a failed run the instance will run again raises no alert.
    """
    from dedup_pipeline.defs.alerts import WILL_RETRY_TAG

    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(10)], landed=1e9)
    write_batch(folder, "b2", [listing(n) for n in range(10, 20)], landed=1e9 + 60)
    monkeypatch.setenv("DEDUP_DATABASE_URL", url)
    monkeypatch.setenv("DEDUP_LANDING_DIR", str(folder))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1", "b2"])
    job = defs.resolve_job_def("dedup_ladder")
    assert job.execute_in_process(partition_key="b1", instance=instance).success
    simhash = {"resources": {"near_dup": {"config": {"method": "simhash"}}}}
    result = job.execute_in_process(partition_key="b2", instance=instance, run_config=simhash, raise_on_error=False)
    assert not result.success
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]

    def alerts_for(run):
        context = dg.build_run_status_sensor_context(
            sensor_name=ladder_failure_alert.name,
            dagster_instance=instance,
            dagster_run=run,
            dagster_event=result.get_run_failure_event(),
        ).for_run_failure()
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="dedup_pipeline.alerts"):
            ladder_failure_alert(context)
        return [r.getMessage() for r in caplog.records if r.name == "dedup_pipeline.alerts"]

    [alert] = alerts_for(result.dagster_run)
    assert "step=near_duplicate_clusters error=IndexMismatch: " in alert and "max_retries" not in alert
    instance.add_run_tags(result.run_id, {WILL_RETRY_TAG: "true"})
    assert alerts_for(instance.get_run_by_id(result.run_id)) == []


def test_a_noisy_batch_warns_on_its_quarantine_rate(tmp_path):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(
        folder, "noisy", [listing(n) for n in range(30)] + ["{broken"] * 8 + [{"title": "no url"}] * 2, landed=1e9
    )
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["noisy"])
    selection = dg.AssetSelection.assets(
        raw_crawl_batches, canonical_records
    ).without_checks() | dg.AssetSelection.checks(dg.AssetCheckKey(canonical_records.key, QUARANTINE_CHECK))
    result = run(instance, url, folder, "noisy", selection=selection)
    assert result.success
    check = evaluations(result)[("canonical_records", QUARANTINE_CHECK)]
    meta = values(check.metadata)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert (meta["quarantined"], meta["lines"], meta["quarantined/raw"], meta["quarantined/canonical"]) == (
        10,
        40,
        8,
        2,
    )
    assert meta["quarantine_rate"] == pytest.approx(0.25) and "| raw | malformed JSON" in meta["top_reasons"]


def test_the_seen_set_check_warns_when_a_bloom_fills_up_or_redis_is_down(tmp_path, monkeypatch):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(60)], landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1"])
    selection = dg.AssetSelection.assets(
        raw_crawl_batches, canonical_records, deduplicated_records
    ).without_checks() | (dg.AssetSelection.checks(dg.AssetCheckKey(deduplicated_records.key, SEEN_SET_CHECK)))

    def seen_set_check(seen_set):
        result = run(instance, url, folder, "b1", selection=selection, seen_set=seen_set)
        assert result.success  # a warning, never a failed run: the warehouse decided every record
        check = evaluations(result)[("deduplicated_records", SEEN_SET_CHECK)]
        return check, values(check.metadata)

    full, figures = seen_set_check(SeenSetResource(kind="bloom", bloom_capacity=50))  # 60 digests
    assert (
        not full.passed and full.severity == dg.AssetCheckSeverity.WARN and "raise bloom_capacity" in full.description
    )
    assert figures["seen_set_fill"] > 1 and figures["max_seen_set_fill"] == 0.9

    roomy, figures = seen_set_check(SeenSetResource(kind="bloom", bloom_capacity=10_000))  # a new filter size
    assert roomy.passed and figures["seen_set_fill"] < 0.01 and figures["seen_set_fallbacks"] == 0

    monkeypatch.setenv("DEDUP_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens: a stopped Redis
    down, figures = seen_set_check(SeenSetResource(kind="redis"))
    assert not down.passed and "unavailable" in down.description and figures["seen_set_fallbacks"] >= 1


def test_the_collapse_check_errors_when_a_volatile_field_leaks_into_the_hash(tmp_path):
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    keys = sliding_batches(folder, 5, leak_in=4)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, keys)
    selection = dg.AssetSelection.assets(
        raw_crawl_batches, canonical_records, deduplicated_records
    ).without_checks() | (dg.AssetSelection.checks(collapse_rate_in_band))
    results = [run(instance, url, folder, key, selection=selection) for key in keys]
    assert all(r.success for r in results)  # the collapse check reports, it does not block
    checks = [evaluations(r)[("deduplicated_records", COLLAPSE_CHECK)] for r in results]
    assert [c.passed for c in checks] == [False, True, True, True, False]  # the first batch has nothing to collapse
    leak = values(checks[-1].metadata)
    assert checks[-1].severity == dg.AssetCheckSeverity.ERROR and "collapsed toward zero" in leak["note"]
    assert leak["history_batches"] == 4 and leak["trailing_median"] == pytest.approx(1 / 3, abs=1e-4)  # rounded
    assert leak["collapse_rate"] == 0.0 and leak["lower_bound"] == pytest.approx(1 / 12, abs=1e-4)


def test_a_large_batch_goes_through_worker_processes_and_passes_every_check(tmp_path, monkeypatch):
    """`canonical_workers` from the ladder resource; the asset reports the workers; the checks see every row."""
    monkeypatch.setattr("dedup_pipeline.ladder.canonical.PARALLEL_FLOOR", 50)  # a small batch still goes to the pool
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    crawl = [listing(n) for n in range(200)] + [listing(n, crawl_id="again") for n in range(200)]  # re-crawled
    write_batch(folder, "big", crawl, landed=1_700_000_000)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["big"])
    result = run(instance, url, folder, "big", chunk_size=40, canonical_workers=3)  # not the default (one per CPU)
    assert result.success
    figures = values(result.asset_materializations_for_node("canonical_records")[0].metadata)
    assert (figures["workers"], figures["canonical"], figures["quarantined"]) == (3, 400, 0)
    assert {name: e.passed for (_, name), e in evaluations(result).items() if not e.passed} == {}


def test_a_missing_landing_file_fails_its_run_without_turning_every_check_red(tmp_path):
    """Breaks: "Materialize" on a batch whose file is gone failed with `no landing file for batch …`, and every
    check of the three later assets then showed Failed: Dagster resolves a check a failed run planned but never
    ran as "execution failed". Must hold: the run fails with the reason; each of those checks' latest result
    on the batch is a warning saying it was not judged, and why."""
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    write_batch(folder, "b1", [listing(n) for n in range(30)], landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["b1"])
    assert run(instance, url, folder, "b1").success
    (folder / "b1.jsonl").unlink()
    result = run(instance, url, folder, "b1")

    assert not result.success
    error = result.failure_data_for_node("raw_crawl_batches").error
    assert "no landing file for batch 'b1'" in error.message
    keys = [key for check in ladder_checks for key in check.check_keys]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    assert len(latest) == 7
    for key, record in latest.items():
        assert record.status.value == "FAILED", key  # an evaluation (a warning here), not "planned"
        evaluation = record.event.dagster_event.event_specific_data
        assert evaluation.severity == dg.AssetCheckSeverity.WARN and evaluation.partition == "b1"
        assert evaluation.description.startswith("not judged: its run failed before it: BatchFileError: no landing")


def latest_results(instance) -> dict:
    """(asset, check name) -> (status, severity, description) of each ladder check's latest result."""
    keys = [key for check in ladder_checks for key in check.check_keys]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    results = {}
    for key, record in latest.items():
        evaluation = record.event.dagster_event.event_specific_data if record.event else None
        severity = getattr(evaluation, "severity", None)
        description = getattr(evaluation, "description", None) or ""
        results[(key.asset_key.path[-1], key.name)] = (record.status.value, severity, description)
    return results


def test_an_unreadable_file_and_a_blocking_check_leave_the_checks_after_them_not_judged(tmp_path):
    """Breaks: a `.gz` that is not gzip failed the raw rung inside its work (not at finding the file), and a
    mostly broken batch failed the blocking quarantine check: either way the checks that never ran showed
    "execution failed", red, as if each had found a fault. Must hold: each is a warning that says why it was
    not judged; the blocking check itself stays the error it is."""
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    folder.mkdir()
    (folder / "gz.jsonl.gz").write_bytes(b"not gzip at all\n")
    write_batch(folder, "broken", [listing(n) for n in range(10)] + ["{broken"] * 20, landed=1e9)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["gz", "broken"])

    for attempt in range(2):  # the second failure of a batch said IntegrityError (of Dagster's check index)
        result = run(instance, url, folder, "gz")
        assert not result.success
        error = result.failure_data_for_node("raw_crawl_batches").error.message
        assert "BatchFileError" in error and "IntegrityError" not in error, (attempt, error)
        results = latest_results(instance)
        assert len(results) == 7
        for name, (status, severity, description) in results.items():
            assert (status, severity) == ("FAILED", dg.AssetCheckSeverity.WARN), name
            assert description.startswith("not judged: its run failed before it: BatchFileError:"), name

    assert not run(instance, url, folder, "broken").success
    results = latest_results(instance)
    assert results.pop(("canonical_records", QUARANTINE_CHECK))[1] == dg.AssetCheckSeverity.ERROR  # the fault: red
    later = {name: r for name, r in results.items() if r[0] != "SUCCEEDED"}
    assert later, results
    for name, (status, severity, description) in later.items():
        assert (status, severity) == ("FAILED", dg.AssetCheckSeverity.WARN), name
        assert description.startswith(f"not judged: {QUARANTINE_CHECK} blocked the run:"), name


def test_an_empty_batch_is_not_a_green_quarantine_check(tmp_path):
    """Breaks: a 0-byte landing file went all green, the quarantine check included ("0 of 0 lines quarantined:
    under the bound"), though a crawl that wrote nothing is worth a look.

    Must hold: the run succeeds, and the quarantine check says the batch has no lines, as a warning.
    """
    folder, url = tmp_path / "landing", f"sqlite:///{tmp_path / 'w.sqlite'}"
    folder.mkdir()
    (folder / "empty.jsonl").write_bytes(b"")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(crawl_batches_partitions.name, ["empty"])
    result = run(instance, url, folder, "empty")
    assert result.success
    check = evaluations(result)[("canonical_records", QUARANTINE_CHECK)]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert "the batch has no lines" in check.description
