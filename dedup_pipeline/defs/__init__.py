"""The Dagster layer: partitions, resources, assets, checks, jobs and sensors. Kept thin."""
