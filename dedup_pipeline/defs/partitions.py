"""One dynamic partition per crawl batch (a landing file); the landing sensor adds them."""

import dagster as dg

crawl_batches_partitions = dg.DynamicPartitionsDefinition(name="crawl_batches")
