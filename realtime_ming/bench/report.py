"""Result files of a run: `results.json` (every sample), `summary.md` (p50/p90/p99 tables) and PNG plots.

Plots use matplotlib's Agg backend: TTFA CDF per concurrency, TTFA percentiles vs concurrency,
and the server's per-stage breakdown (only when the server sent `realtime_ming.response.timings`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import PERCENTILES, UNDERRUN_THRESHOLDS_MS, stage_order

__all__ = ["markdown_summary", "plot_results", "write_results"]

_TTFA_KINDS = (("ttfa_user_s", "TTFA_user"), ("ttfa_server_s", "TTFA_server"))


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000.0:.0f}"


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value * 100.0:.0f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _server_line(name: str, info: dict[str, Any]) -> str:
    models = info.get("models") or {}
    entry = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
    parts = [f"`{info.get('url')}`", f"model `{entry.get('id', '?')}`"]
    for key in ("device", "dtype", "is_tiny_default"):
        if key in entry:
            parts.append(f"{key} `{entry[key]}`")
    if "error" in models:
        parts.append("no /v1/models")
    parts.append(f"timing events {'on' if info.get('timings_enabled') else 'off'}")
    return f"- **{name}**: " + ", ".join(parts)


def _main_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for target, by_c in results["summary"].items():
        for c, s in by_c.items():
            cs = " / ".join(_share(s[f"c{ms}"]) for ms in UNDERRUN_THRESHOLDS_MS)
            rows.append([
                target, c, f"{s['num_ok']}/{s['num_turns']}" + (f" ({s['num_silent']} silent)" if s["num_silent"] else ""),
                *(_ms(s["ttfa_user_s"][f"p{p}"]) for p in PERCENTILES),
                *(_ms(s["ttfa_server_s"][f"p{p}"]) for p in PERCENTILES),
                _ms(s["ttft_user_s"]["p50"]), _ms(s["vad_delay_s"]["p50"]),
                _ms(s["underrun_max_s"]["p50"]), _ms(s["underrun_max_s"]["p99"]), cs,
                _num(s["rtf"]["p50"]), _num(s["audio_s_per_wall_s"]), str(s["num_errors"]),
            ])
    return rows


def _barge_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for target, by_c in results["summary"].items():
        for c, s in by_c.items():
            b = s.get("barge")
            if b is None:
                continue
            rows.append([
                target, c, f"{b['num_measured']}/{b['num_missed']}",
                *(_ms(b["stop_last_delta_s"][f"p{p}"]) for p in PERCENTILES),
                *(_ms(b["stop_done_s"][f"p{p}"]) for p in PERCENTILES),
                _ms(b["detect_s"]["p50"]),
            ])
    return rows


def _stage_lines(results: dict[str, Any]) -> list[str]:
    stages = stage_order(k for by_c in results["summary"].values() for s in by_c.values() for k in s["stages_ms_p50"])
    if not stages:
        return []
    rows = [[target, c, *(_num(s["stages_ms_p50"].get(k), "{:.0f}") for k in stages)]
            for target, by_c in results["summary"].items() for c, s in by_c.items()]
    return ["", "## Server stages (p50, ms after the end of input; from `realtime_ming.response.timings`)", "",
            *_table(["target", "c", *stages], rows)]


def _comparison_lines(results: dict[str, Any]) -> list[str]:
    comparison = results.get("comparison")
    if comparison is None:
        return []
    keys = [f"ttfa_user_s.p{p}" for p in PERCENTILES] + [f"ttfa_server_s.p{p}" for p in PERCENTILES]
    rows = [[c, *(_num(r[k]) for k in keys), _num(r["audio_s_per_wall_s"])] for c, r in comparison["ratios"].items()]
    header = ["c", *(f"TTFA_user p{p}" for p in PERCENTILES), *(f"TTFA_server p{p}" for p in PERCENTILES),
              "audio s/wall s"]
    return ["", f"## Comparison: {comparison['other']} / {comparison['base']} (< 1: {comparison['other']} is faster)",
            "", *_table(header, rows)]


def markdown_summary(results: dict[str, Any], plots: Sequence[str] = ()) -> str:
    """The run's summary page: setup, the main table, barge-in, stages, comparison, failures, plots."""
    cfg, client = results["config"], results["client"]
    lines = [
        f"# TTFA benchmark — {results['date']}",
        "",
        f"Command: `{results['command']}`",
        "",
        (f"Mode `{cfg['mode']}`{' + barge-in' if cfg['barge_in'] else ''}; {cfg['num_turns']} measured + "
        f"{cfg['num_warmup_turns']} warmup turn(s) per session, {cfg['num_rounds']} round(s); "
        f"{cfg['frame_ms']} ms frames at real time; max_output_tokens `{cfg['max_output_tokens']}`; "
        f"{len(results['turns'])} utterances "
        f"({min(t['speech_end_s'] for t in results['turns']):.1f}–{max(t['speech_end_s'] for t in results['turns']):.1f} s)."),
        (f"Client: `{client['host']}` ({client.get('cpu_model') or client['processor']}, {client.get('num_cpus')} CPUs, "
         f"load {_num(client.get('load_avg_1m'))} at start, Python {client['python']}), "
         f"realtime-ming {client.get('realtime_ming') or '?'}, commit "
         f"`{(client['git_commit'] or '?')[:12]}`{' (dirty)' if client['git_dirty'] else ''}."),
        "",
        *(_server_line(name, info) for name, info in results["targets"].items()),
        "",
        "## Results (ms unless noted; measured turns only)",
        "",
        ("TTFA_user: last non-silent input sample → first audio delta received. TTFA_server: "
        "`speech_stopped` (VAD) / `committed` (manual) → first audio delta. VAD: end of speech → "
        "`speech_stopped`. Underrun: longest stall of a player that starts at the first delta; "
        f"C{'/C'.join(map(str, UNDERRUN_THRESHOLDS_MS))}: share of responses whose worst stall is within. "
        "RTF: (last delta − end of speech) / audio seconds."),
        "",
        *_table(["target", "c", "ok", *(f"TTFA_user p{p}" for p in PERCENTILES),
                 *(f"TTFA_server p{p}" for p in PERCENTILES), "TTFT p50", "VAD p50", "underrun p50",
                 "underrun p99", "C" + "/C".join(map(str, UNDERRUN_THRESHOLDS_MS)), "RTF p50",
                 "audio s/wall s", "errors"], _main_rows(results)),
    ]
    barge = _barge_rows(results)
    if barge:
        lines += ["", "## Barge-in (speech_started → last audio delta / cancelled response.done)", "",
                  *_table(["target", "c", "measured/missed", *(f"stop→last delta p{p}" for p in PERCENTILES),
                           *(f"stop→done p{p}" for p in PERCENTILES), "detect p50"], barge)]
    lines += _stage_lines(results) + _comparison_lines(results)
    failures = [(s["failure"], lv["target"], lv["concurrency"]) for lv in results["levels"] for s in lv["samples"]
                if s["failure"] and not s["is_warmup"]]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {t} c={c}: {f}" for f, t, c in failures[:50]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _samples(results: dict[str, Any], target: str, concurrency: int, key: str) -> np.ndarray:
    values = [s.get(key) for lv in results["levels"] if lv["target"] == target and lv["concurrency"] == concurrency
              for s in lv["samples"] if s["ok"] and not s["is_warmup"]]
    return np.sort(np.asarray([v for v in values if v is not None], dtype=np.float64)) * 1000.0


def agg_pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said once on stdout) where matplotlib is not installed: the
    benchmarks that keep a JSON can plot it later with their `--replot`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (run --replot on the JSON where it is installed)")
        return None
    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out, write (120 dpi) and close `fig`."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_results(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the PNG plots into `out_dir`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(results["summary"])
    levels = sorted({int(c) for by_c in results["summary"].values() for c in by_c})
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(levels), 1)))
    styles = ["-", "--"]
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (key, label) in zip(axes, _TTFA_KINDS):
        for ti, target in enumerate(targets):
            for li, c in enumerate(levels):
                data = _samples(results, target, c, key)
                if data.size:
                    ax.step(np.r_[data[0], data], np.arange(data.size + 1) / data.size, where="post", color=colors[li],
                            linestyle=styles[ti % 2], label=f"{target} c={c}" if len(targets) > 1 else f"c={c}")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_title(f"{label} CDF")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of turns")
    _legend(axes[1])
    paths.append(_save(fig, out_dir / "ttfa_cdf.png"))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (key, label) in zip(axes, _TTFA_KINDS):
        for ti, target in enumerate(targets):
            by_c = results["summary"][target]
            for p, marker in zip(PERCENTILES, ("o", "s", "^")):
                ys = [by_c[str(c)][key][f"p{p}"] for c in levels]
                ax.plot(levels, [np.nan if y is None else y * 1000.0 for y in ys], marker=marker,
                        linestyle=styles[ti % 2], label=f"{target} p{p}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent sessions")
        ax.set_title(f"{label} vs concurrency")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("ms")
    _legend(axes[1])
    paths.append(_save(fig, out_dir / "ttfa_vs_concurrency.png"))

    stage_path = _plot_stages(results, targets, levels, colors, out_dir, plt)
    if stage_path is not None:
        paths.append(stage_path)
    return paths


def _plot_stages(results, targets, levels, colors, out_dir: Path, plt) -> Path | None:
    with_stages = [t for t in targets if any(s["stages_ms_p50"] for s in results["summary"][t].values())]
    if not with_stages:
        return None
    fig, axes = plt.subplots(1, len(with_stages), figsize=(7 * len(with_stages), 4.5), squeeze=False)
    for ax, target in zip(axes[0], with_stages):
        by_c = results["summary"][target]
        order = stage_order(k for s in by_c.values() for k in s["stages_ms_p50"] if k != "confirmed")
        x = np.arange(len(order))
        for li, c in enumerate(levels):
            medians = by_c[str(c)]["stages_ms_p50"]
            ax.plot(x, [medians.get(k, np.nan) for k in order], marker="o", color=colors[li], label=f"c={c}")
            if "confirmed" in medians:  # the VAD's decision: a horizontal mark, not a pipeline step
                ax.axhline(medians["confirmed"], color=colors[li], linestyle=":", linewidth=1.0)
        ax.set_xticks(x, order, rotation=35, ha="right", fontsize=8)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_ylabel("ms after end of input (p50; dotted: VAD confirm)")
        ax.set_title(f"{target}: server stages")
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(fig, out_dir / "stages.png")


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_results(results: dict[str, Any], out_dir: Path, *, plots: bool = True) -> dict[str, Path]:
    """results.json, the PNG plots and summary.md in `out_dir` (created); returns {name: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json"}
    paths["json"].write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    pngs = plot_results(results, out_dir) if plots else []
    paths.update({p.stem: p for p in pngs})
    paths["markdown"] = out_dir / "summary.md"
    paths["markdown"].write_text(markdown_summary(results, [str(p) for p in pngs]))
    return paths
