"""Canonicalisation plus hashing alone: the seeds' `canonicalise` + `content_hash` against ours, in one run.

    python benchmarks/bench_canonical.py [--records 100000] [--repeat 5] [--chunk 2000]

Corpus: `crawl_with_duplicates(N)` (half exact re-crawls), records as the seeds
expect them (price a float), with tracking parameters in their URLs.
`content/1` hashes the `url/1` form of the URL, which the seeds' `canonicalise`
does not compute (their first step, `canonical_url`, is a separate function,
and lossy). So that the digests are comparable (they are asserted identical
over the whole corpus before anything is timed), the seeds' side is given the
canonical URL in one of two ways, both timed and both printed:
- "url/1 done beforehand": the URLs are put in `url/1` form before the clock
  starts, so the seeds' side does no URL work while ours still canonicalises
  every URL inside the timing (`content_hashes` cannot know they are canonical);
- "url/1 by urllib.parse": the seeds' side canonicalises each URL inside the
  timing with the straightforward `urllib.parse` version of the `url/1` rules
  (`baseline_canonicalize` from bench_url.py), then runs `canonicalise` +
  `content_hash`: both sides do the same work.

Timed, chunk by chunk (`--chunk` records), alternating so that both see the same
machine load, each going first on every other chunk (the first reads the chunk
into the CPU cache); each repeat covers the corpus once per implementation:
- seed: `seed_content_hash(record)` per record (the seeds' code, from bench_exact),
  after `baseline_canonicalize` of its URL in the "by urllib.parse" pair;
- ours: `content_hashes(chunk, "content/1")`, the column-wise batch path;
- "no url": the same two on the records without their `url` field, so neither
  side does URL work (the seeds never canonicalise URLs; ours does, for `url/1`).
For information, on the same records as the ladder reads them (`parse_line`:
exact Decimal prices, so `content/2` applies too):
- parse_line: the landing lines (JSON text) read into records, a repeated key refused;
- both versions: `hash_records(chunk, ("content/1", "content/2"))` (payloads too);
- full canonical record: `canonicalise_records` (strict URL, payload, natural key,
  both digests, timestamp) against the per-record `canonicalise_record`.

Times are CPU seconds of this process (`time.process_time`): the machine is
shared, and CPU time leaves out the time spent waiting for a core. Printed:
median records/s per implementation over the repeats, and the median of the
per-repeat ratios (target for ours / seed: >= 4.5x). The issue does not say
which of the two readings it means; both are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_exact import seed_content_hash  # noqa: E402
from benchmarks.bench_url import baseline_canonicalize  # noqa: E402
from benchmarks.common import at_least_one, crawl_with_duplicates  # noqa: E402
from dedup_pipeline.core.canonical import content_hashes, hash_records  # noqa: E402
from dedup_pipeline.core.errors import RecordError  # noqa: E402
from dedup_pipeline.core.hashing import HASH_RULES  # noqa: E402
from dedup_pipeline.core.records import canonicalise_record, canonicalise_records, parse_line  # noqa: E402
from dedup_pipeline.core.url import canonical_url  # noqa: E402

VERSIONS = tuple(HASH_RULES)


def cpu(function, *args) -> float:
    start = time.process_time()
    function(*args)
    return time.process_time() - start


def seed_chunk(chunk):
    return [seed_content_hash(record) for record in chunk]


def seed_with_url_chunk(chunk):
    return [seed_content_hash({**record, "url": baseline_canonicalize(record["url"])}) for record in chunk]


def ours_chunk(chunk):
    return content_hashes(chunk, "content/1")


def both_versions(chunk):
    return hash_records(chunk, VERSIONS)


def full_records(chunk):
    return canonicalise_records(chunk, range(len(chunk)), VERSIONS, "content/1")


def per_record_full(chunk):
    out = []
    for line_no, record in enumerate(chunk):
        try:
            out.append(canonicalise_record(record, line_no, VERSIONS, "content/1"))
        except RecordError as exc:
            out.append(exc)
    return out


def url_only(chunk):
    return [canonical_url(record["url"]) for record in chunk]


def parse_lines(chunk):
    return [parse_line(line) for line in chunk]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=at_least_one, default=100_000)
    parser.add_argument("--repeat", type=at_least_one, default=5)
    parser.add_argument("--chunk", type=at_least_one, default=2000)
    args = parser.parse_args()

    raw_urls = crawl_with_duplicates(args.records, 0.5)
    records = [{**record, "url": canonical_url(record["url"])} for record in raw_urls]
    without_url = [{k: v for k, v in r.items() if k != "url"} for r in records]
    lines = [json.dumps(r).encode() for r in records]
    parsed = parse_lines(lines)
    chunks = lambda rs: [rs[i : i + args.chunk] for i in range(0, len(rs), args.chunk)]  # noqa: E731

    # Identical digests before anything is timed, and identical results on the ladder's records.
    assert [d for c in chunks(records) for d in ours_chunk(c)] == seed_chunk(records), (
        "content/1 differs from the seeds"
    )
    assert [d for c in chunks(raw_urls) for d in ours_chunk(c)] == seed_with_url_chunk(raw_urls)
    assert [d for c in chunks(without_url) for d in ours_chunk(c)] == seed_chunk(without_url)
    probe = parsed[:5000]
    assert full_records(probe) == per_record_full(probe), "canonicalise_records differs from canonicalise_record"

    pairs = {  # name: (corpus, baseline, ours)
        "content/1": (records, seed_chunk, ours_chunk),
        "content/1, url by urllib": (raw_urls, seed_with_url_chunk, ours_chunk),
        "content/1, no url": (without_url, seed_chunk, ours_chunk),
        "full record": (parsed, per_record_full, full_records),
    }
    seconds = {name: ([], []) for name in pairs}
    extra = {"both versions": [], "url/1 alone": [], "parse_line": []}
    for _ in range(args.repeat):
        for name, (corpus, base, ours) in pairs.items():
            b = o = 0.0
            for i, chunk in enumerate(chunks(corpus)):  # alternate chunk by chunk: both see the same load,
                if i % 2:  # and each goes first (on records not yet in the CPU cache) on every other chunk
                    b += cpu(base, chunk)
                    o += cpu(ours, chunk)
                else:
                    o += cpu(ours, chunk)
                    b += cpu(base, chunk)
            seconds[name][0].append(b)
            seconds[name][1].append(o)
        extra["both versions"].append(sum(cpu(both_versions, c) for c in chunks(parsed)))
        extra["url/1 alone"].append(sum(cpu(url_only, c) for c in chunks(records)))
        extra["parse_line"].append(sum(cpu(parse_lines, c) for c in chunks(lines)))

    n = args.records
    rate = lambda values: n / statistics.median(values)  # noqa: E731
    ratio = lambda name: statistics.median(b / o for b, o in zip(*seconds[name]))  # noqa: E731
    print(
        f"canonicalise + hash, {n:,} records (50% exact re-crawls), chunks of {args.chunk}, {args.repeat} repeats, "
        f"CPU time, median records/s"
    )
    print("  url/1 done beforehand (the seeds' side does no URL work, ours canonicalises every URL):")
    print(f"    seed canonicalise + content_hash  {rate(seconds['content/1'][0]):>10,.0f} rec/s")
    print(
        f"    ours content_hashes (content/1)   {rate(seconds['content/1'][1]):>10,.0f} rec/s   "
        f"ours / seed {ratio('content/1'):5.2f}x  (target >= 4.5x; digests identical)"
    )
    print("  url/1 by urllib.parse on the seeds' side (both sides canonicalise every URL):")
    print(f"    seed url/1 + canonicalise + hash  {rate(seconds['content/1, url by urllib'][0]):>10,.0f} rec/s")
    print(
        f"    ours content_hashes (content/1)   {rate(seconds['content/1, url by urllib'][1]):>10,.0f} rec/s   "
        f"ours / seed {ratio('content/1, url by urllib'):5.2f}x  (target >= 4.5x; digests identical)"
    )
    print(
        f"  same without the url field        seed {rate(seconds['content/1, no url'][0]):>9,.0f}   "
        f"ours {rate(seconds['content/1, no url'][1]):>9,.0f} rec/s   ours / seed {ratio('content/1, no url'):5.2f}x"
    )
    print(f"  url/1 canonical_url alone         {rate(extra['url/1 alone']):>10,.0f} URLs/s (inside ours above)")
    print("on the ladder's records (parse_line, exact Decimal prices), for information:")
    print(f"  parse_line (bytes to record)      {rate(extra['parse_line']):>10,.0f} lines/s (repeated keys refused)")
    print(f"  ours both versions + payloads     {rate(extra['both versions']):>10,.0f} rec/s   (hash_records)")
    print(
        f"  full canonical record, per record {rate(seconds['full record'][0]):>10,.0f} rec/s   (canonicalise_record)"
    )
    print(
        f"  full canonical record, batch      {rate(seconds['full record'][1]):>10,.0f} rec/s   "
        f"(canonicalise_records)  batch / per record {ratio('full record'):5.2f}x"
    )


if __name__ == "__main__":
    main()
