"""The GPU benchmark's page: its JSON result as markdown tables (`python -m pipeline.bench.gpu --report FILE`)."""

from __future__ import annotations


def alone_of(name: str) -> str:
    """The configuration that runs the same engine mode without the draft."""
    return name.replace("draft", "target alone").replace(", chained", "").replace(", adaptive gamma", "")


def markdown(result: dict) -> str:
    cut = [s for s in ("single", "batched") if result.get(f"{s}_partial")]
    lines = [f"## {result['shape']} pair, {result['dtype']}, {result['device_name']}"
             + (f" (cut short in: {', '.join(cut)})" if cut else ""),
             "", f"torch {result['torch']}, CUDA {result['cuda']}, transformers {result['transformers']}; "
             f"gamma {result['gamma']}, " + (f"{result['max_new_tokens']} new tokens, " if result.get("single") else "")
             + "prompts of "
             f"{result['min_len']}-{result['max_len']} tokens, every measured prompt distinct", ""]
    single = result.get("single")
    if single:
        rows = single["rows"]
        hf = rows["HF generate"]["ms_per_token"]
        k = single["prompts"]
        lines += [f"Batch 1, {k} prompts (ours alone: the same engine mode without the draft):", "",
                  "| | ms/token | vs HF generate | vs ours alone | acceptance | same as HF | same as ours alone |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in rows.items():
            drafted = name.startswith("ours") and "draft" in name
            alone = rows.get(alone_of(name)) if drafted else None
            ratio = f"{alone['ms_per_token'] / r['ms_per_token']:.2f}x" if alone else "-"
            acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
            n = r.get("prompts", k)  # fewer where a run was cut short while it compiled
            same = f"{r['identical_to_ours_alone']}/{n}" if drafted else "-"
            lines.append(f"| {name} | {r['ms_per_token']:.2f} | {hf / r['ms_per_token']:.2f}x | {ratio} | {acc} | "
                         f"{r['identical_to_hf']}/{n} | {same} |")
        lines += [f"- {name}: failed ({why})" for name, why in single.get("failed", {}).items()]
        lines.append("")
    batched = result.get("batched")
    if batched:
        k = batched["prompts"]
        lines += [f"Batched, {k} prompts, {result.get('batch_max_new_tokens')} new tokens each, tokens/s over the "
                  "set (ours: fixed slots and CUDA graphs where the model allows, else eager):", "",
                  "| B | | tokens/s | vs HF generate | vs ours alone | in admissions | drafts per round "
                  "| same as HF | same as ours alone |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for b, row in batched["by_batch_size"].items():
            if "HF generate" not in row:  # cut short before its first figure
                continue
            hf = row["HF generate"]["tokens_per_s"]
            for name, r in row.items():
                alone = row.get(alone_of(name)) if name.startswith("ours") and "draft" in name else None
                ratio = f"{r['tokens_per_s'] / alone['tokens_per_s']:.2f}x" if alone else "-"
                admits = f"{r['admit_s'] / r['seconds']:.0%}" if "admit_s" in r else "-"
                drafts = f"{r['drafts_per_round']:.2f}" if "draft" in name and "drafts_per_round" in r else "-"
                same = f"{r.get('identical_to_hf', '-')}/{k} | {r.get('identical_to_ours_alone', '-')}/{k}"
                lines.append(f"| {b} | {name} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / hf:.2f}x | {ratio} | "
                             f"{admits} | {drafts} | {same} |")
        lines += [f"- {name}: failed ({why})" for name, why in batched.get("failed", {}).items()]
        lines.append("")
    if result.get("graph_fallbacks"):
        lines += ["CUDA graphs that fell back to eager passes (the rows above that say graphs ran eagerly after):", ""]
        lines += [f"- {line}" for line in result["graph_fallbacks"]] + [""]
    prof = result.get("profile")
    if prof:
        lines += ["Profile of one generation, ours with the draft (GPU busy: kernel time over the wall time of the "
                  "same generation run unprofiled, and profiled):", "",
                  "| engine | wall s | GPU kernel s | GPU busy | profiled: wall s, busy | kernel launches "
                  "| cuDNN kernels |",
                  "|---|---|---|---|---|---|---|"]
        for name, p in prof.items():
            plain = p.get("unprofiled_wall_s")  # absent from runs before it was measured
            busy = f"{p['gpu_busy_share_unprofiled']:.0%}" if plain else "-"
            wall = f"{plain:.3f}" if plain else "-"
            lines.append(f"| {name} | {wall} | {p['gpu_kernel_s']:.3f} | {busy} | {p['wall_s']:.3f}, "
                         f"{p['gpu_busy_share']:.0%} | {p['launches']} | {p['cudnn_kernels']} |")
        lines.append("")
    prof = result.get("profile_batched")
    if prof:
        lines += ["Profile of one batched call (ours: fixed slots and graphs where the model allows; with "
                  "--hf_compile, HF's compiled generate over the same prompts). In prefills: ours, its time "
                  "admitting rows; HF's, the time of the same calls for one new token (speculation speeds up "
                  "the rest only):", "",
                  "| engine | tokens | wall s | GPU kernel s | GPU busy | in prefills | kernel launches |",
                  "|---|---|---|---|---|---|---|"]
        for name, p in prof.items():  # unprofiled wall time; the profiled one in the JSON
            busy = 100 * p["gpu_busy_share_unprofiled"]
            admitting = f"{100 * p['admit_s'] / p['unprofiled_wall_s']:.0f}%" if "admit_s" in p else "-"
            lines.append(f"| {name} | {p['tokens']} | {p['unprofiled_wall_s']:.3f} | {p['gpu_kernel_s']:.3f} | "
                         f"{busy:.0f}% | {admitting} | {p['launches']} |")
        lines.append("")
        for name, p in prof.items():
            if p.get("top_gpu_kernels"):  # (absent from runs before it was measured, and without a GPU)
                lines += [f"Top GPU kernels, {name}:", "", "| kernel | calls | ms |", "|---|---|---|"]
                lines += [f"| `{k}` | {c} | {ms:.1f} |" for k, c, ms in p["top_gpu_kernels"][:8]] + [""]
    return "\n".join(lines) + "\n"
