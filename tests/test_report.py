"""Reports (simtrain.studies.report): plots present, self-contained HTML, rendered by headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from simtrain.cli.main import main
from simtrain.studies.report import render_html, render_markdown, write_report
from simtrain.studies.sweep import sweep, to_frame, write_table

BASE: dict[str, Any] = {
    "name": "report-test", "model": {"preset": "llama3-8b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"tp": 1, "dp": 8},
    "train": {"seq_len": 1024, "global_batch_seqs": 32}, "run": {"tokens": "1B"},
}
FIGURES = ("fig-mfu-tp-pp", "fig-step-breakdown", "fig-memory-stages", "fig-memory-timeline", "fig-time-vs-batch")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    grid = {"layout.tp": [1, 2, 4], "layout.pp": [1, 2], "layout.dp": ["auto"], "train.global_batch_seqs": [16, 32],
            "train.micro_batch_size": [1, 32]}
    return sweep(BASE, grid, workers=1)


def images(page: str) -> dict[str, bytes]:
    """Figure id -> decoded PNG of each inline image."""
    found = re.findall(r"<figure id='([^']+)'>.*?src='data:image/png;base64,([^']+)'", page, flags=re.S)
    return {fid: base64.b64decode(data) for fid, data in found}


def test_html_has_every_plot_inline(table: pd.DataFrame) -> None:
    page = render_html(table, "t")
    imgs = images(page)
    assert set(FIGURES) <= set(imgs)
    assert all(png.startswith(PNG) and len(png) > 5000 for png in imgs.values())
    # self-contained: no script, no external resource
    assert "<script" not in page and not re.search(r"(src|href)=['\"]?(https?:)?//", page)
    assert "Failed points" in page  # micro-batch 32 does not divide: listed with its error


def test_markdown_and_csv(table: pd.DataFrame, tmp_path: Path) -> None:
    md = render_markdown(table, "t")
    assert md.startswith("# t") and "| layout |" in md and "MFU %" in md
    written = write_report(table, md_path=tmp_path / "r.md", csv_path=tmp_path / "r.csv")
    assert [p.name for p in written] == ["r.md", "r.csv"]
    best = pd.read_csv(tmp_path / "r.csv")
    assert best["MFU %"].is_monotonic_decreasing and len(best) <= 20
    # each layout's likely measured step time (simtrain.studies.uncertainty), a range around its prediction
    assert (best["likely from s"] < best["likely to s"]).all() and "likely from s" in md


def test_study_heatmap() -> None:
    rows = [{"point": i, "model.name": m, "model.params": p, "n_gpus": g, "mfu": 0.3 + 0.01 * i, "fits": True,
             "error": None} for i, (m, p, g) in enumerate([("a", 1e9, 8), ("a", 1e9, 16), ("b", 8e9, 8), ("b", 8e9, 16)])]
    assert "fig-mfu-study" in images(render_html(to_frame(rows)))


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}"]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install -y chromium; "
                                                  ".ci/run installs it)")
def test_html_renders_in_headless_chromium(table: pd.DataFrame, tmp_path: Path) -> None:
    """Chromium loads the report offline and decodes every plot (natural width > 0)."""
    browser = chromium()
    assert browser is not None
    report = tmp_path / "report.html"
    write_report(table, html_path=report)
    # a copy with a probe that records, after load, how many images decoded (the report has no script)
    probe = ("<script>addEventListener('load', () => { const ok = [...document.images].filter("
             "i => i.complete && i.naturalWidth > 0).map(i => i.closest('figure').id); "
             "document.body.setAttribute('data-decoded', ok.join(',')); });</script></body>")
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", probe))
    run = headless(browser, tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    decoded = re.search(r'data-decoded="([^"]*)"', run.stdout)
    assert decoded is not None, run.stdout[-2000:]
    assert set(FIGURES) <= set(decoded.group(1).split(","))
    shot = tmp_path / "shot.png"
    run = headless(browser, tmp_path / "profile2", "--window-size=1000,2400", f"--screenshot={shot}",
                   report.as_uri())
    assert run.returncode == 0 and shot.read_bytes().startswith(PNG) and shot.stat().st_size > 20000


def test_cli_report(table: pd.DataFrame, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.parquet"
    write_table(table, path)
    assert main(["report", str(path), "--html", str(tmp_path / "r.html"), "--md", str(tmp_path / "r.md")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "r.html").stat().st_size > 10000
    assert main(["report", str(path)]) == 0
    assert "# simtrain report" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.parquet")]) == 2
    assert "not found" in capsys.readouterr().err


def test_whatif_table_plots_time_vs_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(BASE))
    out = tmp_path / "whatif.csv"
    assert main(["run", str(cfg), "--whatif-batches", "16Ki,32Ki,64Ki", "--noise-scale-tokens", "32Ki",
                 "--out", str(out)]) == 0
    assert "McCandlish" in capsys.readouterr().out
    from simtrain.studies.sweep import read_table

    assert "fig-time-vs-batch" in images(render_html(read_table(out)))


@pytest.mark.parametrize(("text", "words"), [
    ("", ["the file is empty"]),
    ("point,layout.tp,step_time_s,fits\n", ["header but no rows"]),
    ("a,b\n1,2\n", ["no result column", "step_time_s", "(it has a, b)"]),
])
def test_cli_report_refuses_tables_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                  words: list[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and all(w in err for w in words) and "Traceback" not in err


def test_label_names_every_axis() -> None:
    """A 64-GPU layout's label multiplies to 64 (it was "tp4 pp2 vpp8 dp4", cp dropped)."""
    from simtrain.studies.report import label

    row = {"layout.tp": 4, "layout.cp": 2, "layout.ep": 1, "layout.etp": None, "layout.pp": 2, "layout.vpp": 8,
           "layout.dp": 4, "layout.zero_stage": 1, "train.micro_batch_size": 1, "layout.recompute": "none",
           "layout.fsdp": "none", "layout.schedule": "auto"}
    assert label(row) == "tp4 cp2 pp2 vpp8 dp4 zero1 mbs1"
    moe = {**row, "layout.ep": 8.0, "layout.etp": 1.0, "layout.recompute": "full", "layout.recompute_layers": 3.0,
           "layout.schedule": "dualpipev", "layout.fsdp": "full"}  # floats: a CSV read back
    assert label(moe) == "tp4 cp2 ep8 etp1 pp2 vpp8 dp4 fsdp-full mbs1 full(3) dualpipev"


def test_search_table_counts_and_layouts_over_capacity(tmp_path: Path) -> None:
    """A search table read back: counts by what became of each layout (not "N do not fit" for every layout
    that was not simulated), and the layouts over HBM with how far over, the closest first."""
    from simtrain.studies.report import counts, not_fitting_table
    from simtrain.studies.search import SearchSpace, search
    from simtrain.studies.sweep import read_table

    cfg = {**BASE, "model": {"preset": "llama3-8b", "n_layers": 16}, "hardware": {"node": "dgx-h100", "n_nodes": 2},
           "layout": {"tp": 1, "dp": 16}, "train": {"seq_len": 8192, "global_batch_seqs": 64}, "run": None}
    r = search(cfg, space=SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch_size=(2,), zero_stage=(0,),
                                      recompute=("none",)), top_k=2, workers=1)
    path = tmp_path / "search.csv"
    write_table(r.to_frame(), path)
    df = read_table(path)
    c, want = counts(df), r.counts()
    assert (c["rows"], c["simulated"], c["fit"], c["pruned_memory"], c["estimated_only"]) == (
        want["enumerated"], want["simulated"], want["fit"], want["pruned_memory"], want["estimated_only"])
    md = render_markdown(df, "t")
    assert (f"{want['enumerated']} rows: {want['simulated']} simulated ({want['fit']} fit, 0 do not fit in memory), "
            f"0 failed; not simulated: {want['pruned_memory']} pruned for memory") in md
    over = not_fitting_table(df)
    cands = r.not_fitting()
    assert len(over) == len(cands) == want["pruned_memory"] > 0
    assert over["layout"].tolist() == [x.label() for x in cands]
    gap = cands[0].over_capacity_bytes(r.capacity_bytes) or 0.0
    assert over.iloc[0]["over GiB"] == round(gap / 1024**3, 1)
    assert over.iloc[0]["over %"] == round(100 * gap / r.capacity_bytes, 1)
    assert "## Closest layouts that do not fit" in md and "over %" in render_html(df, "t")
