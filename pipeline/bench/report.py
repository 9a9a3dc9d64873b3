"""What `pipeline.bench` writes: per-configuration aggregates (speed-ups, acceptance, the
paper's bound and how close we get to it), the headline checks against the project's speed targets,
and BENCHMARKS.md itself."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shlex
import statistics
import time
from pathlib import Path

import torch

from pipeline.report.stats import geometric_acceptance
from specdec_core.gamma import Costs, expected_tokens


def invert_expected(e: float, g: int) -> float:
    """a such that E(a, g) = e (bisection; E grows with a)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, g) < e else (lo, mid)
    return (lo + hi) / 2


def summarize(res: dict) -> list[dict]:
    rows, costs = res["rows"], res["costs"]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    out = []
    # Configurations without a separate prompt pass (HF assisted) get the median prompt-pass
    # time of the target-alone runs of the same prompt and kernels.
    pass_time: dict[tuple, list[float]] = {}
    for r in rows:
        if r["drafter"] == "none":
            pass_time.setdefault((r["prompt"], r["kernels"]), []).append(r["prefill_s"])
    for r in rows:
        if r["prefill_s"] != r["prefill_s"]:  # NaN
            r["prefill_s"] = statistics.median(pass_time[(r["prompt"], r["kernels"])])
    base_decode = {}
    for name, rs in by.items():
        tokens = sum(r["new_tokens"] for r in rs)
        lat = sum(r["latency_s"] for r in rs)
        dec = sum(r["latency_s"] - r["prefill_s"] for r in rs)
        base_decode[name] = (lat, dec, tokens)
    fastest_base = min((v[1] / v[2], k) for k, v in base_decode.items()
                       if next(c for c in res["configs"] if c.name == k).drafter == "none")
    for c in res["configs"]:
        rs = by[c.name]
        lat, dec, tokens = base_decode[c.name]
        blat, bdec, btok = base_decode[c.baseline]
        drafted = sum(r.get("drafted", 0) for r in rs)
        accepted = sum(r.get("accepted", 0) for r in rs)
        rounds = sum(r["rounds"] for r in rs)
        rej = sum(r.get("rejections", 0) for r in rs) if c.family == "ours" else None
        alpha = geometric_acceptance(accepted, rej) if rej is not None else None
        if c.family == "hf" and c.drafter == "model" and rounds:
            # HF does not report rejections: invert E(a, g) = tokens per round (constant schedule).
            alpha = invert_expected(tokens / rounds, int(c.gamma))
            for r in rs:
                r["drafts_per_round"] = " ".join([c.gamma] * r["rounds"])
        kc = costs["stock" if c.kernels == "stock" else "prepacked"]
        if c.draft_dtype != "float32":
            kc = costs.get(f"{c.draft_dtype} draft", kc)
        cc = kc.c if c.drafter == "model" else (0.0 if c.drafter == "ngram" else None)
        bound = g_used = None
        if alpha is not None and c.drafter != "none":
            # The paper's bound for the drafts actually proposed in each round (a fixed gamma
            # proposes g every round; n-gram lookup and the adaptive policy vary):
            # sum_r E(a, d_r) / sum_r (d_r c + v(d_r + 1)).
            k2 = Costs(c=cc, v=kc.v)
            ds = [int(x) for r in rs for x in str(r.get("drafts_per_round", "")).split()]
            if ds:
                bound = sum(expected_tokens(alpha, d) for d in ds) / sum(k2.round_cost(d) for d in ds)
                g_used = statistics.fmean(ds)
        speed = (bdec / btok) / (dec / tokens)
        tf = [r["target_fwd_s"] for r in rs]
        df = [r["draft_fwd_s"] for r in rs]
        overhead = dec - sum(tf) - sum(df)
        out.append({
            "config": c.name, "family": c.family, "kernels": c.kernels, "drafter": c.drafter, "gamma": c.gamma,
            "tokens": tokens, "tok_s": tokens / lat, "ms_tok": 1e3 * lat / tokens, "decode_ms_tok": 1e3 * dec / tokens,
            "acceptance": accepted / drafted if drafted else None, "alpha": alpha,
            "tokens_per_step": tokens / rounds if rounds else None,
            "mean_gamma": statistics.fmean(r.get("mean_gamma", 0) for r in rs)
            if c.family == "ours" and c.drafter != "none" else None,
            "c": cc, "speedup": speed, "speedup_total": (blat / btok) / (lat / tokens),
            "vs_fastest_target": fastest_base[0] / (dec / tokens), "baseline": c.baseline,
            "bound": bound, "bound_gamma": g_used, "efficiency": speed / bound if bound else None,
            "overhead_ms_round": 1e3 * overhead / rounds if rounds else None,
            "overhead_frac": overhead / dec if dec else None,
            "target_ms_round": 1e3 * sum(tf) / rounds if rounds else None,
            "draft_ms_round": 1e3 * sum(df) / rounds if rounds else None,
            "equal": None if c.sampling else all(r["equal"] for r in rs),
            "sampling": c.sampling, "draft_dtype": c.draft_dtype,
            "hf_errors": sum(r.get("hf_errors", 0) for r in rs),
            "cpu_util": statistics.fmean(r["cpu_util"] for r in rs),
            "load1": statistics.fmean(r["load1"] for r in rs),
        })
    return out


def _f(x, fmt="{:.2f}", none="–"):
    return none if x is None else fmt.format(x)


def machine() -> str:
    name = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"


def versions() -> str:
    import apache_beam
    import transformers

    return (f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"apache-beam {apache_beam.__version__}")


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def write_report(path: Path, csv_path: Path, results: list[dict], beam: dict | None,
                 kernels: list[dict] | None, argv: list[str], started: float, args) -> None:
    """Replace the report's `bench` section (between `<!-- bench:begin -->` and `<!-- bench:end -->`)
    with this run's, or append it; everything else in the file is left as it is."""
    L: list[str] = [BEGIN]
    w = L.append
    w("## One prompt at a time on a CPU: the full bench (`pipeline.bench`)\n")
    w(f"`python -m pipeline.bench {shlex.join(argv)}` on {_dt.date.today().isoformat()} "
      f"(total {time.perf_counter() - started:.0f} s).\n")
    w(f"- Machine: {machine()}; torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
      f"{os.environ.get('OMP_WAIT_POLICY', 'unset (OpenMP default: spin, then sleep)')}.")
    w(f"- Versions: {versions()}.")
    w(f"- Raw rows: `{os.path.relpath(csv_path, path.parent)}` (one row per configuration and prompt, with load "
      "average and CPU/wall).")
    w("- Every configuration runs on every prompt in one process, interleaved (the order rotates per prompt), so "
      "load drift hits all configurations alike; all ratios below come from the same run. The machine is shared: "
      "`load1` and `cpu/wall` say how much CPU this process got (2.0 cpu/wall = both cores).")
    w("- Greedy, fp32, batch 1. `speed-up` = decode time per token of the configuration's own target-alone baseline "
      "(same kernels: ours-prepacked vs `ours: target alone`, HF vs `HF greedy`) / the configuration's; prefill "
      "excluded (it is the same prompt pass for everyone). `total` includes prefill. `a` = per-token acceptance "
      "(geometric estimate: accepted / (accepted + rejections)); `acc.` = accepted/drafted (DESIGN.md's "
      "acceptance_rate). `bound` = the paper's E(a,g)/(g c + v(g+1)) with the measured a, c, v and g; "
      "`eff.` = speed-up / bound.\n")
    for res in results:
        summ = res["summary"]
        w(f"### {res['label']}\n")
        if res["note"]:
            w(res["note"] + "\n")
        w(f"Target {res['params'] / 1e6:.1f}M parameters, draft {res['draft_params'] / 1e6:.1f}M "
          f"({100 * res['draft_params'] / res['params']:.1f}%); {res['prompts']} prompts of "
          f"{res['prompt_tokens']:.0f} tokens on average, {res['max_new']} new tokens each; gamma {res['gamma']}; "
          f"1-token target step {res['step_ms']:.1f} ms (prepacked{_packed_note(res)}).\n")
        w("| configuration | tok/s | ms/tok (total) | ms/tok (decode) | acc. | a | tokens/step | mean g | c | "
          "speed-up | total | bound | eff. | identical | cpu/wall | load1 |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in summ:
            w(f"| {s['config']} | {s['tok_s']:.2f} | {s['ms_tok']:.1f} | {s['decode_ms_tok']:.1f} | "
              f"{_f(s['acceptance'])} | {_f(s['alpha'])} | {_f(s['tokens_per_step'])} | {_f(s['mean_gamma'], '{:.1f}')}"
              f" | {_f(s['c'], '{:.3f}')} | {s['speedup']:.2f}x | {s['speedup_total']:.2f}x | "
              f"{_f(s['bound'], '{:.2f}x')} | {_f(s['efficiency'])} | {'yes' if s['equal'] else '**NO**'} | "
              f"{s['cpu_util']:.2f} | {s['load1']:.1f} |")
        w("")
        costs = res["costs"]
        ks = sorted(costs["prepacked"].v)
        w("Measured step costs (median of interleaved rounds; v(k) = target pass over k tokens / 1-token pass, "
          "c = draft step / target step):\n")
        w("| kernels | c | " + " | ".join(f"v({k})" for k in ks) + " |")
        w("|---|---|" + "---|" * len(ks))
        for name, cst in costs.items():
            if name.endswith(" draft"):  # draft dtypes: their c is in the draft-dtype table below
                continue
            w(f"| {name} | {cst.c:.3f} | " + " | ".join(f"{cst.v.get(k, float('nan')):.2f}" for k in ks) + " |")
        w("")
        by = {s["config"]: s for s in summ}
        checks = headline(res, by)
        if checks:
            w("Speed targets (ratios from this run):\n")
            for line in checks:
                w(f"- {line}")
            w("")
        prof = by.get(f"ours: model g={res['gamma']}")
        if prof and prof["overhead_ms_round"] is not None:
            w(f"Per-round profile of `ours: model g={res['gamma']}` (forward hooks on both models; decode only): "
              f"target forward {prof['target_ms_round']:.1f} ms, draft forwards {prof['draft_ms_round']:.1f} ms, "
              f"everything else (our loop: list/tensor handling, argmax, accept/reject, cache rollback) "
              f"{prof['overhead_ms_round']:.2f} ms = **{100 * prof['overhead_frac']:.1f}%** of a round.\n")
        sweep = sorted((s for s in summ if s["drafter"] in ("model", "ngram") and s["family"] == "ours"
                        and s["kernels"] == "prepacked" and s["draft_dtype"] == "float32"
                        and "early" not in s["config"]),
                       key=lambda s: (s["drafter"], s["gamma"] != "adaptive", int(s["gamma"])
                                      if s["gamma"].isdigit() else 0))
        if len(sweep) > 2:
            w("Adaptive gamma vs fixed gamma on this (mixed) prompt set:\n")
            w("| drafter | gamma | ms/tok (decode) | speed-up | a | tokens/step |")
            w("|---|---|---|---|---|---|")
            for s in sweep:
                w(f"| {s['drafter']} | {s['gamma']} | {s['decode_ms_tok']:.1f} | {s['speedup']:.2f}x | "
                  f"{_f(s['alpha'])} | {_f(s['tokens_per_step'])} |")
            w("")
            kinds = sorted({r["prompt_kind"] for r in res["rows"]})
            if len(kinds) > 1:
                w("Per prompt kind (decode ms/token):\n")
                w("| configuration | " + " | ".join(kinds) + " |")
                w("|---|" + "---|" * len(kinds))
                for s in sweep:
                    cells = []
                    for k in kinds:
                        rs = [r for r in res["rows"] if r["config"] == s["config"] and r["prompt_kind"] == k]
                        t = sum(r["new_tokens"] for r in rs)
                        cells.append(f"{1e3 * sum(r['latency_s'] - r['prefill_s'] for r in rs) / t:.1f}")
                    w(f"| {s['config']} | " + " | ".join(cells) + " |")
                w("")
        L.extend(dtype_section(res, by))
        L.extend(sampling_section(res, by))
    if kernels:
        w("### Verify cost v(k) under CPU settings (synthetic target, prompt context)\n")
        ks = [k for k in kernels[0] if k.startswith("v")]
        w("| setting | 1-token step ms | " + " | ".join(f"v({k[1:]})" for k in ks) + " |")
        w("|---|---|" + "---|" * len(ks))
        for r in kernels:
            w(f"| {r['setting']} | {r['t1_ms']:.1f} | " + " | ".join(f"{r[k]:.2f}" for k in ks) + " |")
        w("")
    if beam:
        w("### Beam job vs bare engine loop\n")
        w(f"`pipeline.run.main([...])` (FnApiRunner, in process) against `TextGenerator.load` + a loop over the same "
          f"{beam['prompts']} prompts, both including model loading; median of {beam['reps']} alternating runs; "
          f"load1 {beam['load1']:.1f}.\n")
        w("| | wall s | of which generation (sum of latency_s) |")
        w("|---|---|---|")
        w(f"| bare loop | {beam['bare_wall']:.2f} | {beam['bare_gen']:.2f} (loading {beam['bare_load']:.2f}) |")
        w(f"| Beam job | {beam['job_wall']:.2f} | {beam['job_gen']:.2f} |")
        w(f"\nBeam overhead = (job − bare) / job = **{100 * beam['overhead_frac']:.1f}%** of the job's time "
          f"(target < 10%); same generations: {'yes' if beam['same_outputs'] else 'NO'}.\n")
    while L[-1] == "":
        L.pop()
    w(END)
    replace_section(path, "\n".join(L) + "\n", BEGIN, END)


def replace_section(path: Path, section: str, begin: str, end: str) -> None:
    """Put `section` (which starts with `begin` and ends with `end`) in place of the file's section
    between those markers, or append it (a new file starts with `# Benchmarks`). Each tool owns
    its own markers and replaces only them, so a rerun never leaves an old copy behind."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    m = re.search(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", text, re.S)
    if m:
        text = text[:m.start()] + section.rstrip("\n") + "\n" + text[m.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _packed_note(res: dict) -> str:
    rows = res.get("packed_from_rows")
    return "" if rows is None else f"; oneDNN-packed weights used from {rows} input rows, as timed at load on this CPU"


def dtype_section(res: dict, by: dict) -> list[str]:
    """The draft in fp32, `auto` (bf16 linears), bf16 and int8 side by side: acceptance, c and what
    they give, and the `auto` draft in HF's loop too."""
    g, costs = res["gamma"], res["costs"]
    rows = [(d, by.get(f"ours: model g={g}" if d == "float32" else f"ours: model g={g}, {d} draft"))
            for d in ("float32", "auto", "bfloat16", "int8") if f"{d} draft" in costs]
    rows = [(d, s) for d, s in rows if s]
    if len(rows) < 2:
        return []
    out = [f"Draft dtypes (target fp32, prepacked; gamma {g}; c measured side by side, interleaved, in bursts of "
           f"{g} draft steps as in a round). Only the proposals change, so the outputs stay identical to the target "
           "alone; `bound` is the paper's formula with this row's a and c.\n",
           "| draft | c | acc. | a | tokens/step | ms/tok (decode) | speed-up | bound | identical |",
           "|---|---|---|---|---|---|---|---|---|"]
    for d, s in rows:
        out.append(f"| {d} | {costs[f'{d} draft'].c:.3f} | {_f(s['acceptance'])} | {_f(s['alpha'])} | "
                   f"{_f(s['tokens_per_step'])} | {s['decode_ms_tok']:.1f} | {s['speedup']:.2f}x | "
                   f"{_f(s['bound'], '{:.2f}x')} | {'yes' if s['equal'] else '**NO**'} |")
    best = min(rows, key=lambda x: x[1]["decode_ms_tok"])
    fp = dict(rows)["float32"] if "float32" in dict(rows) else None
    line = f"\nFastest here: **{best[0]}** draft ({best[1]['decode_ms_tok']:.1f} ms/token)"
    if fp and best[0] != "float32":
        line += f", {fp['decode_ms_tok'] / best[1]['decode_ms_tok']:.2f}x the fp32 draft"
    out += [line + ".\n"]
    hf32, hf_auto, ours_auto = (by.get(n) for n in (f"HF assisted g={g}", f"HF assisted g={g}, auto draft",
                                                    f"ours: model g={g}, auto draft"))
    if hf32 and hf_auto and ours_auto:
        same = "identical" if hf_auto["equal"] and ours_auto["equal"] else "NOT identical"
        hf_ms, hf32_ms, ours_ms = hf_auto["decode_ms_tok"], hf32["decode_ms_tok"], ours_auto["decode_ms_tok"]
        out += [f"The `auto` draft (the job's default) in both loops (gamma {g}): HF assisted {hf_ms:.1f} ms/token "
                f"(fp32 draft: {hf32_ms:.1f}), ours {ours_ms:.1f}: ours **{hf_ms / ours_ms:.2f}x** HF with the same "
                f"draft, {hf32_ms / ours_ms:.2f}x HF with the fp32 draft; outputs {same}.\n"]
    return out


def sampling_section(res: dict, by: dict) -> list[str]:
    """The paper's table: temperature 0 beside the sampled settings, ours against HF assisted
    sampling and the target alone at the same gamma, and what sampling costs in acceptance."""
    samp = res.get("sampling")
    if not samp:
        return []
    g = res["gamma"]
    sby = {s["config"]: s for s in samp["summary"]}
    settings = list(dict.fromkeys(s["sampling"] for s in samp["summary"]))
    table = [("greedy (T=0)", n, by.get(n)) for n in ("ours: target alone", "HF greedy", f"ours: model g={g}",
                                                       f"HF assisted g={g}")]
    for st in settings:
        table += [(st, n, sby.get(f"{n}, {st}")) for n in ("ours: target alone", "HF sample", f"ours: model g={g}",
                                                          f"HF assisted g={g}")]
    out = [f"### Sampling against greedy (gamma {g})\n",
           "Same prompts and pair; each sampled configuration draws with its own seeds, so outputs differ between "
           "configurations by design (exactness in sampling is distributional: tests/test_engine_sampling.py). "
           "HF runs with `do_sample=True, top_k=0` (HF's default top-k of 50 off, as in ours) and the assistant's "
           "constant schedule at the same gamma; `speed-up` is against the same setting's target alone of the same "
           "family (ours vs `ours: target alone`, HF vs `HF sample`/`HF greedy`); `a` for HF is inverted from "
           "tokens per round, as for greedy.\n",
           "| setting | configuration | tok/s | ms/tok (decode) | acc. | a | tokens/step | speed-up |",
           "|---|---|---|---|---|---|---|---|"]
    for st, n, s in table:
        if s:
            out.append(f"| {st} | {n} | {s['tok_s']:.2f} | {s['decode_ms_tok']:.1f} | {_f(s['acceptance'])} | "
                       f"{_f(s['alpha'])} | {_f(s['tokens_per_step'])} | {s['speedup']:.2f}x |")
    out.append("")
    greedy_o = by.get(f"ours: model g={g}")
    for st in settings:
        o, h = sby.get(f"ours: model g={g}, {st}"), sby.get(f"HF assisted g={g}, {st}")
        alone = sby.get(f"ours: target alone, {st}")
        if not (o and h and alone):
            continue
        r = h["decode_ms_tok"] / o["decode_ms_tok"]
        line = (f"- {st}: ours {r:.2f}x HF assisted sampling (decode; {h['ms_tok'] / o['ms_tok']:.2f}x total) "
                f"[target ≥ 1.2x: {'met' if r >= 1.2 else 'NOT met'}], {o['speedup']:.2f}x the target alone")
        if greedy_o and greedy_o["alpha"] is not None and o["alpha"] is not None:
            line += (f"; acceptance a {greedy_o['alpha']:.2f} greedy → {o['alpha']:.2f} here, tokens per target "
                     f"step {greedy_o['tokens_per_step']:.2f} → {o['tokens_per_step']:.2f}, speed-up "
                     f"{greedy_o['speedup']:.2f}x → {o['speedup']:.2f}x")
        if h["hf_errors"]:
            line += f"; HF assisted sampling raised {h['hf_errors']} time(s) (NaN residual) and was re-drawn"
        out.append(line)
    out.append("\nWhat sampling does to acceptance: greedy keeps a draft token when it IS the target's argmax; "
               "sampling keeps it with probability min(1, p(x)/q(x)), so a = sum_x min(p(x), q(x)) = 1 − TV(p, q). "
               "A draft that agrees on the top token but spreads its probability differently loses acceptance in "
               "sampling (the usual case for trained pairs, whose distributions are peaked); where p is flat and q "
               "close to it, as with this random-weight target, the argmax flips on near-ties while TV stays "
               "small, and sampling accepts MORE than greedy. Lower temperature and top-p sharpen p and q alike, "
               "moving a toward the greedy figure.\n")
    out.append("HF assisted sampling in transformers 5.23 applies temperature and top-p TWICE to the assistant: "
               "the target's processors (warpers included) reach the assistant's `generate()` as "
               "`logits_processor`, which `_get_logits_processor` merges before appending the warpers of the "
               "assistant's own sampling config. Its q is sharper than the draft's tempered distribution, so its "
               "acceptance drops whenever T ≠ 1 or top-p < 1 (still exact: it accepts against the q it sampled "
               "from); at T=1 without top-p both loops accept alike.\n")
    return out


def headline(res: dict, by: dict) -> list[str]:
    g = res["gamma"]
    out = []
    ours_m, hf_m = by.get(f"ours: model g={g}"), by.get(f"HF assisted g={g}")
    ad = by.get("ours: model adaptive")
    if ours_m and hf_m:
        best = max((x for x in (ours_m, ad) if x), key=lambda s: 1 / s["decode_ms_tok"])
        r1 = hf_m["decode_ms_tok"] / ours_m["decode_ms_tok"]
        r2 = hf_m["ms_tok"] / ours_m["ms_tok"]
        out.append(f"ours (model, g={g}) vs HF assisted (g={g}): {r1:.2f}x decode, {r2:.2f}x total "
                   f"[target ≥ 1.2x: {'met' if r1 >= 1.2 else 'NOT met'}]; best of ours ({best['config']}): "
                   f"{hf_m['decode_ms_tok'] / best['decode_ms_tok']:.2f}x; outputs identical: "
                   f"{'yes' if ours_m['equal'] and hf_m['equal'] else 'NO'}")
        hf_all = [s for name, s in by.items() if name.startswith("HF assisted g=")]
        ours_all = [s for name, s in by.items() if name.startswith("ours: model ") and "kernels" not in name
                    and "draft" not in name]
        if len(hf_all) > 1:
            hf_best = min(hf_all, key=lambda s: s["decode_ms_tok"])
            ours_best = min(ours_all, key=lambda s: s["decode_ms_tok"])
            out.append(f"ours at its best ({ours_best['config']}) vs HF assisted at its best ({hf_best['config']}): "
                       f"{hf_best['decode_ms_tok'] / ours_best['decode_ms_tok']:.2f}x decode")
        st = by.get(f"ours: model g={g}, stock kernels")
        if st:
            out.append(f"same kernels (stock) loop vs loop: ours {hf_m['decode_ms_tok'] / st['decode_ms_tok']:.2f}x "
                       "HF assisted (what our loop alone gives, without prepacked kernels)")
    effs = [(s["config"], s["efficiency"]) for s in by.values() if s["efficiency"] is not None]
    if effs:
        out.append("efficiency against the analytic bound: " + ", ".join(f"{n} {e:.2f}" for n, e in effs)
                   + " [target ≥ 0.9]")
    if ours_m and ours_m["overhead_frac"] is not None:
        out.append(f"per-round overhead outside the two models' forwards: {100 * ours_m['overhead_frac']:.1f}% "
                   f"[target < 5%: {'met' if ours_m['overhead_frac'] < 0.05 else 'NOT met'}]")
    if ad:
        fixed = [s for s in by.values() if s["drafter"] == "model" and s["kernels"] == "prepacked"
                 and s["gamma"].isdigit() and s["draft_dtype"] == "float32"]
        if fixed:
            best_fixed = min(fixed, key=lambda s: s["decode_ms_tok"])
            beats = ad["decode_ms_tok"] < best_fixed["decode_ms_tok"]
            out.append(f"adaptive gamma {ad['decode_ms_tok']:.1f} ms/tok vs best fixed ({best_fixed['config']}) "
                       f"{best_fixed['decode_ms_tok']:.1f} ms/tok: "
                       f"{'beats every fixed gamma' if beats else 'does NOT beat every fixed gamma'}")
        if ad["alpha"] is not None and ad["alpha"] < 0.2:
            slow = ad["decode_ms_tok"] / by["ours: target alone"]["decode_ms_tok"] - 1
            slow_t = ad["ms_tok"] / by["ours: target alone"]["ms_tok"] - 1
            out.append(f"near-zero acceptance (a={ad['alpha']:.2f}): adaptive is {100 * slow:+.1f}% decode, "
                       f"{100 * slow_t:+.1f}% total vs the target alone [target ≤ +5%: "
                       f"{'met' if slow_t <= 0.05 else 'NOT met'}]; fixed g={g}: "
                       f"{100 * (ours_m['ms_tok'] / by['ours: target alone']['ms_tok'] - 1):+.1f}% total")
    return out


# Speed-up against batch width: `python -m pipeline.bench.report` draws it from committed results.
# GPU widths come from `pipeline.bench.gpu`'s JSON (every width whose table has both ours with the
# defaults and HF's compiled `generate`); the other points are the CSV's, copied from BENCHMARKS.md's
# tables with the file each comes from.

_ROOT = Path(__file__).resolve().parents[2]
SPEEDUP_CSV = _ROOT / "benchmarks" / "speedup-by-batch.csv"
GPU_RESULTS = _ROOT / "benchmarks" / "gpu" / "results"
PLOT_PNG = _ROOT / "benchmarks" / "speedup-by-batch.png"
GPU_OURS, GPU_HF = "ours, draft, chained, compiled", "HF generate, static cache + compile"


def gpu_points(results_dir: Path) -> list[dict]:
    import json

    out = []
    for f in sorted(results_dir.glob("*.json")):
        d = json.loads(f.read_text())
        for b, cfgs in d.get("batched", {}).get("by_batch_size", {}).items():
            if GPU_OURS in cfgs and GPU_HF in cfgs:
                out.append({"kind": "GPU", "device": d["device_name"], "pair": f"synthetic {d['shape']}",
                            "new_tokens": int(d["batch_max_new_tokens"]), "batch": int(b),
                            "speedup": cfgs[GPU_OURS]["tokens_per_s"] / cfgs[GPU_HF]["tokens_per_s"],
                            "baseline": "HF generate, static cache + torch.compile", "source": f.name})
    return out


def table_points(csv_path: Path) -> list[dict]:
    """Rows: kind, device, pair, new_tokens, batch, unit (tokens/s or ms/token), ours, baseline value,
    baseline (what it is), source."""
    import csv

    out = []
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            ours, base = float(r["ours"]), float(r["baseline_value"])
            out.append({"kind": r["kind"], "device": r["device"], "pair": r["pair"],
                        "new_tokens": int(r["new_tokens"]), "batch": int(r["batch"]),
                        "speedup": ours / base if r["unit"] == "tokens/s" else base / ours,
                        "baseline": r["baseline"], "source": r["source"]})
    return out


def speedup_points(csv_path: Path = SPEEDUP_CSV, results_dir: Path = GPU_RESULTS) -> list[dict]:
    """Both sources; a GPU width present in the JSON replaces the CSV's row for it. A source that does not read
    raises ValueError naming its flag and file."""
    try:
        gpu = gpu_points(results_dir) if results_dir.is_dir() else []
    except (UnicodeDecodeError, ValueError, KeyError) as e:  # (json's JSONDecodeError is a ValueError)
        raise ValueError(f"--gpu_results {str(results_dir)!r}: a file there is no pipeline.bench.gpu result "
                         f"({type(e).__name__}: {e})") from e
    try:
        table = table_points(csv_path)
    except (UnicodeDecodeError, ValueError, KeyError) as e:
        raise ValueError(f"--csv {str(csv_path)!r}: not a table of speed-up points ({type(e).__name__}: {e})") from e
    seen = {(p["device"], p["pair"], p["new_tokens"], p["batch"]) for p in gpu}
    rows = [p for p in table if (p["device"], p["pair"], p["new_tokens"], p["batch"]) not in seen]
    return sorted(rows + gpu, key=lambda p: (p["kind"] != "GPU", p["device"], p["pair"], p["new_tokens"], p["batch"]))


def write_plot(points: list[dict], png: Path) -> None:
    """One line per device, pair and output length: ours with its draft over the best plain decoding
    of the same target at the same batch width (log2 x axis; 1.0 = a tie)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    series: dict[tuple, list[dict]] = {}
    for p in points:
        series.setdefault((p["kind"], p["device"], p["pair"], p["new_tokens"]), []).append(p)
    for (kind, device, pair, new), ps in series.items():
        ps = sorted(ps, key=lambda p: p["batch"])
        xs, ys = [p["batch"] for p in ps], [p["speedup"] for p in ps]
        ax.plot(xs, ys, "o-" if kind == "GPU" else "s--", label=f"{kind}, {device}: {pair}, {new} new tokens")
        if kind == "GPU":  # the CPU lines crowd each other near 1.0; their values are in the tables
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(f"{y:.2f}x", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    widths = sorted({p["batch"] for p in points})
    ax.set_xticks(widths, [str(b) for b in widths])
    ax.set_xlabel("batch width B (prompts decoded together)")
    ax.set_ylabel("speed-up over the best plain decoding")
    ax.set_title("Ours with a draft against the target alone at the same B\n"
                 "(GPU: HF generate with a static cache and torch.compile; CPU: plain HF generate)", fontsize=9)
    ax.legend(fontsize=7)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")


def main(argv: list[str] | None = None) -> int:
    from pipeline.flags import ArgumentParser

    p = ArgumentParser(prog="python -m pipeline.bench.report",
                       description="Draw the speed-up against batch width from the committed results.")
    p.add_argument("--csv", default=str(SPEEDUP_CSV), help="table points (CPU, and GPU widths without JSON)")
    p.add_argument("--gpu_results", default=str(GPU_RESULTS), help="pipeline.bench.gpu's JSON files")
    p.add_argument("--out", default=str(PLOT_PNG), help="the PNG to write")
    a = p.parse_args(argv)
    from pipeline.errors import JobConfigError
    from pipeline.paths import writable_file

    try:  # (each was a traceback, --out '' after the plotting)
        a.out = writable_file("--out", a.out)
        if not Path(a.csv).is_file():
            raise JobConfigError(f"--csv {a.csv!r}: no such file")
        points = speedup_points(Path(a.csv), Path(a.gpu_results))
    except ValueError as e:  # (JobConfigError's too)
        p.error(str(e))
    write_plot(points, Path(a.out))
    for q in points:
        print(f"{q['kind']} {q['device']} | {q['pair']} | {q['new_tokens']} new | B={q['batch']} | "
              f"{q['speedup']:.2f}x {q['baseline']} | {q['source']}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
