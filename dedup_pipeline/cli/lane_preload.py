"""What a lane of `dedup-pipeline run` imports before its first batch, imported once by the fork server the lanes'
worker processes are forked from (`core.parallel.ordered_map`'s `preload`), not once per lane: Dagster, Great
Expectations (seconds of CPU each) and the compiled MinHash kernels, loaded by one small sketch. What they leave
alive is then settled out of the garbage collector's full collections (`dedup_pipeline.heap`), once for every lane.

Nothing here reads the project's settings: each lane loads the definitions itself, in the environment of the
command that started it.
"""

from dedup_pipeline import environment

environment.quiet_great_expectations()

import dagster  # noqa: E402, F401
import great_expectations.expectations  # noqa: E402, F401

from dedup_pipeline import heap  # noqa: E402
from dedup_pipeline.core.near import DEFAULT_THRESHOLD, make_params, near_duplicate_links  # noqa: E402

try:
    near_duplicate_links(["a “warm” start for the lanes", "a “warm” start for a lane"], make_params(DEFAULT_THRESHOLD))
except Exception:  # noqa: BLE001, S110 - a lane that needs the kernels loads them itself, and reports what fails
    pass

heap.settle()
