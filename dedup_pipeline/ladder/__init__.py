"""The rungs of the dedup ladder, one module each, shared by the Dagster assets, the CLI and the tests."""
