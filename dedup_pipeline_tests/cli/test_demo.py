"""The demo crawl's files: the same bytes on every run, so a second `make demo` changes nothing."""

from __future__ import annotations

import time

from dedup_pipeline.cli.demo import write_demo_crawl


def test_the_demo_crawl_is_the_same_bytes_every_time(tmp_path):
    """Breaks: the gzip header carried the current time, so a re-run warned that a batch file changed."""
    first = {p.name: p.read_bytes() for p in write_demo_crawl(tmp_path / "a")}
    time.sleep(1.1)  # gzip stamps whole seconds
    again = {p.name: p.read_bytes() for p in write_demo_crawl(tmp_path / "b")}
    assert first == again
    gz = [data for name, data in first.items() if name.endswith(".gz")]
    assert gz and all(data[4:8] == b"\0\0\0\0" for data in gz)  # MTIME: no time in the header
