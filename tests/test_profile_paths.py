"""Where profiles live (issue 30): built-in package data read through importlib.resources, the user
directory ($SIMTRAIN_PROFILES_DIR or the platform's user data dir), profiles by path, ambiguous names
refused, and a built wheel that carries every profile and works as a zip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import platformdirs
import pytest

import simtrain
from simtrain.cli.main import main
from simtrain.hardware import load as hwl
from simtrain.hardware.profile import list_profiles, load_profile, profile_folder
from simtrain.hardware.profile_paths import ENV_VAR, ProfileKind, builtin_root, entries, user_root
from simtrain.spec.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
#: The built-in profiles of the simtrain these tests import: the checkout's (editable install) or the installed
#: package's (``pip install ".[test]"``, the README's quick start)
PACKAGE_PROFILES = Path(simtrain.__file__).parent / "data" / "hardware_profiles"
#: The checkout's own, which the wheel test builds from
SOURCE_PROFILES = REPO / "simtrain" / "data" / "hardware_profiles"
EXAMPLE = REPO / "examples" / "llama3_8b_h100_fsdp.yaml"


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "profiles"
    root.mkdir()
    monkeypatch.setenv(ENV_VAR, str(root))
    return root


def _copy_gpu(root: Path, name: str, edit: tuple[str, str] | None = None) -> Path:
    text = (builtin_root() / "gpus" / "h100-sxm.yaml").read_text(encoding="utf-8")
    if edit:
        assert edit[0] in text
        text = text.replace(*edit)
    (root / "gpus").mkdir(parents=True, exist_ok=True)
    path = root / "gpus" / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_builtin_profiles_are_package_data(user_dir: Path) -> None:
    """Every profile file of the package folder is what importlib.resources lists, none outside it."""
    root = builtin_root()
    for kind in ("gpus", "nodes"):
        on_disk = sorted(p.stem for p in (PACKAGE_PROFILES / kind).glob("*.yaml"))
        found = entries(ProfileKind(kind))
        assert sorted(found) == on_disk
        assert all(len(refs) == 1 and refs[0].builtin for refs in found.values())
    assert (root / "calibrated" / "example-cpu" / "profile.yaml").is_file()
    assert not (REPO / "hardware_profiles").exists()


def test_user_dir_defaults_to_the_platform_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert user_root() == Path(platformdirs.user_data_dir("simtrain", appauthor=False)) / "profiles"
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert user_root() == tmp_path


def test_user_gpu_by_name_and_by_path(user_dir: Path, tmp_path: Path) -> None:
    _copy_gpu(user_dir, "my-h100", ("gemm_efficiency: 0.762", "gemm_efficiency: 0.5"))
    assert "my-h100" in hwl.list_gpus() and "h100-sxm" in hwl.list_gpus()
    mine = hwl.load_gpu("my-h100")
    assert (mine.name, mine.gemm_efficiency) == ("my-h100", 0.5)
    elsewhere = _copy_gpu(tmp_path / "elsewhere", "h100-sxm", ("gemm_efficiency: 0.762", "gemm_efficiency: 0.6"))
    assert hwl.load_gpu(str(elsewhere)).gemm_efficiency == 0.6  # a path: the built-in name is no conflict
    assert hwl.load_node("dgx-h100", gpu="my-h100").gpu.gemm_efficiency == 0.5
    with pytest.raises(ConfigError, match=r"hardware.gpu: '/nowhere/x.yaml' is not valid; no such file"):
        hwl.load_gpu("/nowhere/x.yaml")


def test_user_node_by_path_simulates_end_to_end(user_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A user node YAML given by path reaches the simulator through the CLI; its GPU is a user GPU."""
    _copy_gpu(user_dir, "slow-h100", ("bf16_tflops: 989.0", "bf16_tflops: 494.5"))
    node = (builtin_root() / "nodes" / "dgx-h100.yaml").read_text(encoding="utf-8")
    assert "gpu: h100-sxm" in node
    node_file = tmp_path / "my-node.yaml"
    node_file.write_text(node.replace("gpu: h100-sxm", "gpu: slow-h100"), encoding="utf-8")
    assert hwl.load_node(str(node_file)).gpu.bf16_flops_per_s == pytest.approx(494.5e12)
    args = ["simulate", str(EXAMPLE), "--set", "model={preset: llama3-8b, n_layers: 2}", "--json"]
    assert main([*args, "--set", f"hardware.node={node_file}"]) == 0
    slow = capsys.readouterr().out
    assert main(args) == 0
    fast = capsys.readouterr().out
    assert '"step_time_s"' in slow and slow != fast


def test_a_user_file_shadowing_a_builtin_is_refused(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user_file = _copy_gpu(user_dir, "h100-sxm")
    with pytest.raises(ConfigError) as ei:
        hwl.load_gpu("h100-sxm")
    msg = str(ei.value)
    assert "hardware.gpu: 'h100-sxm'" in msg and "ambiguous" in msg
    assert str(user_file) in msg and str(PACKAGE_PROFILES / "gpus" / "h100-sxm.yaml") in msg
    assert hwl.load_gpu("a100-80gb").name == "a100-80gb"  # other names are unaffected
    assert main(["simulate", str(EXAMPLE), "--set", "model={preset: llama3-8b, n_layers: 2}"]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and "Traceback" not in err


def test_the_package_folder_as_user_dir_is_not_ambiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(PACKAGE_PROFILES))
    assert hwl.load_gpu("h100-sxm").name == "h100-sxm"
    assert load_profile("example-cpu").name == "example-cpu"


def test_calibrated_profiles_go_to_the_user_dir(user_dir: Path) -> None:
    assert list_profiles() == ["example-cpu"]
    assert profile_folder("mine") == user_dir / "calibrated" / "mine"
    assert profile_folder("./here/mine") == Path("./here/mine")
    with pytest.raises(ConfigError, match=r"--out: 'example-cpu' is not valid; a built-in calibrated profile"):
        profile_folder("example-cpu")
    shutil.copytree(PACKAGE_PROFILES / "calibrated" / "example-cpu", user_dir / "calibrated" / "mine")
    assert list_profiles() == ["example-cpu", "mine"]
    assert load_profile("mine").file == str(user_dir / "calibrated" / "mine" / "profile.yaml")
    shutil.copytree(PACKAGE_PROFILES / "calibrated" / "example-cpu", user_dir / "calibrated" / "example-cpu")
    with pytest.raises(ConfigError, match="hardware.profile: 'example-cpu' is not valid; ambiguous"):
        load_profile("example-cpu")


def test_wheel_carries_the_profiles_and_runs_from_a_zip(tmp_path: Path) -> None:
    """Build the wheel (from a copy of the sources: nothing is written into the checkout), check that
    it holds every profile file, then import simtrain from the wheel file itself (a zip) in a fresh
    interpreter outside the checkout and load profiles and simulate there."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in ("simtrain", "calibration"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("simtrain-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"simtrain/data/hardware_profiles/{p.relative_to(SOURCE_PROFILES).as_posix()}"
                for p in SOURCE_PROFILES.rglob("*") if p.is_file()}
    assert expected and expected <= names
    assert "calibration/cli.py" in names and "simtrain/py.typed" in names
    probe = ("import simtrain, simtrain.hardware.load as hwl\n"
             "from simtrain.hardware.profile import load_profile\n"
             "from simtrain.hardware.profile_paths import builtin_root\n"
             "assert '.whl' in simtrain.__file__, simtrain.__file__\n"
             "assert type(builtin_root()).__name__ == 'Path' and 'zipfile' in type(builtin_root()).__module__\n"
             "print(len(hwl.list_gpus()), len(hwl.list_nodes()), load_profile('example-cpu').name)\n"
             f"from simtrain.cli.main import main\nraise SystemExit(main(['simulate', {str(EXAMPLE)!r}, "
             "'--set', 'model={preset: llama3-8b, n_layers: 2}', '--json']))\n")
    env = {**os.environ, "PYTHONPATH": str(wheel), ENV_VAR: str(tmp_path / "empty")}
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    first = run.stdout.splitlines()[0].split()
    assert first == [str(len(list((SOURCE_PROFILES / "gpus").glob("*.yaml")))),
                     str(len(list((SOURCE_PROFILES / "nodes").glob("*.yaml")))), "example-cpu"]
    assert '"step_time_s"' in run.stdout
