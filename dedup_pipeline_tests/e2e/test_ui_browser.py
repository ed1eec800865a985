"""The Dagster UI in a real browser: `dagster dev` on a temporary instance, driven by headless Chromium.

What a user sees after a crawl has run: the four assets in the asset graph
and their check summaries (a check whose only failures are "not judged" is
yellow, never red), the collapse-rate check and its plot on the Checks tab of
`deduplicated_records`, a check that could not judge in its execution history,
the landing sensor's skip reason in its tick list, the ladder funnel picture,
and the rehash job's Partitions page with its "Launch backfill…" button. Screenshots go to
`test-artifacts/ui/` (git-ignored); the README's pictures in docs/screenshots/
are copies of them.

Debian's `chromium` package is driven through Playwright (Playwright's own
browser download does not work here); `.ci/run` installs it, so CI never
skips. The test skips, saying so, only when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from dedup_pipeline.cli.demo import write_demo_crawl
from dedup_pipeline_tests.e2e.dagster_dev import BIN, LOCATION, REPO, Server, start_server, wait_until
from dedup_pipeline_tests.helpers import listing, write_batch

# The module's fixture boots `dagster dev` (up to two attempts of BOOT_TIMEOUT) and waits for a run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CHROMIUM = Path(os.environ.get("DEDUP_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
]
ARTIFACTS = REPO / "test-artifacts" / "ui"
ASSETS = ["raw_crawl_batches", "canonical_records", "deduplicated_records", "near_duplicate_clusters"]
RECRAWL = "2026-11-05-market"  # a new source: its first crawl is judged by the fixed band alone
SET_ASIDE = "crawl 1.jsonl"  # not a batch key: the sensor leaves it alone and says why
DEMO_BATCHES = ["2026-11-01-shop", "2026-11-02-shop", "2026-11-02-syndication", "2026-11-03-shop", "2026-11-04-shop"]


def launch_partition(server: Server, key: str) -> str:
    """Register the partition and launch the ladder for it through the run queue (the daemon), as the UI does."""
    added = server.graphql(
        """mutation($r: RepositorySelector!, $p: String!, $k: String!) {
             addDynamicPartition(repositorySelector: $r, partitionsDefName: $p, partitionKey: $k) {
               __typename ... on PythonError { message } } }""",
        {"r": LOCATION, "p": "crawl_batches", "k": key},
    )["addDynamicPartition"]
    assert added["__typename"] == "AddDynamicPartitionSuccess", added
    launched = server.graphql(
        """mutation($e: ExecutionParams!) { launchRun(executionParams: $e) {
             __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
             ... on RunConfigValidationInvalid { errors { message } } } }""",
        {
            "e": {
                "selector": {**LOCATION, "jobName": "dedup_ladder"},
                "runConfigData": {},  # the job's own executor: one process for the whole run
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": key}]},
            }
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def start_landing_sensor(server: Server) -> None:
    """Switch the landing sensor on, as its toggle under **Automation** does."""
    started = server.graphql(
        """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
             __typename ... on PythonError { message } } }""",
        {"s": {**LOCATION, "sensorName": "landing_sensor"}},
    )["startSensor"]
    assert started["__typename"] == "Sensor", started


def skipped_tick_reason(server: Server) -> str | None:
    """The skip reason of the landing sensor's newest skipped tick, once there is one."""
    sensor = server.graphql(
        """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
             ... on Sensor { sensorState { ticks(limit: 5) { status skipReason } } } } }""",
        {"s": {**LOCATION, "sensorName": "landing_sensor"}},
    )["sensorOrError"]
    return next((t["skipReason"] for t in sensor["sensorState"]["ticks"] if t["status"] == "SKIPPED"), None)


def run_status(server: Server, run_id: str) -> str | None:
    status = server.graphql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", {"id": run_id})
    value = status["runOrError"]["status"]
    return value if value in ("SUCCESS", "FAILURE", "CANCELED") else None


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """The server, after the demo crawl (command line) and a re-crawl launched through the run queue."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install Debian's chromium package (`.ci/run` does) to run the browser test"
        )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tmp_path = tmp_path_factory.mktemp("ui")
    home, landing = tmp_path / "dagster_home", tmp_path / "landing"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    write_demo_crawl(landing)
    env = {k: v for k, v in os.environ.items() if k != "DEDUP_AUTOMATION"}
    env.update(
        DAGSTER_HOME=str(home),
        DEDUP_DATABASE_URL=f"sqlite:///{tmp_path / 'warehouse.sqlite'}",
        DEDUP_LANDING_DIR=str(landing),
        DEDUP_DATA_DIR=str(tmp_path / "data"),
        PYTHONWARNINGS="ignore",
    )
    # The demo crawl through the command line first, then the server over the same instance and warehouse.
    cli = subprocess.run(
        [str(BIN / "dedup-pipeline"), "run", "--json"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    summary = json.loads(cli.stdout.strip().splitlines()[-1])
    assert [b["batch"] for b in summary["batches"]] == DEMO_BATCHES
    assert summary["warehouse_records"] == sum(b["new"] for b in summary["batches"]) > 0
    server = start_server(env, ARTIFACTS / "dagster-dev.log")
    try:
        # A new source's crawl of 150 products, 30 of them fetched twice: big enough for the collapse check to judge.
        write_batch(
            landing,
            RECRAWL,
            [listing(n) for n in range(150)] + [listing(n, crawl_id="again") for n in range(30)],
            landed=time.time() - 60,
        )
        run_id = launch_partition(server, RECRAWL)
        status = wait_until(f"run {run_id}", lambda: run_status(server, run_id), timeout=600, every=2)
        assert status == "SUCCESS", f"run {run_id}: {status}; the server's log ends:\n{server.log_tail()}"
        # A file that is no batch (a space in its name), then the landing sensor on: it has nothing new to run,
        # and its tick says so, naming the file it set aside.
        (landing / SET_ASIDE).write_text(json.dumps(listing(1)) + "\n")
        start_landing_sensor(server)
        reason = wait_until("a skipped tick of landing_sensor", lambda: skipped_tick_reason(server), 300, every=2)
        assert reason.startswith("no new batch files; ignored: crawl 1.jsonl: its name"), reason
        yield server
    finally:
        server.stop()


@contextmanager
def browser_page(name: str):
    """A headless Chromium page; on failure a screenshot `<name>-failure.png` and the page's HTML show what the
    browser saw."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(60_000)
        expect.set_options(timeout=180_000)  # the graph's live data can take minutes on a loaded two-core machine
        try:
            yield page
        except Exception:
            page.screenshot(path=ARTIFACTS / f"{name}-failure.png")
            (ARTIFACTS / f"{name}-failure.html").write_text(page.content())
            raise
        finally:
            browser.close()


def test_ui_shows_the_ladder_its_checks_plots_and_funnel(ui):
    from playwright.sync_api import expect

    server = ui
    with browser_page("ladder") as page:
        page.goto(server.url + "/locations/dedup_pipeline/asset-groups/dedup_ladder")
        for name in ASSETS:
            expect(page.get_by_text(name, exact=True).first).to_be_visible()
        # the check summaries of canonical_records, deduplicated_records and near_duplicate_clusters,
        # once the graph's live data has loaded. A check counts as passed in the summary only if it passed on
        # every partition: the demo's small batches leave some checks "not judged" (a warning), so only the
        # canonical rung's two checks pass everywhere.
        expect(page.get_by_text(re.compile(r"^\d+ / \d+ Passed$"))).to_have_count(3)
        expect(page.get_by_text("2 / 2 Passed", exact=True)).to_be_visible()
        # Each summary's icon: the later rungs' only failures are "not judged" warnings, so they are yellow, the
        # blocking runaway check too (a pass carries the severity of the failures that stand), never red.
        icons = {
            "canonical_records": "done",
            "deduplicated_records": "warning_outline",
            "near_duplicate_clusters": "warning_outline",
        }
        for name, icon in icons.items():
            summary = page.locator(f"a[href='/assets/{name}?view=checks'] [role=img]")
            expect(summary).to_have_attribute("aria-label", icon)
            expect(summary).to_have_attribute("style", re.compile("accent-(green|yellow)"))
        page.screenshot(path=ARTIFACTS / "asset-graph.png")

        page.goto(server.url + "/assets/near_duplicate_clusters?view=checks")
        expect(page.get_by_text("no_runaway_cluster", exact=True).first).to_be_visible()
        # the re-crawl is large enough to judge: its verdict, not a "too small" pass
        expect(page.get_by_text("no cluster holds more than 20% of the batch's 150 records")).to_be_visible()

        page.goto(server.url + "/assets/deduplicated_records?view=checks")
        expect(page.get_by_text("collapse_rate_in_band", exact=True).first).to_be_visible()
        expect(page.get_by_text("collapse rate 0.167 in [0.010, 0.950]: in band")).to_be_visible()
        expect(page.get_by_text(RECRAWL, exact=True).first).to_be_visible()
        plot = page.locator("xpath=//span[text()='collapse_rate']/parent::div/following-sibling::div//canvas")
        expect(plot).to_be_visible()
        page.get_by_text("Plots", exact=True).scroll_into_view_if_needed()
        page.wait_for_timeout(1500)  # let the chart finish its animation before the picture
        page.screenshot(path=ARTIFACTS / "collapse-check.png")

        page.goto(server.url + "/assets/near_duplicate_clusters")
        page.get_by_text("[Show Markdown]").first.click()
        funnel = page.locator("img[src^='data:image/png;base64,']")
        expect(funnel).to_be_visible()
        assert funnel.evaluate("img => img.naturalWidth") > 100
        page.screenshot(path=ARTIFACTS / "funnel.png")


def test_rehash_job_partitions_page_offers_a_backfill(ui):
    from playwright.sync_api import expect

    with browser_page("rehash") as page:
        page.goto(ui.url + "/locations/dedup_pipeline/jobs/rehash_content_v2/partitions")
        # An asset job's Partitions page opens the backfill dialog from "Materialize…" (an op job's shows
        # "Launch backfill…" right on the page); either way the user ends at an enabled "Launch backfill".
        opener = page.locator("button", has_text=re.compile(r"^(Materialize|Launch backfill)…$")).first
        expect(opener).to_be_enabled()
        opener.click()
        page.get_by_text("All", exact=True).first.click()
        expect(page.get_by_text(re.compile(r"^\d+ partitions selected$"))).to_be_visible()
        expect(page.locator("button", has_text=re.compile(r"^Launch backfill…?$")).last).to_be_enabled()
        page.screenshot(path=ARTIFACTS / "rehash-backfill.png")


def test_ui_shows_the_sensors_skip_reason_and_a_check_that_could_not_judge(ui):
    """The landing sensor set a file aside (see the fixture): its tick says which and why where the tick list
    shows it; and a check that could not judge reads as a warning that says so, never as Passed."""
    from playwright.sync_api import expect

    with browser_page("sensor") as page:
        page.goto(ui.url + "/locations/dedup_pipeline/sensors/landing_sensor")
        # A skipped tick's status tag reads "0 runs requested" (first the latest tick's, then the tick list's,
        # newest first); hovering the tick list's shows the skip reason.
        status = page.get_by_text("0 runs requested", exact=True).nth(1)
        expect(status).to_be_visible()
        status.hover()
        expect(page.get_by_text(re.compile(r"^no new batch files; ignored: crawl 1\.jsonl: its name"))).to_be_visible()
        page.screenshot(path=ARTIFACTS / "sensor-skip.png")

        # A check that could not judge: the demo's syndication batch (8 records) in the collapse check's execution
        # history, a warning ("Failed", yellow) whose first line says it was not judged, and why.
        page.goto(ui.url + "/assets/deduplicated_records?view=checks&checkDetail=collapse_rate_in_band")
        page.get_by_text("Execution history", exact=True).click()
        row = page.locator("tr", has_text="2026-11-02-syndication")
        expect(row).to_contain_text("not judged: batch too small to judge (8 < 100 records); collapse rate 0.000")
        expect(row.get_by_text("Failed", exact=True)).to_be_visible()
        expect(row.locator("[role=img][aria-label=warning_outline]")).to_be_visible()
        expect(row.locator("[role=img][aria-label=cancel]")).to_have_count(0)
        page.screenshot(path=ARTIFACTS / "not-judged.png")
