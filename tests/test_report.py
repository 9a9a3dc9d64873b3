"""`pipeline.report`: the numbers, the page with its plots, and prepare -> run -> report end to end."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.report import html as report_html
from pipeline.report import summary as report
from pipeline.report.stats import compare, run_stats, sections

STATS = ["new_tokens", "draft_tokens", "accepted_tokens", "verify_steps", "draft_steps", "prompt_tokens"]


def result_table(rows: list[dict]) -> pa.Table:
    """Result rows in the output schema (transforms/schema.py), from a few given fields."""
    from transforms.schema import result_schema

    schema = result_schema(pa.schema([("id", pa.string()), ("ref", pa.string())]), "id", ["ref"])
    full = []
    for r in rows:
        row = {"generation": "", "finish_reason": "length", "seed": 0, "ttft_s": 0.01, "prefill_s": 0.01,
               "ref": None, "draft_s": 0.0, "draft_steps": 0, "draft_tokens": 0, "accepted_tokens": 0,
               "admit_s": 0.01, "admitted_with": 1, "admit_passes": 1, "rejections": 0, **r}
        row["acceptance_rate"] = row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None
        row["tokens_per_s"] = row["new_tokens"] / row["latency_s"]
        full.append(row)
    return pa.Table.from_pylist(full, schema)


def failed_table(rows: list[tuple[str, str]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "prompt": "", "error_type": t, "error_message": "m"} for i, t in rows])


# Four speculative items and their baseline: item d is slower with speculation, item c differs.
RUN = [
    dict(id="a", generation="x y", new_tokens=10, draft_tokens=12, accepted_tokens=9, verify_steps=3, draft_steps=12,
         prompt_tokens=5, latency_s=0.10, draft_s=0.012, verify_s=0.06, rejections=1),
    dict(id="b", generation="p q", new_tokens=8, draft_tokens=8, accepted_tokens=4, verify_steps=4, draft_steps=8,
         prompt_tokens=9, latency_s=0.20, draft_s=0.008, verify_s=0.08, finish_reason="eos",
         rejections=2),
    dict(id="c", generation="other", new_tokens=6, draft_tokens=8, accepted_tokens=2, verify_steps=4, draft_steps=8,
         prompt_tokens=3, latency_s=0.15, draft_s=0.008, verify_s=0.08, rejections=3),
    dict(id="d", generation="k", new_tokens=4, draft_tokens=8, accepted_tokens=0, verify_steps=4, draft_steps=8,
         prompt_tokens=20, latency_s=0.30, draft_s=0.008, verify_s=0.08, rejections=4),
]
BASE = [
    dict(id=r["id"], generation=g, new_tokens=r["new_tokens"], verify_steps=r["new_tokens"],
         prompt_tokens=r["prompt_tokens"], latency_s=lat, verify_s=0.01 * r["new_tokens"])
    for r, g, lat in zip(RUN, ["x y", "p q", "same?", "k"], [0.3, 0.4, 0.3, 0.15], strict=True)
]


def test_run_figures_follow_from_the_rows():
    results, failed = result_table(RUN), failed_table([("e", "EmptyPrompt"), ("f", "PromptTooLong"),
                                                       ("g", "EmptyPrompt")])
    s = run_stats(results, failed)
    assert s.summary.prompts == 7 and s.summary.failed == 3
    assert s.failures_by_type == {"EmptyPrompt": 2, "PromptTooLong": 1}
    assert s.finish_reasons == {"length": 3, "eos": 1}
    assert s.summary.acceptance == pytest.approx(15 / 36)
    # the paper's a: 15 accepted before 1 + 2 + 3 + 4 rejections; files written before the column have none
    assert s.per_token_acceptance == pytest.approx(15 / 25)
    assert dict(sections(s)[1][1])["per-token acceptance a (accepted / (accepted + rejections))"] == "0.600"
    older = run_stats(results.drop_columns(["rejections"]))
    assert older.per_token_acceptance is None and "n/a" in dict(sections(older)[1][1]).values()
    # a run resumed from older files: its a would be the newer rows' alone
    mixed = pa.concat_tables([results.slice(0, 2).drop_columns(["rejections"]), results.slice(2)],
                             promote_options="default")
    assert run_stats(mixed).per_token_acceptance is None
    assert s.acceptance_items.mean == pytest.approx(np.mean([9 / 12, 4 / 8, 2 / 8, 0]))
    assert s.summary.tokens_per_step == pytest.approx(28 / 15)
    assert s.tokens_per_step_items.p50 == pytest.approx(np.median([10 / 3, 2, 1.5, 1]))
    assert s.summary.latency_p99_s == pytest.approx(np.percentile([0.1, 0.2, 0.15, 0.3], 99))
    assert s.summary.tokens_per_s == pytest.approx(28 / 0.75)
    assert s.draft_step_s == pytest.approx(0.036 / 36) and s.verify_pass_s == pytest.approx(0.3 / 15)
    assert s.summary.draft_target_cost == pytest.approx((0.036 / 36) / (0.3 / 15))


def test_admissions_follow_from_the_rows_and_older_files_have_none():
    # a and b entered together in one prefill pass, c and d together in two; each row's admit_s
    # counts its own admission and those it waited on.
    admits = [dict(admit_s=0.02, admitted_with=2, admit_passes=1), dict(admit_s=0.03, admitted_with=2, admit_passes=1),
              dict(admit_s=0.05, admitted_with=2, admit_passes=2), dict(admit_s=0.05, admitted_with=2, admit_passes=2)]
    results = result_table([{**r, **a} for r, a in zip(RUN, admits, strict=True)])
    a = run_stats(results).admissions
    assert (a.rows, a.passes) == (4, 3) and a.share == pytest.approx(0.15 / 0.75)
    text = dict(sections(run_stats(results))[2][1])
    assert text["rows admitted / target prefill passes"] == "4 / 3 (1.3 rows a pass)"
    assert text["time waiting on admissions (share of generation time)"] == "20.0%"
    older = results.drop_columns(["admit_s", "admitted_with", "admit_passes"])
    assert run_stats(older).admissions is None
    assert "rows admitted / target prefill passes" not in dict(sections(run_stats(older))[2][1])


def test_comparison_joins_on_id_and_finds_where_speculation_did_not_help():
    run, base = result_table(RUN), result_table(BASE[::-1])  # another order: the join is by id
    c = compare(run, base)
    assert (c.matched, c.only_run, c.only_baseline) == (4, 0, 0)
    assert c.speedup == pytest.approx(1.15 / 0.75)
    assert c.speedup_items.p50 == pytest.approx(np.median([3, 2, 2, 0.5]))
    assert c.slower_items == 1 and c.least_helped[0] == ("d", pytest.approx(0.5))
    assert c.identical == 3 and c.first_differences == ["c"]
    base_step = 0.28 / 28
    assert c.c == pytest.approx((0.036 / 36) / base_step) and c.v == pytest.approx((0.3 / 15) / base_step)
    c2 = compare(run, result_table(BASE[:2] + [dict(BASE[0], id="z")]))
    assert (c2.matched, c2.only_run, c2.only_baseline) == (2, 2, 1)
    # c and v from the matched rows only (they took every row of each, other prompts' included), none without any
    base_step2 = (0.01 * 10 + 0.01 * 8) / 18
    assert c2.c == pytest.approx((0.020 / 20) / base_step2) and c2.v == pytest.approx((0.14 / 7) / base_step2)
    odd = compare(result_table(RUN + [dict(RUN[0], id="run only", draft_s=5.0, verify_s=5.0)]), base)
    assert (odd.c, odd.v) == (pytest.approx(c.c), pytest.approx(c.v))  # (a row the baseline lacks: not counted)
    apart = compare(run, result_table([dict(BASE[0], id="z")]))
    assert apart.matched == 0 and apart.c is apart.v is apart.baseline_step_s is None
    # The null id is an id like any other (a hash join never matches it), in the run's order.
    nulled = compare(result_table([dict(RUN[0], id=None)] + RUN[1:]), result_table([dict(BASE[0], id=None)] + BASE[1:]))
    assert (nulled.matched, nulled.only_run, nulled.only_baseline) == (4, 0, 0)
    assert nulled.speedup == pytest.approx(1.15 / 0.75) and nulled.identical == 3
    assert nulled.item_run_rows.tolist() == [0, 1, 2, 3]
    # Ids of two integer types (inputs written apart) are matched; ids that cannot be are refused.
    ints = pa.Table.from_pylist([{"id": 1, "generation": "g", "latency_s": 0.1, "verify_s": 0.1, "verify_steps": 1,
                                  "new_tokens": 1, "draft_s": 0.0, "draft_steps": 0}])
    as32 = ints.set_column(0, "id", ints["id"].cast(pa.int32()))
    assert compare(as32, ints).matched == 1
    with pytest.raises(ValueError, match="the baseline's ids are string, the run's int32: they cannot be matched"):
        compare(as32, ints.set_column(0, "id", pa.array(["1"])))  # ("1" is not the id 1)


def test_a_sampled_baseline_that_drafted_nothing_is_no_other_generation(tmp_path, capsys):
    """A sampled run against its --drafter none baseline: the drafter (and gamma) decide which sample a seed gives, so
    the texts may differ, but neither is another generation setting."""
    from pipeline.provenance import with_provenance

    for name, rows, drafter in (("run", RUN, "model"), ("base", BASE, "none")):
        t = result_table(rows)
        (tmp_path / name).mkdir()
        record = {"drafter": drafter, "temperature": 0.7, "max_new_tokens": 8}
        pq.write_table(t.replace_schema_metadata(with_provenance(t.schema, record).metadata),
                       tmp_path / name / "gens-00000-of-00001.parquet")
    report.main([str(tmp_path / "run" / "gens"), "--baseline", str(tmp_path / "base" / "gens")])
    assert "other generation flags" not in capsys.readouterr().err


def test_a_run_without_drafts_or_baseline_or_failures_says_so_instead_of_empty_plots():
    figures = {p.title: p for p in report_html.plots(run_stats(result_table(BASE)))}
    acceptance = figures["Acceptance per item"]
    assert acceptance.png is None and "nothing was drafted" in acceptance.no_data
    assert figures["Speed-up per item against the baseline"].png is None
    assert "no baseline" in figures["Speed-up per item against the baseline"].no_data
    assert figures["Failed rows by type"].png is None and "No failed rows" in figures["Failed rows by type"].no_data
    assert figures["Tokens per target step"].png.startswith(b"\x89PNG")
    text = dict(sections(run_stats(result_table(BASE)))[1][1])
    assert text["acceptance (accepted / drafted)"] == "n/a" and text["acceptance per item"] == "n/a"


def test_a_run_with_no_generated_rows_still_reports():
    empty = result_table([])
    stats = run_stats(empty, failed_table([("e", "EmptyPrompt")]))
    text = dict(row for _, rows in sections(stats, compare(empty, result_table(BASE))) for row in rows)
    assert text["prompts"] == "1 (0 generated, 1 failed)" and text["speed-up per item"] == "n/a"
    assert text["tokens per target step"] == text["latency p50 / p95 / p99"] == "n/a"  # (they read 0 before)
    assert text["throughput (new tokens / summed generation time)"] == "n/a"
    figures = report_html.plots(stats)
    assert [p.title for p in figures if p.png is not None] == ["Failed rows by type"]
    assert figures[0].no_data == "No data: no generated items."  # (not "nothing was drafted in this run")


def _write(prefix: Path, results: pa.Table, failed: pa.Table | None = None) -> str:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(results, f"{prefix}-00000-of-00001.parquet")
    if failed is not None:
        pq.write_table(failed, f"{prefix}-failed-00000-of-00001.parquet")
    return str(prefix)


def test_missing_files_or_reference_column_stop_in_one_line(tmp_path, capsys):
    assert report.main([str(tmp_path / "nothing")]) == 2
    prefix = _write(tmp_path / "run" / "gens", result_table(RUN))
    assert report.main([prefix, "--references", "summary"]) == 2
    missing, column = capsys.readouterr().err.strip().splitlines()  # one line each
    assert missing.startswith("error: no result files")
    assert column.startswith("error: reference column 'summary' is not in the results") and "ref" in column
    # (each was a traceback: prompt shards of the prefix's name, a column of numbers or of the run's own, a folder)
    prompts = _write(tmp_path / "prompts" / "p", pa.table({"id": ["a"], "prompt": ["hi"]}))
    scored = _write(tmp_path / "scored" / "gens", result_table(RUN).append_column("score", pa.array([1] * len(RUN))))
    cut = _write(tmp_path / "cut" / "gens", result_table(RUN))  # and a chunk cut short (an interrupted copy)
    chunk = tmp_path / "cut" / f"gens-chunk-{1:032x}-00000.parquet"
    chunk.write_bytes((tmp_path / "cut" / "gens-00000-of-00001.parquet").read_bytes()[:200])
    damaged = _write(tmp_path / "damaged" / "gens", result_table(RUN))  # a page header overwritten (pyarrow's
    shard = tmp_path / "damaged" / "gens-00000-of-00001.parquet"       # error then holds line breaks)
    data, page = bytearray(shard.read_bytes()), pq.ParquetFile(shard).metadata.row_group(0).column(0).data_page_offset
    data[page:page + 32] = bytes(b ^ 0xA5 for b in data[page:page + 32])
    shard.write_bytes(bytes(data))
    for args, needle in [([prompts], "its files hold no generations (no 'new_tokens' column)"),
                         ([prefix, "--baseline", prompts], f"--baseline '{prompts}': its files hold no generations"),
                         ([prefix, "--baseline", str(tmp_path / "nothing")], f"--baseline '{tmp_path}/nothing': no "
                          f"result files {tmp_path}/nothing-SSSSS-of-NNNNN.parquet"),
                         ([scored, "--references", "score"], "--references 'score' is int64, not text"),
                         ([prefix, "--references", "new_tokens"], "'new_tokens' is an output column"),
                         ([prefix, "--html", str(tmp_path)], f"--html '{tmp_path}': a folder, not a file"),
                         # (a run's own shard, written over and lost; a glob's j* took j1-failed-* for results)
                         ([prefix, "--html", f"{prefix}-00000-of-00001.parquet"], "a Parquet file's name"),
                         ([prefix, "--html", ""], "--html '': names no file"),
                         ([prefix, "--html", "-"], "--html '-': this writes a file, not standard output"),
                         ([prefix, "--html", "gs://"], "--html 'gs://': not a Cloud Storage path"),
                         ([prefix, "--baseline", f"{prefix}/"[:-1]], "is the run itself"),
                         ([prefix, "--baseline", ""], "--baseline '': names nothing"),
                         ([prefix, "--references", ""], "--references '': names nothing"),
                         ([f"{tmp_path}/run/g*"], "a prefix cannot hold *, ?, ["),
                         ([cut], f"{cut}-chunk-{1:032x}-00000.parquet is not a readable Parquet file"),
                         ([damaged], f"{shard} is not a readable Parquet file (Couldn't deserialize thrift"),
                         ([prefix, "--baseline", f"{tmp_path}/run/g?ns"], "--baseline"),
                         ([prefix, "--metric", "chrf"], "--metric chrf scores against --references COLUMN"),
                         ]:
        assert report.main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and needle in err and "\n" not in err, err


def test_rows_without_a_reference_are_left_out_of_the_scores(tmp_path, capsys):
    """A null reference (a run resumed without the column) is no reference: ROUGE counted it as a
    0, chrF left it out; nor is a blank one (a dataset's missing text), which both scored 0. Scored
    over the rows that have one, with their count; a column of nulls only is one line."""
    gens = [r["generation"] for r in RUN]
    refs = [gens[0], None, gens[2], " "]
    run = _write(tmp_path / "run" / "gens", result_table([dict(r, ref=ref) for r, ref in zip(RUN, refs, strict=True)]))
    for metric, key in (("rouge", "ROUGE-1 F1"), ("chrf", "chrF (0-100)")):
        assert report.main([run, "--references", "ref", "--metric", metric]) == 0
        got = labelled(capsys.readouterr().out)
        assert got["rows with a reference (scored)"] == "2 of 4"
        assert got[key] == ("1.0000" if metric == "rouge" else "100.00"), got  # each scored row equals its reference
        assert got["distinct outputs (share)"] == f"{len(set(gens)) / len(gens):.4f}"  # over every row
    none = _write(tmp_path / "none" / "gens", result_table([dict(r, ref=None if i % 2 else "") for i, r in
                                                            enumerate(RUN)]))
    assert report.main([none, "--references", "ref"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --references 'ref' is null or blank in every result row: no reference to score against"


def test_a_run_whose_rows_all_failed_is_reported_with_references(tmp_path, capsys):
    """Nothing to score is said in the scores; the rest of the report stands (it was one line
    saying the references were null)."""
    run = _write(tmp_path / "run" / "gens", result_table([]),  # (its passthrough column: ref)
                 failed_table([("e", "EmptyPrompt")]))
    assert report.main([run, "--references", "ref"]) == 0
    got = labelled(capsys.readouterr().out)
    assert got["prompts"] == "1 (0 generated, 1 failed)"
    assert got["rows with a reference (scored)"] == "0 of 0: no generated row to score"


def test_rouge_of_a_script_it_cannot_read_is_said(tmp_path, capsys):
    """rouge-score keeps a-z and 0-9: outputs equal to their Cyrillic references score 0. Said, with
    the metric that reads them; chrF scores them 100."""
    texts = ["Привет, мир: это тест.", "Второе предложение здесь."]
    rows = [dict(r, generation=t, ref=t) for r, t in zip(RUN[:2], texts, strict=True)]
    run = _write(tmp_path / "run" / "gens", result_table(rows))
    assert report.main([run, "--references", "ref"]) == 0
    out, err = capsys.readouterr()
    assert labelled(out)["ROUGE-1 F1"] == "0.0000"
    assert "note: ROUGE reads a-z and 0-9 only" in err and "drops 100% of the references' letters" in err
    assert report.main([run, "--references", "ref", "--metric", "chrf"]) == 0
    out, err = capsys.readouterr()
    assert labelled(out)["chrF (0-100)"] == "100.00" and "note" not in err
    # capitals and digits are read (lower-cased, as rouge-score does); a corpus half of another script is said
    # with its share, a few foreign words are not
    for texts, share in ((["NASA Reports Q3 2024 Revenue of $1.2B.", "THE END, 42."], None),
                         (["Hello there, a short English line.", "Привет, мир: это русский текст!"], "47%"),
                         (["Café in Zürich, naïve.", "A plain English sentence with many letters."], None)):
        rows = [dict(r, generation=t, ref=t) for r, t in zip(RUN[:2], texts, strict=True)]
        run = _write(tmp_path / f"run-{share}-{texts[0][:4]}" / "gens", result_table(rows))
        assert report.main([run, "--references", "ref"]) == 0
        err = capsys.readouterr().err
        assert ("note: ROUGE" in err) == (share is not None) and (share is None or f"drops {share} " in err), err


def test_a_killed_job_with_failed_rows_only_so_far_is_reported(tmp_path, capsys):
    """Its committed failed chunks are all it has: reported (it said "no result files")."""
    prefix = tmp_path / "run" / "gens"
    prefix.parent.mkdir()
    pq.write_table(failed_table([("e", "EmptyPrompt"), ("f", "InvalidUtf8")]),
                   f"{prefix}-failed-chunk-{0xa1b:032x}-00000.parquet")
    assert report.main([str(prefix)]) == 0
    got = labelled(capsys.readouterr().out)
    assert got["prompts"] == "2 (0 generated, 2 failed)"
    assert got["failed rows by type"] == "EmptyPrompt 1, InvalidUtf8 1"


def chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def headless(browser: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args],
            capture_output=True, text=True, timeout=120)


def test_html_page_renders_in_a_headless_browser_with_every_image_loaded(tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium); .ci/run installs it")
    refs = ["x y z", "p q", "something", "k"]
    run = result_table([dict(r, ref=ref) for r, ref in zip(RUN, refs, strict=True)])
    prefix = _write(tmp_path / "run" / "gens", run, failed_table([("e", "EmptyPrompt"), ("f", "PromptTooLong")]))
    base = _write(tmp_path / "base" / "gens", result_table(BASE))
    page = tmp_path / "report.html"
    assert report.main([prefix, "--baseline", base, "--references", "ref", "--html", str(page)]) == 0
    html = page.read_text()
    assert "src=\"http" not in html and "<link" not in html  # self-contained
    images = html.count("<img ")
    assert images == 7  # every plot has data here
    dom = headless(browser, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    check = re.search(r'id="render-check"[^>]*>', dom.stdout)
    assert check, dom.stdout[-2000:]
    assert f'data-images="{images}"' in check.group(0) and f'data-loaded="{images}"' in check.group(0)
    assert "Against the baseline" in dom.stdout and "ROUGE-L F1" in dom.stdout
    shot = headless(browser, f"--screenshot={tmp_path / 'report.png'}", "--window-size=1400,2600", page.as_uri())
    assert shot.returncode == 0 and (tmp_path / "report.png").stat().st_size > 10_000

    # The baseline's own page: no drafts, no failures, no baseline: three plots say so in text.
    assert report.main([base, "--html", str(tmp_path / "base.html")]) == 0
    dom = headless(browser, "--dump-dom", (tmp_path / "base.html").as_uri()).stdout
    assert 'data-images="3" data-loaded="3"' in dom
    assert dom.count('class="no-data"') == 3 and "nothing was drafted" in dom and "No failed rows" in dom


# ---- prepare -> run -> report, end to end ------------------------------------------------------------------

ARTICLES = [
    ("The committee met on Monday and agreed the budget.", "Committee agrees budget."),
    ("Heavy rain closed the road to the village for two days.", "Rain closes village road."),
    ("The team won the final after extra time.", "Team wins final."),
    ("A new library opened in the town centre.", "Library opens in town."),
    ("Prices rose again in March, the office said.", "Prices rise in March."),
]


def labelled(text: str) -> dict[str, str]:
    """The printed report as label -> value (labels and values are separated by two spaces or more)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("  "):
            label, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            out[label] = value
    return out


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, saved_pairs):
    """A speculative run and its --drafter none baseline over prepared prompts with a reference column."""
    from pipeline import prepare, run
    from tests.test_pipeline import greedy_reference

    root = tmp_path_factory.mktemp("report")
    target, draft = saved_pairs["llama"]
    # Random tiny models write gibberish: give the first rows a reference that shares the start
    # of the target's own output, so that the quality scores are neither 0 nor 1.
    rows = [{"text": t, "summary": greedy_reference(target, f"summarize: {t}", 5) + " and more" if i < 3 else s}
            for i, (t, s) in enumerate(ARTICLES)]
    data = root / "news.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert prepare.main(["--dataset", str(data), "--template", "summarize: {text}", "--keep_fields", "summary",
                         "--output", str(root / "prompts" / "news")]) == 0
    # one row that cannot be generated, in a second shard
    pq.write_table(pa.table({"id": ["bad"], "prompt": [""], "summary": ["-"]}), root / "prompts" / "bad.parquet")
    prefixes = {}
    for name, extra in (("spec", ["--draft_model", str(draft)]), ("base", ["--drafter", "none"])):
        prefixes[name] = str(root / name / "gens")
        assert run.main(["--input", str(root / "prompts" / "*.parquet"), "--output", prefixes[name],
                         "--target_model", str(target), "--max_new_tokens", "10", "--passthrough_columns",
                         "summary", *extra]) == 0
    return root, prefixes


def _table(pattern: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted(Path("/").glob(pattern.lstrip("/")))])


def test_a_baseline_that_drafted_or_ran_another_target_is_said(two_runs, tmp_path, capsys):
    """Its files say how it ran: a drafted run as the baseline gave its verify pass as the
    target's step, and c and v from it, without a word (its speed-up and identical generations
    hold: an A/B of two drafted runs)."""
    _, p = two_runs
    assert report.main([p["base"], "--baseline", p["spec"]]) == 0
    out = capsys.readouterr()
    got = labelled(out.out)
    assert "note: --baseline" in out.err and "drafted (--drafter model)" in out.err
    assert got["baseline target step"] == got["c (draft step / baseline target step)"] == "n/a"
    assert got["speed-up (baseline / run generation time)"] != "n/a"
    # the same baseline files under another target's name: reported, with a note
    other = tmp_path / "base"
    other.mkdir()
    for f in Path(p["base"]).parent.glob("gens-0*.parquet"):
        table = pq.read_table(f)
        record = json.loads(table.schema.metadata[b"specdec_run"])
        record["target_model"] = "/elsewhere/target"
        pq.write_table(table.replace_schema_metadata({"specdec_run": json.dumps(record)}), other / f.name)
    assert report.main([p["spec"], "--baseline", str(other / "gens")]) == 0
    out = capsys.readouterr()
    assert "note: --baseline" in out.err and "/elsewhere/target" in out.err and "speed-up" in out.out
    assert "other generation flags" not in out.err
    # ... but not under another spelling of the same folder's path
    spec_file = next(Path(p["spec"]).parent.glob("gens-0*.parquet"))
    target = json.loads(pq.read_schema(spec_file).metadata[b"specdec_run"])["target_model"]
    for f in other.glob("gens-0*.parquet"):
        table = pq.read_table(f)
        record = json.loads(table.schema.metadata[b"specdec_run"])
        record["target_model"] = target.replace("/", "/./", 1) + "/"
        pq.write_table(table.replace_schema_metadata({"specdec_run": json.dumps(record)}), f)
    assert report.main([p["spec"], "--baseline", str(other / "gens")]) == 0
    assert "note: --baseline" not in capsys.readouterr().err
    # ... and under another --tokenizer (its token counts, and so its speeds, count other tokens); the target's own
    # tokenizer named as --tokenizer is no other
    for tokenizer, said in (("/elsewhere/tokenizer", True), (target, False)):
        for f in other.glob("gens-0*.parquet"):
            table = pq.read_table(f)
            record = {**json.loads(table.schema.metadata[b"specdec_run"]), "tokenizer": tokenizer}
            pq.write_table(table.replace_schema_metadata({"specdec_run": json.dumps(record)}), f)
        assert report.main([p["spec"], "--baseline", str(other / "gens")]) == 0
        err = capsys.readouterr().err
        assert ("ran --tokenizer /elsewhere/tokenizer, this run " in err) == said and "--target_model" not in err, err
    # ... and under other generation flags (another length, stop strings): "0 of n identical" is not a bug
    for f in Path(p["base"]).parent.glob("gens-0*.parquet"):
        table = pq.read_table(f)
        record = json.loads(table.schema.metadata[b"specdec_run"])
        record.update(max_new_tokens=16, stop=["."], dtype="bfloat16")
        pq.write_table(table.replace_schema_metadata({"specdec_run": json.dumps(record)}), other / f.name)
    assert report.main([p["spec"], "--baseline", str(other / "gens")]) == 0
    note = capsys.readouterr().err.strip().splitlines()[-1]
    assert note == (f"note: --baseline {other / 'gens'} ran other generation flags: --max_new_tokens 16 (this run 10), "
                    "--stop ['.'] (this run None), --dtype 'bfloat16' (this run 'float32'); its generations differ "
                    "for that reason, and its speed-up compares other work"), note
    # ... but a baseline that named the dtype this run's `auto` ran in (float32 on its CPU) ran no other flags
    for f in Path(p["base"]).parent.glob("gens-0*.parquet"):
        table = pq.read_table(f)
        record = {**json.loads(table.schema.metadata[b"specdec_run"]), "dtype": "float32"}
        pq.write_table(table.replace_schema_metadata({"specdec_run": json.dumps(record)}), other / f.name)
    assert report.main([p["spec"], "--baseline", str(other / "gens")]) == 0
    assert "other generation flags" not in capsys.readouterr().err


def test_a_baseline_of_other_prompts_is_said(two_runs, tmp_path, capsys):
    """A baseline that shares no id with the run (another input) is reported with a note, not only
    as "prompts in both runs 0" under speed-ups of n/a."""
    _, p = two_runs
    (tmp_path / "other").mkdir()
    for f in Path(p["base"]).parent.glob("gens-0*.parquet"):
        table = pq.read_table(f)
        ids = pa.array([f"other-{i}" for i in table["id"].to_pylist()], table.schema.field("id").type)
        pq.write_table(table.set_column(table.schema.get_field_index("id"), table.schema.field("id"), ids),
                       tmp_path / "other" / f.name)
    assert report.main([p["spec"], "--baseline", str(tmp_path / "other" / "gens")]) == 0
    out = capsys.readouterr()
    assert labelled(out.out)["prompts in both runs"].startswith("0 ")
    assert f"note: --baseline {tmp_path / 'other' / 'gens'} shares no id with this run" in out.err, out.err
    assert report.main([p["spec"], "--baseline", p["base"]]) == 0
    assert "shares no id" not in capsys.readouterr().err


def test_runs_read_together_are_reported_as_one(two_runs, tmp_path, capsys):
    """A job split in two (or a resumed run and the one it continued): comma-separated prefixes,
    as `read_outputs` takes a list."""
    _, p = two_runs
    spec = _table(f"{p['spec']}-0*.parquet")
    half = spec.num_rows // 2
    for name, part in (("a", spec.slice(0, half)), ("b", spec.slice(half))):
        (tmp_path / name).mkdir()
        pq.write_table(part, tmp_path / name / "gens-00000-of-00001.parquet")
    assert report.main([f"{tmp_path}/a/gens,{tmp_path}/b/gens"]) == 0
    assert labelled(capsys.readouterr().out)["prompts"] == f"{spec.num_rows} ({spec.num_rows} generated, 0 failed)"
    # a typo among them would leave its rows out unseen
    assert report.main([f"{tmp_path}/a/gens,{tmp_path}/typo/gens"]) == 2
    assert f"{tmp_path}/typo/gens: no output files there" in capsys.readouterr().err
    # a drafted baseline given as several prefixes is still said to be one (its files say so)
    assert report.main([p["base"], "--baseline", f"{tmp_path}/a/gens,{tmp_path}/b/gens"]) == 0
    out = capsys.readouterr()
    assert "drafted (--drafter model)" in out.err and labelled(out.out)["baseline target step"] == "n/a"


@pytest.mark.slow
def test_report_figures_match_the_files(two_runs, capsys):
    from rouge_score import rouge_scorer

    root, p = two_runs
    page = root / "report.html"
    assert report.main([p["spec"], "--baseline", p["base"], "--references", "summary", "--html", str(page)]) == 0
    got = labelled(capsys.readouterr().out)

    spec, base = _table(f"{p['spec']}-0*.parquet"), _table(f"{p['base']}-0*.parquet")
    failed = _table(f"{p['spec']}-failed-*.parquet")
    n = spec.num_rows
    assert n == len(ARTICLES) and failed["error_type"].to_pylist() == ["EmptyPrompt"]
    assert got["prompts"] == f"{n + 1} ({n} generated, 1 failed)"
    assert got["failed rows by type"] == "EmptyPrompt 1"
    drafted, accepted = sum(spec["draft_tokens"].to_pylist()), sum(spec["accepted_tokens"].to_pylist())
    new, steps = sum(spec["new_tokens"].to_pylist()), sum(spec["verify_steps"].to_pylist())
    assert drafted > 0
    assert got["drafted / accepted tokens"] == f"{drafted} / {accepted}"
    assert got["acceptance (accepted / drafted)"] == f"{accepted / drafted:.3f}"
    assert got["acceptance per item"].startswith(f"mean {np.mean(spec['acceptance_rate'].to_pylist()):.3f}, ")
    assert got["tokens per target step"] == f"{new / steps:.2f}"
    assert got["new tokens"] == f"{new}"
    assert got["new tokens per item"].startswith(f"mean {new / n:.1f}, ")
    lat = np.array(spec["latency_s"].to_pylist())
    assert got["latency p50 / p95 / p99"] == " / ".join(f"{np.percentile(lat, q):.3f} s" for q in (50, 95, 99))
    assert got["throughput (new tokens / summed generation time)"] == f"{new / lat.sum():.1f} tokens/s"
    reasons = {r: spec["finish_reason"].to_pylist().count(r) for r in set(spec["finish_reason"].to_pylist())}
    assert sorted(got["finish reasons"].split(", ")) == sorted(f"{k} {v}" for k, v in reasons.items())
    draft_step = sum(spec["draft_s"].to_pylist()) / sum(spec["draft_steps"].to_pylist())
    verify_pass = sum(spec["verify_s"].to_pylist()) / steps
    base_step = sum(base["verify_s"].to_pylist()) / sum(base["verify_steps"].to_pylist())
    assert got["c within the run (draft step / verify pass)"] == f"{draft_step / verify_pass:.3f}"
    assert got["c (draft step / baseline target step)"] == f"{draft_step / base_step:.3f}"
    assert got["v (verify pass / baseline target step)"] == f"{verify_pass / base_step:.3f}"

    base_by_id = dict(zip(base["id"].to_pylist(), base.to_pylist(), strict=True))
    spec_rows = spec.to_pylist()
    speedup = sum(base_by_id[r["id"]]["latency_s"] for r in spec_rows) / lat.sum()
    assert got["speed-up (baseline / run generation time)"] == f"{speedup:.2f}x"
    per_item = [base_by_id[r["id"]]["latency_s"] / r["latency_s"] for r in spec_rows]
    assert got["speed-up per item"].startswith(f"mean {np.mean(per_item):.2f}x, ")
    assert f"p50 {np.median(per_item):.2f}x" in got["speed-up per item"]
    # greedy: speculative decoding must reproduce the target alone, row by row
    assert all(r["generation"] == base_by_id[r["id"]]["generation"] for r in spec_rows)
    assert got["identical generations"] == f"{n} of {n}"

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    for kind, label in (("rouge1", "ROUGE-1 F1"), ("rouge2", "ROUGE-2 F1"), ("rougeL", "ROUGE-L F1")):
        expected = np.mean([scorer.score(r["summary"], r["generation"])[kind].fmeasure for r in spec_rows])
        assert 0 < expected < 1 and got[label] == f"{expected:.4f}"
    html = page.read_text()
    assert html.count("<img ") == 7 and f"<td>identical generations</td><td>{n} of {n}</td>" in html


@pytest.mark.slow
def test_report_scores_translation_metrics_with_sacrebleu(two_runs, capsys):
    import sacrebleu

    _, p = two_runs
    spec = _table(f"{p['spec']}-0*.parquet")
    gens, refs = spec["generation"].to_pylist(), spec["summary"].to_pylist()
    for metric, fn, label in (("bleu", sacrebleu.corpus_bleu, "BLEU (0-100)"),
                              ("chrf", sacrebleu.corpus_chrf, "chrF (0-100)")):
        assert report.main([p["spec"], "--references", "summary", "--metric", metric]) == 0
        got = labelled(capsys.readouterr().out)
        expected = fn(gens, [refs]).score
        assert 0 < expected < 100 and got[label] == f"{expected:.2f}"
        # every score under its own label, none under its key
        assert f"{len(set(gens)) / len(gens):.4f}" == got["distinct outputs (share)"] and "distinct_share" not in got
        assert "speed-up (baseline / run generation time)" not in got


def test_report_reads_and_writes_gs_paths(tmp_path, capsys):
    """Result and failed files on gs:// (a local emulator), the page written back to gs://."""
    from tests import gcs_emulator

    local = _write(tmp_path / "run" / "gens", result_table(RUN), failed_table([("e", "EmptyPrompt")]))
    with gcs_emulator.running() as gcs:
        gcs.bucket("report")
        gcs.upload_dir(tmp_path / "run", "gs://report/run")
        assert report.main(["gs://report/run/gens", "--html", "gs://report/run/report.html"]) == 0
        page = gcs.download("gs://report/run/report.html").decode()
    out = labelled(capsys.readouterr().out)
    assert out["prompts"] == "5 (4 generated, 1 failed)" and out["failed rows by type"] == "EmptyPrompt 1"
    assert report.main([local]) == 0 and labelled(capsys.readouterr().out)["prompts"] == out["prompts"]
    assert page.startswith("<!doctype html>") and page.count("<img ") == 5  # no baseline: 2 plots say so


def test_the_report_reads_results_without_torch():
    """Reading a run's files needs pyarrow and Beam's file systems, not the engine: the report
    (and its --help) no longer waits for torch and transformers to import (7.5 s against 1.7 s)."""
    import subprocess
    import sys

    code = "import sys, pipeline.report.summary; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])


def test_a_prefix_beside_a_folder_of_its_name_is_read(tmp_path, capsys):
    """A run's prefix `r/a` and a later run's `r/a/b` (which made the folder `r/a`): `r/a` still names the first
    run's files to read; only an output prefix naming a folder with none of its files is refused."""
    from pipeline.errors import JobConfigError
    from pipeline.paths import check_prefix

    first = _write(tmp_path / "r" / "a", result_table(RUN))
    (tmp_path / "r" / "a").mkdir()
    assert report.main([first]) == 0 and "prompts" in capsys.readouterr().out
    check_prefix("--output", first)  # (its files are there: an --overwrite of it is no folder's)
    with pytest.raises(JobConfigError, match="a prefix names files"):
        check_prefix("--output", str(tmp_path / "r"))
