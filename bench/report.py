"""Turn bench/results/*.json[l] into docs/BENCHMARKS.md (a table per model) and a PNG plot.

    python bench/report.py                       # bench/results -> docs/BENCHMARKS.md, docs/benchmarks.png
    python bench/report.py --results DIR --md OUT.md --png OUT.png

Each model configuration (shape, batch, seq, dtype) gets one table. Its ideal run (uncapped)
gives the reference: ratio = ideal peak device memory / cap, share = tokens/s / ideal tokens/s.
Every system expected at every cap that any result used gets a row: a failed result shows its
error; one never run shows "not run" when it ran out of memory at a looser cap or has no
result in the table at all, else "missing". The newest result wins where a configuration
was run more than once. The output has no timestamps, so it changes only when results do.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_FORMAT = "teraio-bench-result"
KNOWN_VERSIONS = (1,)
# Rows every capped configuration should have (issue 5), in table order.
EXPECTED_SYSTEMS = ("teraio_mixed", "teraio_host", "teraio_ssd", "zero_offload", "zero_infinity",
                    "checkpointing", "save_on_cpu", "plain_capped")
# TeraIO rows of the detail table and the speed-up lines; "+recompute": a run that replayed
# activations (its report's recompute tier released bytes), apart from the same system moving only.
TERAIO_ROWS = ("teraio_mixed", "teraio_host", "teraio_host+recompute", "teraio_ssd")
GROUP_KEYS = ("layers", "dim", "heads", "ffn", "vocab", "seq", "batch", "dtype", "deterministic")
GROUP_DEFAULTS = {"deterministic": False}  # results written before the key existed
SHAPE_KEYS = ("layers", "dim", "heads", "ffn", "vocab")  # what makes a preset (batch and seq are run choices)
MACHINE_NOTE = (
    "Machine: one NVIDIA H200 (about 139 GiB usable) on PCIe Gen5 x16, 16 cores, 128 GB RAM. "
    "Pinned host<->device copies run at about 55 GB/s each way alone and 91-96 GB/s both ways at once (bench/link_probe.py); "
    "the only disk is one virtio disk at about 1.5 GB/s (no GPUDirect Storage), so every SSD-tier "
    "system here runs on one SSD (`--ssds 1`), and ZeRO-Infinity's NVMe tier shares that disk."
)


def load_results(folder):
    """(results, problems): every result object found, and one line per unreadable file."""
    results, problems = [], []
    for path in sorted(Path(folder).glob("*.json")) + sorted(Path(folder).glob("*.jsonl")):
        try:
            text = path.read_text()
            items = ([json.loads(line) for line in text.splitlines() if line.strip()]
                     if path.suffix == ".jsonl" else json.loads(text))
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: unreadable ({exc})")
            continue
        for item in items if isinstance(items, list) else [items]:
            if not isinstance(item, dict) or item.get("format") != RESULT_FORMAT:
                problems.append(f"{path.name}: not a {RESULT_FORMAT} object, skipped")
            elif item.get("schema_version") not in KNOWN_VERSIONS:
                problems.append(f"{path.name}: schema_version {item.get('schema_version')} is unknown to this "
                                "report; update bench/report.py")
            else:
                results.append({**item, "system": system_of(item), "_file": path.name})
    return results, problems


def system_of(result):
    """The result's system, "+recompute" added for a TeraIO run that replayed activations."""
    teraio = (result.get("metrics") or {}).get("teraio") or {}
    replayed = (teraio.get("offloaded_bytes") or {}).get("recompute", 0)
    return result["system"] + ("+recompute" if replayed else "")


def group_key(result):
    config = result.get("config", {})
    return tuple(config.get(k, GROUP_DEFAULTS.get(k)) for k in GROUP_KEYS)


def cap_of(result):
    return result.get("config", {}).get("gpu_mem_cap_bytes")


def newest(results):
    """One result per (system, cap): the newest that succeeded, else the newest failure, else skip."""
    chosen = {}
    rank = {"ok": 2, "failed": 1}  # then skipped; a real outcome beats a run that never started
    for r in sorted(results, key=lambda r: (rank.get(r["status"], 0), r.get("env", {}).get("date") or "")):
        chosen[(r["system"], cap_of(r))] = r
    return chosen


def gib(nbytes):
    return "–" if nbytes is None else f"{nbytes / 2**30:.1f}"


def ratio_text(cap, ideal_peak):
    if cap is None:
        return "1x (no cap)"
    return f"{ideal_peak / cap:.2f}x" if ideal_peak else "?"


def short_error(error):
    """PyTorch's out-of-memory text runs to 600 characters; the table needs its two numbers."""
    found = re.search(r"Tried to allocate ([\d.]+ \w+).*?([\d.]+ \w+) allowed", error or "")
    if error and error.startswith("OutOfMemoryError") and found:
        return f"out of device memory (tried to allocate {found[1]} under the cap of {found[2]})"
    return error or "unknown error"


def not_run_reason(system, cap, chosen, caps):
    """Why a system has no result at this cap, where the table's other results tell: it has none
    in the table at all, or it ran out of device memory at a larger cap already."""
    if not any((system, c) in chosen for c in caps):
        return "in this configuration (no result at any ratio)"
    looser = next((chosen[(system, c)] for c in caps if c > cap and (system, c) in chosen), None)
    if looser is not None and "out of device memory" in short_error(looser.get("error")):
        commit = (looser.get("env", {}).get("git_commit") or "")[:7]
        return f"out of device memory at a larger cap already (at {commit})"
    return None


def status_text(r, not_run=None):
    if r is None:
        return f"**not run**: {not_run}" if not_run else "**missing**: no result"
    if r["status"] == "ok":
        return "ok"
    where = f" ({r.get('failed_at')})" if r.get("failed_at") else ""
    error = short_error(r.get("error")).replace("|", "\\|")
    commit = (r.get("env", {}).get("git_commit") or "")[:7]  # a failure may be fixed since
    return f"**{r['status']}**{where}{' at ' + commit if commit else ''}: {error}"


def row_for(system, cap, r, ideal, not_run=None, demand_peak=None):
    ideal_peak = ideal["metrics"].get("peak_device_bytes") if ideal else demand_peak
    m = r.get("metrics", {}) if r else {}
    ok = r is not None and r["status"] == "ok"
    tok_s = m.get("tokens_per_s") if ok else None
    share = f"{tok_s / ideal['metrics']['tokens_per_s']:.1%}" if ok and ideal and tok_s else "–"
    step = (f"{m['step_ms_median']:.0f} [{m['step_ms_p10']:.0f}–{m['step_ms_p90']:.0f}]" if ok else "–")
    peak = f"{gib(m.get('peak_device_bytes'))} / {gib(cap) if cap else 'none'}"
    extra = []
    if m.get("predicted_step_ms") is not None:
        extra.append(f"predicted {m['predicted_step_ms']:.0f} ms")
    if m.get("stall_ms") is not None:
        extra.append(f"stalls {m['stall_ms']:.0f} ms")
    return (f"| {system} | {ratio_text(cap, ideal_peak)} | {share} | {f'{tok_s:,.0f}' if tok_s else '–'} | {step} "
            f"| {peak} | {gib(m.get('host_rss_peak_bytes'))} | {'; '.join(extra) or '–'} | {status_text(r, not_run)} |")


def group_title(results):
    c = results[0]["config"]
    n = c.get("params")
    params = "params unknown" if not n else f"{n / 1e9:.2f}B params" if n >= 1e8 else f"{n / 1e6:.2f}M params"
    shape = f"{c.get('layers')} layers, dim {c.get('dim')}, ffn {c.get('ffn')}, vocab {c.get('vocab')}"
    dtype = "fp32 weights and AdamW" + (", TF32 matmuls" if c.get("tf32") else "") if c.get("dtype") == "fp32" \
        else "fp32 weights, bf16 autocast"
    exact = ", deterministic kernels" if c.get("deterministic") else ""
    return f"{preset_name(c)}: {params} ({shape}), batch {c.get('batch')} x seq {c.get('seq')}, {dtype}{exact}"


def preset_name(config):
    """The example's preset the run used, or the one whose shape it has (a run given the shape
    by overrides), else "custom"."""
    from teraio.examples.train_gpt import PRESETS

    shape = {k: config.get(k) for k in SHAPE_KEYS}
    same = [name for name, preset in PRESETS.items() if all(preset[k] == v for k, v in shape.items())]
    return same[0] if same else "custom"


def traced_peak(chosen):
    """Without an ideal run (a model that does not fit), the peak the profiled trace says the
    job needs uncapped, from a teraio run's plan: ratios are then of that peak to the cap."""
    for r in chosen.values():
        peak = (r.get("metrics") or {}).get("teraio", {}).get("plan", {}).get("peak_bytes_without_plan")
        if peak:
            return peak
    return None


def group_table(results, both_gbps: float = 0.0):
    """Markdown lines for one model configuration, and the plot's (label, share) points."""
    chosen = newest(results)
    ideal = chosen.get(("ideal", None))
    ideal = ideal if ideal and ideal["status"] == "ok" else None
    caps = sorted({cap for (_, cap) in chosen if cap is not None}, reverse=True)
    demand_peak = None if ideal else traced_peak(chosen)
    lines = [f"### {group_title(results)}", "",
             "| System | Ratio (ideal peak / cap) | Share of ideal | tok/s | Step ms median [p10–p90] "
             "| Peak / cap GiB | Host RSS GiB | Predicted, stalls | Status |",
             "|---|---|---|---|---|---|---|---|---|",
             row_for("ideal", None, chosen.get(("ideal", None)), ideal)]
    points = []
    # Other systems run uncapped (e.g. CPU smoke runs) are listed as they are, never as missing.
    for system in sorted({s for (s, c) in chosen if c is None} - {"ideal"}):
        lines.append(row_for(system, None, chosen[(system, None)], ideal))
    for cap in caps:
        systems = list(EXPECTED_SYSTEMS) + sorted({s for (s, c) in chosen if c == cap} - set(EXPECTED_SYSTEMS))
        for system in systems:
            r = chosen.get((system, cap))
            not_run = None if r else not_run_reason(system, cap, chosen, caps)
            lines.append(row_for(system, cap, r, ideal, not_run, demand_peak))
            share = (r["metrics"]["tokens_per_s"] / ideal["metrics"]["tokens_per_s"]
                     if r and r["status"] == "ok" and ideal else None)
            points.append((ratio_text(cap, ideal and ideal["metrics"].get("peak_device_bytes")), system, share))
    if demand_peak:
        lines += ["", f"No ideal run fits this device: ratios are of the profiled trace's uncapped peak "
                      f"({gib(demand_peak)} GiB) to the cap."]
    peak = (ideal and ideal["metrics"].get("peak_device_bytes")) or demand_peak
    lines += ([""] + speedups(chosen, caps, peak) + link_bounds(chosen, caps, ideal, both_gbps)
              + teraio_details(chosen, caps, peak) + provenance(chosen))
    return lines, points


def teraio_details(chosen, caps, ideal_peak):
    """Where a teraio run's time went: the plan's prediction (the simulator replaying the trace
    with the plan at the given bandwidths) and the trace's kernel time alone (unlimited
    bandwidth, no host time) against the measured step, stalls, traffic and the host time in the walk."""
    rows = [(system, cap, chosen[(system, cap)]) for cap in caps for system in TERAIO_ROWS
            if (system, cap) in chosen and chosen[(system, cap)]["status"] == "ok"
            and chosen[(system, cap)]["metrics"].get("teraio")]
    if not rows:
        return []
    lines = ["TeraIO runs in detail (measured iterations: those after warm-up; stalls by cause over the whole run):", "",
             "| System | Ratio | Step ms measured | Predicted | Kernels alone | Stall ms/step | Stalls by cause (run) "
             "| Moved out GB/step | Replayed GB/step | Achieved GB/s | Copy busy ms/step | Walk+agent host ms/step | Evictions on plan "
             "| Iterations on plan |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for system, cap, r in rows:
        m, t = r["metrics"], r["metrics"]["teraio"]
        warmup = r["config"]["warmup_steps"]
        measured = [row for row in t.get("per_iteration", []) if row["iteration"] >= warmup]
        planned = [row for row in measured if row["followed_plan"]]

        def mean(key, rows=measured):
            return sum(row.get(key, 0) for row in rows) / len(rows) if rows else 0.0

        causes = ", ".join(f"{cause} {ms:.0f}" for cause, ms in sorted(t.get("stall_ms_by_cause", {}).items())) or "none"
        gbps = ", ".join(f"{path} {v:.1f}" for path, v in sorted(t.get("achieved_gbps", {}).items())) or "–"
        # Copies' busy time summed over the paths: at the step time, the links bound the step.
        busy = f"{mean('copy_busy_ms'):.0f}" if measured and "copy_busy_ms" in measured[0] else "–"
        # The rows count bytes released to every tier, the replays' apart since aa96c69; older
        # runs' are split off by the run's totals.
        released = t.get("offloaded_bytes", {})
        replay_share = released.get("recompute", 0) / max(1, sum(released.values()))
        if measured and "replay_released_bytes" in measured[0]:
            replay_share = mean('replay_released_bytes') / max(1.0, mean('offloaded_bytes'))
        out_gb = mean('offloaded_bytes') / 1e9
        lines.append(f"| {system} | {ratio_text(cap, ideal_peak)} | {m['step_ms_median']:.0f} | "
                     f"{t['plan']['iteration_ms']:.0f} | {t['plan']['ideal_iteration_ms']:.0f} | {m['stall_ms'] or 0:.0f} "
                     f"| {causes} | {out_gb * (1 - replay_share):.1f} | {out_gb * replay_share:.1f} | {gbps} | {busy} | {mean('walk_ms'):.0f} "
                     f"| {sum(row['evictions'] for row in planned)} | {t['iterations_on_plan']} of {t['iterations']} |")
    return lines + [""]


def speedups(chosen, caps, ideal_peak):
    """One line per TeraIO system and ratio: its speed-up over every ZeRO variant that ran."""
    lines = []
    for cap, system in ((cap, system) for cap in caps for system in TERAIO_ROWS[:3]):
        ours = chosen.get((system, cap))
        if not ours or ours["status"] != "ok":
            continue
        ratio = ratio_text(cap, ideal_peak)
        rivals = sorted({s for (s, c) in chosen if c == cap and s.startswith("zero_")} | {"zero_offload", "zero_infinity"})
        ran = [r for r in rivals if chosen.get((r, cap)) and chosen[(r, cap)]["status"] == "ok"]
        figures = [f"{ours['metrics']['tokens_per_s'] / chosen[(r, cap)]['metrics']['tokens_per_s']:.2f}x {r}"
                   for r in ran]
        missing = [r for r in rivals if r not in ran]
        if not figures:
            lines.append(f"- At {ratio}: {system} ran; no ZeRO variant did ({', '.join(missing)}).")
            continue
        lines.append(f"- At {ratio}: {system} is {', '.join(figures)}"
                     + (f"; {', '.join(missing)} did not run, so no figure" if missing else "") + ".")
    return lines + ([""] if lines else [])


def link_bounds(chosen, caps, ideal, both_gbps: float = 0.0):
    """What the host link alone allows: at the ideal's peak at least (peak - cap) bytes must be
    off the device, and they go out and come back every step. At the best one-way rate teraio's
    copies reached, that bounds any system that computes on the GPU and moves one direction at a
    time (one that computes on the CPU, like ZeRO-Offload's optimizer, moves fewer bytes); with
    both directions at once, the link probe's figure bounds it."""
    peak = ideal and ideal["metrics"].get("peak_device_bytes")
    rates = [gbps for r in chosen.values() if r["status"] == "ok"
             for path, gbps in r["metrics"].get("teraio", {}).get("achieved_gbps", {}).items() if path in ("d2h", "h2d")]
    if not peak or not rates:
        return []
    gbps, ideal_ms = max(rates), ideal["metrics"]["step_ms_median"]
    lines = []
    for cap in (cap for cap in caps if cap < peak):
        link_ms = 2 * (peak - cap) / (gbps * 1e9) * 1e3
        overlapped = ""
        if both_gbps:
            both_ms = 2 * (peak - cap) / (both_gbps * 1e9) * 1e3
            overlapped = (f"; with both directions at once at the {both_gbps:.0f} GB/s bench/link_probe.py measured, "
                          f"{both_ms:.0f} ms: about {ideal_ms / max(both_ms, ideal_ms):.0%}")
        lines.append(f"- At {ratio_text(cap, peak)}: at least {2 * (peak - cap) / 1e9:.1f} GB cross the host link "
                     f"per step (the ideal's peak above the cap, out and back), {link_ms:.0f} ms at the "
                     f"{gbps:.1f} GB/s teraio's copies reached one way: about {ideal_ms / max(link_ms, ideal_ms):.0%} "
                     f"of ideal at best for a system that computes on the GPU moving one direction at a time{overlapped}.")
    return lines + ([""] if lines else [])


def probed_both_ways_gbps(folder) -> float:
    """The most the link probe (bench/link_probe.py) saw both directions carry at once in any
    result folder under `folder`, 0 if it never ran."""
    found = [r["gbps_median"]["both_total"] for path in sorted(Path(folder).glob("*/link_probe.json"))
             for r in json.loads(path.read_text())]
    return max(found, default=0.0)


def provenance(chosen):
    chosen = {key: r for key, r in chosen.items() if r["status"] != "skipped"}  # never ran anywhere
    commits = sorted({(r["env"].get("git_commit") or "unknown")[:12] for r in chosen.values()})
    dates = sorted({(r["env"].get("date") or "?")[:10] for r in chosen.values()})
    devices = sorted({r["env"].get("device_name") or "?" for r in chosen.values()})
    files = sorted({r["_file"] for r in chosen.values()})
    return [f"Runs: {', '.join(dates)} on {', '.join(devices)}; commits {', '.join(commits)}; "
            f"files {', '.join(files)}.", ""]


def plot(groups, png_path):
    """One panel per model: share of ideal per system, grouped by ratio; x marks a failed/missing run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 3.6 * len(groups)), squeeze=False)
    for ax, (title, points) in zip(axes[:, 0], groups):
        ratios = list(dict.fromkeys(p[0] for p in points))
        systems = list(dict.fromkeys(p[1] for p in points))
        width = 0.8 / max(1, len(systems))
        for j, system in enumerate(systems):
            for i, ratio in enumerate(ratios):
                share = next((p[2] for p in points if p[0] == ratio and p[1] == system), None)
                x = i + (j - (len(systems) - 1) / 2) * width
                if share is None:
                    ax.plot(x, 0.02, marker="x", color="red")
                else:
                    ax.bar(x, share, width, color=f"C{j}")
        ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
        ax.axhline(0.8, color="green", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(ratios)), [f"need {r} of cap" for r in ratios])
        ax.set_ylabel("share of ideal tok/s")
        ax.set_title(title, fontsize=9)
        handles = [Patch(color=f"C{j}", label=system) for j, system in enumerate(systems)]
        ax.legend(handles=handles, fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return True


def render(results, problems, png_name, both_gbps: float = 0.0):
    """The markdown document, and (title, points) per group for the plot."""
    groups = {}
    for r in results:
        groups.setdefault(group_key(r), []).append(r)
    lines = ["# Benchmarks: TeraIO against the ideal run and other offloading systems", "",
             "Generated by `python bench/report.py` from bench/results/ (how to run: bench/README.md). "
             "Ratio is how much more memory the ideal run peaked at than the cap allows; share of ideal "
             "is throughput against the same model and batch uncapped. Goal: at least 80% of ideal at "
             "the 2x ratio and at least 1.3x over ZeRO-Offload there. What limits each number, and the "
             "planner's roofline for the same trace: docs/gpu-results.md.", "", MACHINE_NOTE, ""]
    if any(r.get("config", {}).get("gpu_mem_cap_bytes") for r in results):
        lines += [f"![share of ideal throughput]({png_name})", ""]
    plot_groups = []
    for key in sorted(groups, key=lambda k: tuple(str(v) for v in k)):
        table, points = group_table(groups[key], both_gbps)
        lines += table
        if points:
            plot_groups.append((group_title(groups[key]), points))
    if not groups:
        lines += ["**No results yet**: run bench/gpu_baselines.sh on the GPU machine (bench/README.md).", ""]
    if problems:
        lines += ["## Files that could not be used", ""] + [f"- {p}" for p in problems] + [""]
    return "\n".join(lines).rstrip() + "\n", plot_groups


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(ROOT / "bench" / "results"))
    p.add_argument("--md", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    p.add_argument("--png", default=str(ROOT / "docs" / "benchmarks.png"))
    args = p.parse_args(argv)
    results, problems = load_results(args.results)
    md_path, png_path = Path(args.md), Path(args.png)
    md, plot_groups = render(results, problems, png_path.name, probed_both_ways_gbps(args.results))
    md_path.parent.mkdir(parents=True, exist_ok=True)
    if plot_groups and not plot(plot_groups, png_path):
        md = md.replace(f"![share of ideal throughput]({png_path.name})", "(no plot: matplotlib is not installed)")
    md_path.write_text(md)
    print(f"wrote {md_path} ({len(results)} results, {len(problems)} problems)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
