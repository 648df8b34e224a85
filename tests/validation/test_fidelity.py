"""simtrain validate: the row keys, robustness, the summary, FLOP conventions and the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from simtrain.cli.main import main
from simtrain.spec.model import ModelSpec, preset
from simtrain.studies.uncertainty import read_error_table
from simtrain.validation.fidelity import (
    ROW_KEYS,
    convention_flops_per_token,
    convention_of,
    error_stats,
    to_json_dict,
    validate_runs,
)

from .conftest import SMALL_ROWS


def test_validate_small_csv_rows_and_summary(small_csv: Path) -> None:
    frame, summary = validate_runs(small_csv)
    assert list(frame.columns) == list(ROW_KEYS)
    rows = {r["run_id"]: r for r in frame.to_dict(orient="records")}
    assert len(rows) == 5
    ok = rows["tiny-fsdp"]
    assert ok["status"] == "ok"
    assert ok["step_time_error_pct"] == pytest.approx(
        100 * (ok["predicted_step_time_s"] - 0.5) / 0.5)
    assert ok["predicted_peak_mem_gib"] > 0 and ok["measured_peak_mem_gib"] == pytest.approx(20.0)
    parts = ok["predicted_compute_s"] + ok["predicted_bubble_s"] + ok["predicted_optimizer_s"] + ok[
        "predicted_other_s"] + sum(ok[f"predicted_exposed_{a}_s"] for a in ("tp", "cp", "ep", "dp", "pp"))
    assert parts == pytest.approx(ok["predicted_step_time_s"], rel=1e-6)
    # measured step time derived from tokens/s/GPU, and MFU recomputed in NeMo's convention
    tp = rows["tiny-tp-fp8"]
    assert tp["measured_step_time_s"] == pytest.approx(32 * 2048 / (40000 * 16))
    assert tp["mfu_convention"] == "noncausal" and tp["predicted_mfu_pct_source_convention"] > 0
    assert any("tokens_per_s_per_gpu" in a for a in tp["assumptions"])
    assert rows["tiny-unknown-gpu"]["status"] == "ok"
    assert rows["tiny-no-layers"]["status"] == "not simulatable: n_layers"
    assert rows["tiny-bad-layout"]["status"].startswith("error:")
    assert summary["rows"] == 5 and summary["simulated"] == 3 and summary["not_simulatable"] == 1
    assert summary["errors"] == 1 and summary["compared"] == 3 and summary["not_fitting"] == 0
    assert set(summary["step_time"]) == {"count", "median_abs_pct", "mean_abs_pct", "p90_abs_pct"}
    assert summary["by_gpu"]["h100-sxm-96gb-500w"]["count"] == 1


def test_a_crashing_simulation_becomes_an_error_row(small_csv: Path) -> None:
    def boom(run):  # type: ignore[no-untyped-def]
        raise RuntimeError("kaput")

    frame, summary = validate_runs(small_csv, simulate_fn=boom)
    assert (frame.loc[frame["run_id"] == "tiny-fsdp", "status"] == "error: RuntimeError: kaput").all()
    assert summary["simulated"] == 0 and summary["step_time"]["count"] == 0


def test_error_stats() -> None:
    s = error_stats([-10.0, 5.0, 1.0, -2.0, 20.0])
    assert s["median_abs_pct"] == 5.0 and s["mean_abs_pct"] == pytest.approx(7.6) and s["p90_abs_pct"] == 20.0
    assert error_stats([])["count"] == 0


def test_nemo_convention_matches_the_readme_check() -> None:
    """validation/README: NeMo's formula gives Llama3-70B 4.81e11 FLOP/token and Llama3-8B 5.79e10."""
    assert convention_flops_per_token("noncausal", preset("llama3-70b"), 8192) == pytest.approx(4.81e11, rel=0.01)
    assert convention_flops_per_token("noncausal", preset("llama3-8b"), 8192) == pytest.approx(5.79e10, rel=0.01)


def test_conventions_reduce_to_the_published_formulas() -> None:
    m = ModelSpec(name="gpt", n_layers=24, hidden=2048, n_heads=16, ffn_hidden=8192, activation="gelu",
                  norm="layernorm", position="learned", vocab=51200, tied_embeddings=True, linear_bias=False)
    s, h, n_layers, v = 2048, 2048, 24, 51200
    # Narayanan et al.: 72 l h^2 (1 + s/6h + V/12lh) per token without recompute (non-causal)
    assert convention_flops_per_token("noncausal", m, s) == pytest.approx(
        72 * n_layers * h * h * (1 + s / (6 * h) + v / (12 * n_layers * h)), rel=1e-9)
    assert convention_flops_per_token("causal", m, s) < convention_flops_per_token("noncausal", m, s)
    assert convention_flops_per_token("sc21", m, s) == pytest.approx(
        96 * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h)))
    assert convention_flops_per_token("mpt", m, s) == pytest.approx(6 * m.param_count() + 12 * n_layers * h * s)
    assert convention_flops_per_token("bloom", m, s) == pytest.approx(8 * m.param_count())
    assert convention_of("Narayanan et al. eq.: 96*B*s*l*h^2*(1+s/(6h)+V/(16*l*h))") == "sc21"
    assert convention_of("MFU = (6*N*s + 12*L*d*s^2 ...)") == "mpt"
    assert convention_of("README: TFLOPs use 4*2 coefficient, i.e. 8*P*tokens") == "bloom"
    assert convention_of("i.e. CAUSAL attention (half of the NeMo s/h term)") == "causal"
    assert convention_of("NeMo 'Model TFLOP/s/GPU' ... (12Lh^2(1+g/a+s/h)+18Lfh+6Vh)") == "noncausal"
    assert convention_of(None) is None


def test_cli_validate_outputs(small_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, report, errors = tmp_path / "pred.csv", tmp_path / "fidelity.html", tmp_path / "errors.csv"
    assert main(["validate", str(small_csv), "--json", "--out", str(out), "--report", str(report),
                 "--error-table", str(errors)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"summary", "rows"} and len(data["rows"]) == 5
    assert set(data["rows"][0]) == set(ROW_KEYS)
    assert all(v is None or not (isinstance(v, float) and math.isnan(v)) for r in data["rows"] for v in r.values())
    assert out.read_text().startswith("run_id,") and len(out.read_text().splitlines()) == 6
    # the error table holds the three simulated visible rows with a measured step time
    table = read_error_table(errors)
    assert [r.run_id for r in table] == ["tiny-fsdp", "tiny-tp-fp8", "tiny-unknown-gpu"]
    assert [r.family for r in table] == ["torchtitan", "megatron", "megatron"] and not any(r.moe for r in table)
    page = report.read_text()
    assert "data:image/png;base64," in page and "tiny-fsdp" in page and "http" not in page.split("<body>")[1][:200]
    assert main(["validate", str(small_csv)]) == 0
    text = capsys.readouterr().out
    assert "tiny-no-layers" in text and "by source:" in text


def test_cli_validate_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2
    assert "not found" in capsys.readouterr().err


def test_worker_processes_give_the_same_rows_in_file_order(small_csv: Path) -> None:
    """validate_runs(workers=2) simulates rows in two processes: the same frame, row for row, as in-process."""
    one, _ = validate_runs(small_csv, workers=1)
    two, _ = validate_runs(small_csv, workers=2)
    pd.testing.assert_frame_equal(one, two)
    assert list(two["run_id"]) == [r["run_id"] for r in SMALL_ROWS]


def test_select_simulates_and_tables_only_the_rows_it_accepts(small_csv: Path) -> None:
    """validate_runs(select=...) leaves the other rows out of the frame; the rows it keeps are the ones every
    row gives, in file order (what the published-runs check and ``regenerate`` use with ``is_visible``)."""
    every, _ = validate_runs(small_csv)
    keep = {"tiny-fsdp", "tiny-unknown-gpu"}
    some, summary = validate_runs(small_csv, select=lambda r: r["run_id"] in keep)
    assert list(some["run_id"]) == [r["run_id"] for r in SMALL_ROWS if r["run_id"] in keep]
    plain = [to_json_dict(f, {})["rows"] for f in (some, every[every["run_id"].isin(keep)])]  # NaN and None as null
    assert plain[0] == plain[1]
    assert summary["rows"] == 2


def test_a_prediction_that_does_not_fit_the_gpu_is_flagged_in_the_row(tmp_path: Path) -> None:
    """The measured run fit its GPUs: a predicted peak above capacity means the row leaves out what saved
    the memory, and the row says so (predicted_fits False, a named note) instead of passing silently."""
    from simtrain.validation.fidelity import evaluate_row, render_table

    from .conftest import write_csv

    row = {k: str(v) for k, v in SMALL_ROWS[0].items()}
    fits = evaluate_row(row)
    row.update(recompute="none", seq_len="32768", micro_batch="4", global_batch_seqs="32")  # 128K tokens a GPU
    big = evaluate_row(row)
    assert fits["predicted_fits"] is True and not any("does not fit" in a for a in fits["assumptions"])
    assert big["status"] == "ok" and big["predicted_fits"] is False
    assert big["predicted_peak_mem_gib"] > 96
    assert any(a.startswith(f"predicted peak {big['predicted_peak_mem_gib']:.1f} GiB does not fit") for a in
               big["assumptions"])
    frame, summary = validate_runs(write_csv(tmp_path / "big.csv", [dict(row, run_id="big"), SMALL_ROWS[0]]))
    assert summary["not_fitting"] == 1
    table = render_table(frame, summary)
    assert "ok (predicted peak does not fit)" in table and "1 predicted not to fit their GPUs" in table


def _page_rows(page: str) -> list[list[tuple[str, str]]]:
    """The page table's body rows as (data-v, text) per cell."""
    import re

    body = page.split("<tbody>")[1].split("</tbody>")[0]
    return [re.findall(r"<td data-v='([^']*)'>([^<]*)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", body)]


def test_fidelity_page_is_a_curated_sortable_table(small_csv: Path) -> None:
    """The page shows the columns a reader needs (not the 33-column dump), one row per run, each numeric
    cell's sort key its exact value, with the plot and an inline sort script; nothing from the network."""
    import re

    from simtrain.validation.fidelity import PAGE_COLUMNS, render_html

    frame, summary = validate_runs(small_csv)
    page = render_html(frame, summary)
    headers = re.findall(r"<th title='click to sort'>([^<]*)</th>", page)
    assert headers == [h for _, h, _ in PAGE_COLUMNS] and len(headers) < len(ROW_KEYS) // 2
    assert {"run", "GPU", "model", "layout", "measured step s", "predicted step s", "step error %",
            "memory error %"} <= set(headers)
    rows = _page_rows(page)
    assert [r[0][1] for r in rows] == frame["run_id"].tolist()
    col = {key: i for i, (key, _, _) in enumerate(PAGE_COLUMNS)}
    fsdp = rows[0]
    ok = frame.iloc[0]
    assert float(fsdp[col["predicted_step_time_s"]][0]) == ok["predicted_step_time_s"]
    assert fsdp[col["step_time_error_pct"]][1] == format(ok["step_time_error_pct"], "+.1f")
    assert fsdp[col["layout"]][1] == "tp1 cp1 pp1 vpp1 dp8 fsdp-full mbs1 full" == ok["layout"]
    assert fsdp[col["model"]][1] == ok["model"]
    missing = rows[3]  # tiny-no-layers: nothing predicted
    assert missing[col["predicted_step_time_s"]] == ("", "-")
    assert fsdp[col["n_gpus"]] == ("8.0", "8")
    # a run without a GPU count makes the column floats (pandas): the page still renders it
    gaps = frame.assign(n_gpus=[8, None, 8, 8, 8])
    assert [r[col["n_gpus"]] for r in _page_rows(render_html(gaps, summary))][:2] == [("8.0", "8"), ("", "-")]
    assert "data:image/png;base64," in page and "<script>" in page and "aria-sort" in page
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_fidelity_page_sorts_in_a_browser(small_csv: Path, tmp_path: Path) -> None:
    """Headless Chromium clicks "step error %" twice: ascending then descending, runs without an error
    last both times."""
    import re
    import subprocess

    from simtrain.validation.fidelity import render_html

    frame, summary = validate_runs(small_csv)
    probe = ("<script>addEventListener('load', () => { const th = [...document.querySelectorAll('th')].find("
             "h => h.textContent === 'step error %'); const ids = () => [...document.querySelectorAll('tbody tr')]"
             ".map(r => r.cells[0].textContent).join(','); th.click(); const up = ids(); th.click(); "
             "document.body.setAttribute('data-order', up + '|' + ids()); });</script></body>")
    page = tmp_path / "page.html"
    page.write_text(render_html(frame, summary).replace("</body>", probe))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom"]
    run = subprocess.run([str(shutil.which("chromium")), *flags, page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=False)
    found = re.search(r'data-order="([^"]*)"', run.stdout)
    assert found is not None, run.stderr[-2000:]
    up, down = (part.split(",") for part in found.group(1).split("|"))
    known = frame[frame["step_time_error_pct"].notna()]
    unknown = frame[frame["step_time_error_pct"].isna()]["run_id"].tolist()
    assert up == known.sort_values("step_time_error_pct")["run_id"].tolist() + unknown
    assert down == known.sort_values("step_time_error_pct", ascending=False)["run_id"].tolist() + unknown


def test_validate_progress_on_request_quiet_under_json(small_csv: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """validate_runs draws a bar with an ETA, one unit per row, only when asked; on a terminal the CLI
    shows it, under --json not."""
    validate_runs(small_csv, progress=True)
    err = capsys.readouterr().err
    assert "validating runs" in err and "5/5" in err and "ETA" in err

    class Tty:
        text = ""

        def isatty(self) -> bool:
            return True

        def write(self, s: str) -> int:
            Tty.text += s
            return len(s)

        def flush(self) -> None:
            pass

    monkeypatch.setattr("sys.stderr", Tty())
    assert main(["validate", str(small_csv), "--json", "--workers", "1"]) == 0
    assert Tty.text == ""
    assert main(["validate", str(small_csv), "--workers", "1"]) == 0
    assert "validating runs" in Tty.text
