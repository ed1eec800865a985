"""Judging the warehouse and each batch: collapse-rate history, integrity, quarantine rate, GE suites, funnel figures.

The Dagster layer (`dedup_pipeline.defs.checks`) turns these into asset checks;
nothing here imports Dagster, and Great Expectations is imported only when a
suite runs (it takes seconds to import).
"""
