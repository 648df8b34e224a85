"""simtrain compare: two configs side by side (simtrain.studies.compare), its CLI, Markdown and HTML (rendered by
headless Chromium when it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from simtrain.cli.main import main
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.studies.compare import (
    ABSENT,
    compare,
    config_diff,
    flatten,
    render_html,
    render_markdown,
    render_text,
)
from simtrain.studies.simulate import simulate

BASE: dict[str, Any] = {
    "name": "compare-test", "model": {"preset": "llama3-8b", "n_layers": 4},
    "hardware": {"node": "dgx-h100", "n_nodes": 1}, "layout": {"tp": 2, "pp": 2, "dp": 2},
    "train": {"seq_len": 1024, "global_batch_seqs": 16},
}
PP4 = ["layout.pp=4", "layout.dp=1"]
BREAKDOWN = ("compute", "exposed TP comm", "exposed CP comm", "exposed EP comm", "exposed DP comm",
             "exposed PP comm", "pipeline bubble", "stage imbalance", "optimizer", "CPU offload waits", "other")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pp2_vs_pp4():  # type: ignore[no-untyped-def]
    return compare(BASE, None, [], PP4)


def row(c: Any, metric: str) -> Any:
    return next(r for r in c.rows if r.metric == metric)


def test_rows_are_the_two_simulations(pp2_vs_pp4: Any) -> None:
    """Each side is exactly what simulate gives for it; B-A and B/A follow."""
    c = pp2_vs_pp4
    a, b = simulate(BASE), simulate(BASE, PP4)
    assert row(c, "step time").a == a.step_time_s and row(c, "step time").b == b.step_time_s
    assert row(c, "MFU").b == pytest.approx(100 * b.mfu) and row(c, "HFU").a == pytest.approx(100 * a.hfu)
    st = row(c, "step time")
    assert st.delta == pytest.approx(b.step_time_s - a.step_time_s) and st.ratio == pytest.approx(
        b.step_time_s / a.step_time_s)
    # same tokens and GPUs: throughput and MFU move by the inverse of the step time
    for metric in ("throughput", "throughput per GPU", "MFU"):
        assert row(c, metric).ratio == pytest.approx(1 / st.ratio, rel=1e-12)
    assert row(c, "throughput").a == pytest.approx(a.global_batch_tokens / a.step_time_s)
    assert a.error_band is not None and row(c, "likely step time to").a == a.error_band.high_s
    # the breakdown rows are every component: they add up to each side's step time
    for side, res in (("a", a), ("b", b)):
        assert sum(getattr(row(c, m), side) for m in BREAKDOWN) == pytest.approx(res.step_time_s, rel=1e-9)
    # memory per stage: A has 2 stages, B 4; A has no stages 2 and 3
    assert [row(c, f"stage {s} peak memory").a is None for s in range(4)] == [False, False, True, True]
    assert row(c, "stage 3 peak memory").b == pytest.approx(b.memory[3].peak_bytes / 1024**3)
    assert row(c, "stage 3 fits").b is b.memory[3].fits and row(c, "stage 2 fits").a is None
    assert row(c, "peak memory (highest stage)").a == pytest.approx(max(m.peak_bytes for m in a.memory) / 1024**3)
    # the diff: exactly the two fields set
    assert [(d.path, d.a, d.b) for d in c.diff] == [("layout.dp", 2, 1), ("layout.pp", 2, 4)]


def test_frame_columns(pp2_vs_pp4: Any) -> None:
    df = pp2_vs_pp4.frame()
    assert list(df.columns) == ["metric", "unit", "A", "B", "B-A", "B/A"]
    st = df[df["metric"] == "step time"].iloc[0]
    assert st["B-A"] == pytest.approx(st["B"] - st["A"]) and st["B/A"] == pytest.approx(st["B"] / st["A"])
    assert set(BREAKDOWN) <= set(df["metric"])


def test_identical_configs_compare_equal() -> None:
    """A file against itself with a no-op override: no field differs, every delta is 0, every ratio 1."""
    c = compare(BASE, None, ["layout.tp=2"], [])
    assert c.diff == []
    nums = [r for r in c.rows if r.delta is not None]
    assert nums and all(r.delta == 0 and r.verdict == "" for r in nums)
    assert all(r.ratio == 1 for r in nums if r.a)
    assert "the configs are identical" in render_text(c)


def test_diff_expands_presets() -> None:
    """The diff is taken after validation: a preset name becomes the model's fields."""
    a = load_config(BASE)
    b = load_config({**BASE, "model": {"preset": "llama3-70b", "n_layers": 4}, "layout": {"tp": 8, "pp": 1, "dp": 1}})
    diff = {d.path: (d.a, d.b) for d in config_diff(a, b)}
    assert diff["model.name"] == ("llama3-8b", "llama3-70b")
    assert diff["model.hidden"] == (4096, 8192) and diff["model.ffn_hidden"] == (14336, 28672)
    assert "model.n_layers" not in diff and "train.seq_len" not in diff
    # a nested section one side lacks: its fields are ABSENT on that side
    assert flatten({"moe": None}) == {"moe": None} and flatten({"a": {"b": 1, "c": {"d": [1]}}}) == {
        "a.b": 1, "a.c.d": [1]}
    moe = load_config({**BASE, "model": {"preset": "mixtral-8x7b", "n_layers": 4}, "layout": {"tp": 1, "pp": 2,
                                                                                             "dp": 4, "ep": 4}})
    d = {x.path: (x.a, x.b) for x in config_diff(a, moe)}
    assert d["model.moe"][0] is None and d["model.moe"][1] == ABSENT
    assert d["model.moe.n_experts"] == (ABSENT, 8)


def test_errors_name_the_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        compare(BASE, None, ["layout.tp=3"], ["layout.pp=5"])
    paths = [p.path for p in exc.value.problems]
    assert any(p.startswith("A: layout.tp") for p in paths) and any(p.startswith("B: layout") for p in paths)
    with pytest.raises(ConfigError, match="mode: 'fast' is not valid"):
        compare(BASE, None, [], ["layout.pp=4"], mode="fast")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    assert main(["compare", str(cfg)]) == 2  # one file and no override sets: nothing to compare
    assert "B: missing" in capsys.readouterr().err
    assert main(["compare", str(cfg), "--set-b", "layout.tp=3"]) == 2
    err = capsys.readouterr().err
    assert "B: layout.tp: 3" in err and "Traceback" not in err
    assert main(["compare", str(cfg), str(tmp_path / "missing.yaml")]) == 2


def test_cli_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(BASE))
    b.write_text(yaml.safe_dump({**BASE, "layout": {"tp": 2, "pp": 4, "dp": 1}}))
    md, page = tmp_path / "out" / "c.md", tmp_path / "out" / "c.html"
    assert main(["compare", str(a), str(b), "--markdown", str(md), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "layout.pp: 2 -> 4" in out and f"wrote {md}" in out
    text = md.read_text()
    assert text.startswith("# simtrain compare") and "| metric | unit | A | B | B-A | B/A |" in text
    assert "| `layout.pp` | 2 | 4 |" in text
    html = page.read_text()
    assert "<script" not in html and not re.search(r"(src|href)=['\"]?(https?:)?//", html)
    assert html.count("<tr>") >= len(BREAKDOWN) + 8
    # the one-file form gives the same numbers as the two files
    assert main(["compare", str(a), "--set-b", "layout.pp=4", "--set-b", "layout.dp=1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    twofile = compare(a, b)
    assert [r["b"] for r in data["rows"]] == [r.b for r in twofile.rows]
    assert data["diff"] == [{"path": "layout.dp", "a": 2, "b": 1}, {"path": "layout.pp", "a": 2, "b": 4}]
    assert data["result_b"]["step_time_s"] == twofile.result_b.step_time_s
    st = next(r for r in data["rows"] if r["metric"] == "step time")
    assert st["verdict"] in ("better", "worse") and st["b_over_a"] == pytest.approx(st["b"] / st["a"])
    # --set applies to both sides
    assert main(["compare", str(a), str(b), "--set", "train.global_batch_seqs=32", "--json"]) == 0
    rows = {r["metric"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["tokens per step"]["a"] == rows["tokens per step"]["b"] == 32 * 1024


def test_markdown_escapes_and_lists_diff(pp2_vs_pp4: Any) -> None:
    md = render_markdown(pp2_vs_pp4, "t")
    assert md.startswith("# t\n") and "## What differs (2 fields)" in md
    assert len(re.findall(r"\n\| stage \d", md)) == 8  # 4 stages: peak memory and fits
    named = render_markdown(compare(BASE, None, [], ["name=x|y"]))
    assert "| `name` | compare-test | x\\|y |" in named  # a pipe in a value does not split the cell


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}"]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install -y chromium; "
                                                  ".ci/run installs it)")
def test_html_renders_in_headless_chromium(pp2_vs_pp4: Any, tmp_path: Path) -> None:
    """Chromium lays the page out offline: every metric row, and the breakdown bars' lengths in the
    ratio of the step times; its screenshot is not blank."""
    browser = chromium()
    assert browser is not None
    c = pp2_vs_pp4
    page = tmp_path / "compare.html"
    page.write_text(render_html(c))
    probe = ("<script>addEventListener('load', () => { const b = document.body;"
             "b.setAttribute('data-rows', document.querySelectorAll('#metrics tbody tr:not(.sec)').length);"
             "b.setAttribute('data-bars', [...document.querySelectorAll('.bar')].map("
             "x => x.getBoundingClientRect().width).join(',')); });</script></body>")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", probe))
    run = headless(browser, tmp_path / "p1", "--window-size=1100,1600", "--virtual-time-budget=5000", "--dump-dom",
                   probed.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    rows = re.search(r'data-rows="(\d+)"', run.stdout)
    bars = re.search(r'data-bars="([^"]*)"', run.stdout)
    assert rows is not None and bars is not None, run.stdout[-2000:]
    assert int(rows.group(1)) == len(c.rows)
    wa, wb = (float(x) for x in bars.group(1).split(","))
    assert wb / wa == pytest.approx(c.result_b.step_time_s / c.result_a.step_time_s, rel=0.02)
    shot = tmp_path / "shot.png"
    run = headless(browser, tmp_path / "p2", "--window-size=1100,1600", f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0 and shot.read_bytes().startswith(PNG)
    image = pytest.importorskip("PIL.Image")
    with image.open(shot) as img:
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 16)
    # non-blank: many colours (text, table shading, the bars' tab10 colours), white not everything
    assert colours is None or len(colours) > 50
    white = next((n for n, c in (colours or []) if c == (255, 255, 255)), 0)
    assert white < 0.97 * rgb.width * rgb.height
    assert any(c == (31, 119, 180) for _, c in (colours or [(0, (31, 119, 180))]))  # the compute segment
