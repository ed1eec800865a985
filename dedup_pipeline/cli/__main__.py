"""`python -m dedup_pipeline.cli`: the `dedup-pipeline` command."""

import sys

from dedup_pipeline.cli import main

sys.exit(main())
