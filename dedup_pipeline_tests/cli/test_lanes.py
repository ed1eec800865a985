"""`dedup-pipeline run --workers N`: sources' lanes side by side, the warehouse of one process in landing order."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from sqlalchemy import func, select

from dedup_pipeline.cli import lanes
from dedup_pipeline.cli.lanes import lane_workers, source_lanes
from dedup_pipeline.cli.liveness import PROCESS_TAG
from dedup_pipeline.cli.runner import run_landing_folder
from dedup_pipeline.core.parallel import available_cpus
from dedup_pipeline.store.schema import record_history, records
from dedup_pipeline.store.warehouse import Warehouse
from dedup_pipeline_tests.helpers import database_url, fresh_database, write_batch
from dedup_pipeline_tests.ladder.test_near_order import by_key, syndicated_crawl

LANDED = 1e9


def test_lanes_group_a_sources_batches_in_the_order_given_longest_first():
    keys = ["2026-11-01-a", "2026-11-01-b", "2026-11-02-a", "2026-11-03-a", "2026-11-02-b", "2026-11-01-c"]
    assert source_lanes(keys) == [
        ["2026-11-01-a", "2026-11-02-a", "2026-11-03-a"],
        ["2026-11-01-b", "2026-11-02-b"],
        ["2026-11-01-c"],
    ]


def test_lane_workers_are_one_per_cpu_at_most_one_per_lane_and_one_on_sqlite(monkeypatch):
    monkeypatch.setattr(lanes, "available_cpus", lambda: 4)
    assert lane_workers(0, 3, "postgresql", True) == 3
    assert lane_workers(0, 9, "postgresql", True) == 4
    assert lane_workers(2, 9, "postgresql", True) == 2
    assert lane_workers(8, 1, "postgresql", True) == 1
    assert lane_workers(0, 3, "sqlite", True) == 1  # one writer at a time
    assert lane_workers(0, 3, "postgresql", False) == 1  # an in-memory instance: no other process sees its runs
    with pytest.raises(ValueError):
        lane_workers(-1, 3, "postgresql", True)


def _land(folder, crawl: dict) -> list[str]:
    """The crawl as batch files of two sources, landing one second apart; their keys in landing order."""
    keys = []
    for i, (name, rows) in enumerate(crawl.items()):
        index, source = name.split("_", 1)
        key = f"2026-11-{1 + int(index) // 2:02d}T{int(index) % 2:02d}_{source}"
        write_batch(folder, key, rows, landed=LANDED + i)
        keys.append(key)
    return keys


def _warehouse_by_key(url: str) -> tuple:
    warehouse = Warehouse(url)
    links, clusters = by_key(warehouse)
    with warehouse.engine.connect() as conn:
        stored = set(conn.execute(select(records.c.natural_key, records.c.content_hash)).all())
        history = conn.execute(select(func.count()).select_from(record_history)).scalar_one()
    warehouse.dispose()
    return stored, history, links, clusters


@pytest.mark.postgres
def test_two_sources_side_by_side_give_the_warehouse_of_one_process_in_landing_order(tmp_path, monkeypatch):
    """Breaks: `run_landing_folder` with two workers over batches of two sources whose records are near
    duplicates of each other's (the lanes race on the near index and the clusters), against one process.

    Must hold: both ran in two worker processes' runs of the instance (each lane's canonical rung on its share
    of the CPUs), and the warehouse is the one-process
    run's: the same records and contents, history, links and clusters (by natural key); the summary lists the
    batches in landing order, as the one-process run does.
    """
    crawl = syndicated_crawl(seed=5, stories=8, batches=3)
    keys = _land(tmp_path / "landing", crawl)
    result = {}
    with fresh_database("lanes_one") as one, fresh_database("lanes_two") as two:
        for workers, name in ((1, one), (2, two)):
            url = database_url(name)
            monkeypatch.setenv("DEDUP_DATABASE_URL", url)  # the workers inherit it
            home = tmp_path / f"home{workers}"
            home.mkdir()
            (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
                summary = run_landing_folder(tmp_path / "landing", instance=instance, workers=workers)
                runs = instance.get_runs()
            assert not summary.failed
            assert [b.batch for b in summary.batches] == keys
            assert len(runs) == len(keys) and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
            result[workers] = (_warehouse_by_key(url), len({r.tags.get(PROCESS_TAG) for r in runs}))
            # Lanes share the CPUs: each lane's canonical rung runs on its share, one process runs the resource's.
            shares = {
                r.run_config["resources"].get("ladder", {}).get("config", {}).get("canonical_workers") for r in runs
            }
            assert shares == ({max(1, available_cpus() // 2)} if workers == 2 else {None})
    (serial, serial_processes), (side_by_side, lane_processes) = result[1], result[2]
    assert serial_processes == 1 and lane_processes == 2
    assert serial[2] and any(len(members) > 2 for members, _ in serial[3])
    assert side_by_side == serial


@pytest.mark.postgres
def test_a_side_by_side_run_whose_records_met_max_candidates_says_their_links_may_differ(tmp_path, monkeypatch):
    """Breaks: a run of two lanes in which records met the near rung's `max_candidates` (here 2), whose links
    then depend on what the other lane had indexed.

    Must hold: the run says so in its notices, with the count the batches report; a one-process run of the
    same crawl says nothing of it (its links follow landing order).
    """
    import dataclasses

    from dedup_pipeline.cli import runner
    from dedup_pipeline.defs.resources import NearDupResource

    settings = NearDupResource.settings
    monkeypatch.setattr(NearDupResource, "settings", lambda self: dataclasses.replace(settings(self), max_candidates=2))
    # The lanes run inline, in this process, so that they see the patched setting; the summary is a lanes run's.
    monkeypatch.setattr(runner, "ordered_map", lambda function, items, workers, preload: map(function, items))
    keys = _land(tmp_path / "landing", syndicated_crawl(seed=5, stories=8, batches=2))
    notices = {}
    with fresh_database("lanes_capped_one") as one, fresh_database("lanes_capped_two") as two:
        for workers, name in ((1, one), (2, two)):
            monkeypatch.setenv("DEDUP_DATABASE_URL", database_url(name))
            home = tmp_path / f"home{workers}"
            home.mkdir()
            (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
                summary = run_landing_folder(tmp_path / "landing", instance=instance, workers=workers)
            assert not summary.failed and [b.batch for b in summary.batches] == keys
            capped = sum(b.capped for b in summary.batches)
            notices[workers] = [n for n in summary.notices if "max_candidates" in n]
    assert capped > 0
    assert notices[1] == []
    assert len(notices[2]) == 1 and notices[2][0].startswith(f"{capped} record(s) met")


def test_a_lane_s_run_config_keeps_the_policy_the_environment_sets(monkeypatch):
    """Breaks: a lane's run config gave the `ladder` resource its canonical workers alone, which replaced the
    config the environment had set (DEDUP_ON_CHANGED=keep_first): the lanes decided under upsert."""
    from pathlib import Path

    from dagster._core.execution.build_resources import build_resources

    from dedup_pipeline.cli.runner import run_config_for
    from dedup_pipeline.definitions import defs

    monkeypatch.setenv("DEDUP_ON_CHANGED", "keep_first")
    config = run_config_for(Path("/landing"), canonical_workers=1)
    ladder_config = config["resources"]["ladder"]["config"]
    assert ladder_config == {"on_changed": {"env": "DEDUP_ON_CHANGED"}, "canonical_workers": 1}
    ladder = defs.resolve_job_def("dedup_ladder").resource_defs["ladder"]
    with build_resources({"ladder": ladder}, resource_config={"ladder": config["resources"]["ladder"]}) as built:
        assert built.ladder.settings().policy.on_changed == "keep_first"
    monkeypatch.delenv("DEDUP_ON_CHANGED")
    assert run_config_for(Path("/landing"), canonical_workers=1)["resources"]["ladder"]["config"] == {
        "canonical_workers": 1
    }
