"""Pictures and tables for the Dagster UI: the ladder funnel as a PNG in markdown, the largest clusters as a table.

Dagster has no plot metadata type; numeric metadata is plotted over time by the
UI on its own, and a picture of one materialisation is a base64 PNG embedded in
`MetadataValue.md`. matplotlib is imported lazily with the Agg backend (no
display, no pyplot global state).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence

import dagster as dg

from dedup_pipeline.quality.figures import STAGES, batch_funnel, cluster_preview
from dedup_pipeline.store.warehouse import Warehouse

CLUSTER_PREVIEW_ROWS = 10
_CLUSTER_COLUMNS = [
    dg.TableColumn("cluster_id", "int", description="smallest record id in the cluster (stable across runs)"),
    dg.TableColumn("records", "int", description="records in the cluster"),
    dg.TableColumn("representative", "int", description="record id of the representative"),
    dg.TableColumn("batches", "int", description="crawl batches its members first came from"),
    dg.TableColumn("min_similarity", "float", description="lowest similarity of a link in the cluster"),
    dg.TableColumn("max_similarity", "float", description="highest similarity of a link in the cluster"),
]


def funnel_png(stages: Sequence[tuple[str, int]], title: str = "") -> bytes:
    """A horizontal bar per stage, widest (first) at the top, each labelled with its count and share of the first."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = [label for label, _ in stages]
    values = [value for _, value in stages]
    top = max(values[0] if values else 0, 1)
    figure = Figure(figsize=(6.4, 0.5 * len(stages) + 0.9), dpi=80)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = list(range(len(stages)))[::-1]
    axes.barh(positions, values, color="#4f43dd", height=0.6)
    axes.set_yticks(positions, labels)
    axes.set_xlim(0, top * 1.25)
    for y, value in zip(positions, values):
        axes.text(value + top * 0.01, y, f"{value} ({value / top:.0%})", va="center", fontsize=9)
    axes.spines[["top", "right"]].set_visible(False)
    axes.set_xlabel("records")
    if title:
        axes.set_title(title, fontsize=10)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def png_markdown(png: bytes, alt: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})")


def cluster_table(rows: Sequence[Mapping]) -> dg.MetadataValue:
    return dg.MetadataValue.table(
        records=[dg.TableRecord(dict(row)) for row in rows], schema=dg.TableSchema(columns=_CLUSTER_COLUMNS)
    )


#: The figures of `deduplicated_records` the UI plots over the batches: what reaches the rung and survives it, the
#: rate, a count per decision, and the seen-set's fallbacks. Every other figure is in its `figures` entry.
PLOTTED_EXACT_FIGURES = (
    "records_in",
    "survivors",
    "collapse_rate",
    "new",
    "changed",
    "exact_duplicate",
    "stale",
    "change_ignored",
    "erased",
    "seen_set_fallbacks",
)
#: Decimal places of a float figure: enough for a rate, none of binary floating point's noise.
FLOAT_DIGITS = 4


def rounded(value):
    return round(value, FLOAT_DIGITS) if isinstance(value, float) else value


def exact_metadata(figures: Mapping, first_run: Mapping[str, int], first_rate: float) -> dict:
    """`deduplicated_records`' metadata: the plotted figures (`PLOTTED_EXACT_FIGURES`) and its text (batch, hash
    version, seen-set) as entries; the rest, under the seeds' metric names among them, in one `figures` JSON
    entry; and the batch's first run (`first_run`: its decisions and rate from the decision log), which a replay
    (every record an exact duplicate) leaves as it was."""
    plotted = {key: rounded(figures[key]) for key in PLOTTED_EXACT_FIGURES if key in figures}
    text = {key: value for key, value in figures.items() if isinstance(value, str)}
    rest = {key: rounded(value) for key, value in figures.items() if key not in plotted and key not in text}
    story = {**{key: int(n) for key, n in sorted(first_run.items())}, "collapse_rate": rounded(first_rate)}
    return {
        **text,
        **plotted,
        "figures": dg.MetadataValue.json(rest),
        "first_run": dg.MetadataValue.json(story),
    }


def ladder_figures(warehouse: Warehouse, batch_id: str, cluster_sizes: Mapping[int, int]) -> dict:
    """Metadata for the last rung: the funnel (picture and numbers) and the largest clusters this batch touched."""
    largest = sorted(cluster_sizes, key=lambda cid: (-cluster_sizes[cid], cid))[:CLUSTER_PREVIEW_ROWS]
    with warehouse.engine.connect() as conn:
        funnel = batch_funnel(conn, batch_id)
        preview = cluster_preview(conn, largest)
    stages = [(label, funnel[key]) for key, label in STAGES]
    meta: dict = {f"funnel/{key}": funnel[key] for key, _ in STAGES}
    meta["funnel"] = png_markdown(funnel_png(stages, f"batch {batch_id}"), f"ladder funnel of batch {batch_id}")
    meta["largest_clusters"] = cluster_table(preview) if preview else "no clusters"
    return meta
