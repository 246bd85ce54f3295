"""A profile's draft latency against depth and against width: the table and its PNG.
"""

from __future__ import annotations

from pathlib import Path

from draftnas.core.placement import DTYPE_BYTES
from draftnas.latency.model import LatencyModel
from draftnas.latency.records import DRAFT_CONDITION, LatencyProfile
from draftnas.report.records import DepthWidthReport, ReportRow


def depth_width_report(profile: LatencyProfile) -> DepthWidthReport:
    """Measured and predicted draft latency along the profile's depth and width series."""
    batch, new, context = DRAFT_CONDITION
    model = LatencyModel.from_profile(profile)
    shapes = {a.name: a for a in profile.shapes}
    measured = {m.shape: m for m in profile.measurements if m.kind == "model"
                and (m.batch_size, m.new_tokens, m.context_tokens) == DRAFT_CONDITION}
    rows = []
    for series, names in profile.series.items():
        for name in names:
            arch, m = shapes[name], measured.get(name)
            rows.append(ReportRow(
                series=series, shape=name, layers=arch.num_hidden_layers, hidden_size=arch.hidden_size,
                non_embedding_params=arch.non_embedding_parameters(),
                measured_ms=m.median_ms if m else None, q1_ms=m.q1_ms if m else None,
                q3_ms=m.q3_ms if m else None,
                predicted_ms=model.predict_ms(arch, batch_size=batch, new_tokens=new,
                                              context_tokens=context),
                split=m.split if m else "-"))
    c = profile.coefficients
    # at one token per sequence the skinny-GEMM tile term (2 FLOPs per parameter) is a
    # per-parameter cost too; leaving it out reported 0 where a fit put the weight reads there
    skinny = min(float(batch * new), c.get("tile_rows", 1.0))
    per_mparam = (c["gemm_mb"] * _bytes(profile.dtype) + c["gemm_gflop"] * 2e-3
                  + c.get("gemm_tile_gflop", 0.0) * 2e-3 * skinny)
    return DepthWidthReport(device_name=profile.device_name, dtype=profile.dtype, batch_size=batch,
                            new_tokens=new, context_tokens=context, rows=tuple(rows),
                            ms_per_layer_overhead=c["layer"] + c["layer_token"],
                            ms_per_million_layer_params=per_mparam)


def _bytes(dtype: str) -> int:
    return DTYPE_BYTES[dtype]


def save_report_png(report: DepthWidthReport, path: str | Path) -> Path:
    """Two panels: draft latency vs layers (fixed width) and vs hidden size (fixed depth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, series, key, label in ((axes[0], "depth", "layers", "layers (depth)"),
                                   (axes[1], "width", "hidden_size", "hidden size (width)")):
        rows = sorted((r for r in report.rows if r.series == series), key=lambda r: getattr(r, key))
        xs = [getattr(r, key) for r in rows]
        ax.plot(xs, [r.predicted_ms for r in rows], "-", color="tab:blue", label="latency model")
        pts = [r for r in rows if r.measured_ms is not None]
        err = [[(r.measured_ms or 0.0) - (r.q1_ms or 0.0) for r in pts],
               [(r.q3_ms or 0.0) - (r.measured_ms or 0.0) for r in pts]]
        ax.errorbar([getattr(r, key) for r in pts], [r.measured_ms for r in pts], yerr=err, fmt="o",
                    color="tab:orange", capsize=3, label="measured (median, IQR)")
        for r in pts:
            if r.split == "heldout":
                ax.annotate("held out", (getattr(r, key), r.measured_ms), fontsize=7,
                            textcoords="offset points", xytext=(4, -10))
        ax.set_xlabel(label)
        ax.set_ylabel("draft latency (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{report.device_name}, {report.dtype}: batch {report.batch_size}, "
                 f"{report.new_tokens} new token, context {report.context_tokens}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
