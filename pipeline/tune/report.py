"""What `pipeline.tune` prints: the measured table, throughput per batch size, the recommended
`pipeline.run` command line and the job's estimated time, from the result dict (also the JSON)."""

from __future__ import annotations


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def format_report(res: dict) -> str:
    st, sm = res["settings"], res["sample"]
    mode = "greedy" if st["greedy"] else f"sampling, temperature {st['temperature']:g}" + (
        f", top-p {st['top_p']:g}" if st["top_p"] else "") + (f", top-k {st['top_k']}" if st["top_k"] else "")
    n = sm["prompts"]
    why = sm.get("skipped", {})
    skipped = (f"; {sum(why.values())} unusable rows skipped: " + ", ".join(f"{k} x{v}" for k, v in why.items())
               if why else "")
    lines = [f"pipeline.tune: {n} prompts of the input (mean {sm['mean_prompt_tokens']:.0f} tokens{skipped}), "
             f"{st['max_new_tokens']} new tokens each, {mode}; {st['threads']} thread(s) on {st['device']}.",
             "target v(k) = " + (" ".join(f"{k}:{v:.2f}" for k, v in sorted(res["target_v"].items()))
                                 or "not measured (no drafter to verify)"), ""]
    for c in res["candidates"]:
        best = max(c["predictions"], key=lambda p: p["predicted_with_overhead"], default=None)
        lines.append(f"  {c['name']}: a={_f(c['a'])} c={_f(c['c'], '{:.3f}')} drafting rounds "
                     f"{100 * c['coverage']:.0f}% overhead {c['overhead']:+.2f} passes/round; "
                     f"predicted best gamma {best['gamma'] if best else '-'}")
    head = ("candidate", "gamma", "a", "c", "predicted", "pred+overhead", "measured", "tok/s", "greedy equal")
    table = [head]
    for r in res["runs"]:
        g = "-" if r["gamma"] is None else (f"<={r['gamma']} adaptive" if r["gamma_policy"] == "adaptive"
                                             else str(r["gamma"]))
        po = _f(r["predicted_with_overhead"]) + ("*" if r["overhead_fitted_here"] else "")
        eq = "-" if r["equal_to_target"] is None else f"{r['equal_to_target']}/{n}"
        table.append((r["candidate"], g, _f(r["a"]), _f(r["c"], "{:.3f}"), _f(r["predicted"]), po,
                      _f(r["measured"]), _f(r["tokens_per_s"], "{:.1f}"), eq))
    lines += _table(table)
    lines += ["(speed-ups: decode time per token against the target alone, batch 1; * = the overhead term was "
              "fitted on this run)", ""]
    if res["batching"]:
        lines.append(f"Batching: {res['batching']}.")
    if len(res["throughput"]) > 2 or not res["batching"]:
        tt = [("setting", "batch", "tok/s per worker")]
        for r in res["throughput"]:
            name = r["candidate"] + ("" if r["gamma"] is None else f" gamma {r['gamma']} {r['gamma_policy']}")
            tt.append((name, str(r["batch_size"]), _f(r["tokens_per_s"], "{:.1f}")))
        lines += _table(tt) + [""]
    rec, est = res["recommended"], res["job_estimate"]
    lines += [f"Recommended ({rec['reason']}):", f"  {rec['flags']}",
              f"Estimated job time on this machine: {_duration(est['seconds'])} for {est['rows']} rows "
              f"(the target alone at batch 1: {_duration(est['seconds_target_alone_batch1'])}), from the sample's "
              f"time per row."]
    if st.get("compiled"):
        lines.append("The passes were compiled (torch.compile), as the job compiles them; compiles and graph "
                     "captures are left out of every time (a job's worker pays them once).")
    return "\n".join(lines)


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out
