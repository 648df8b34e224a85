"""Where hardware profiles live: the built-in ones in the package, and the user directory.

Two places hold profiles, each with the same layout (``gpus/<name>.yaml``, ``nodes/<name>.yaml``,
``calibrated/<name>/profile.yaml``):

- **built-in**: ``simtrain/data/hardware_profiles`` inside the installed package, read through
  ``importlib.resources`` (so they work from a wheel, an editable checkout or a zip); never written.
- **user**: ``$SIMTRAIN_PROFILES_DIR`` if set, else ``<platform user data dir>/simtrain/profiles``
  (``platformdirs.user_data_dir``: ``~/.local/share/simtrain/profiles`` on Linux). Your own GPU and
  node YAMLs go there, and ``simtrain calibrate --out NAME`` writes ``calibrated/NAME/`` there.

A name is looked up in both. There is no search order: a name found in both places is refused as
ambiguous (a user file silently replacing a built-in's numbers would change every prediction that
names it), with both files named; rename the user file, or give it by path. A profile can always be
given by path instead of a name (``hardware.gpu: ./my-gpu.yaml``, ``hardware.profile: ./prof/``).
"""

from __future__ import annotations

import enum
import functools
import importlib.resources
import os
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

import platformdirs

from simtrain.spec.errors import ConfigError, problem

ENV_VAR = "SIMTRAIN_PROFILES_DIR"
APP_NAME = "simtrain"
PROFILE_FILE = "profile.yaml"  # a calibrated profile's file inside its folder
YAML_SUFFIXES = (".yaml", ".yml")


class ProfileKind(enum.StrEnum):
    """The three kinds of profile, each a sub-folder of a profile root."""

    GPUS = "gpus"
    NODES = "nodes"
    CALIBRATED = "calibrated"


def builtin_root() -> Traversable:
    """The package's own profiles (``simtrain/data/hardware_profiles``), as an importlib.resources Traversable."""
    return importlib.resources.files("simtrain") / "data" / "hardware_profiles"


def user_root() -> Path:
    """The user profile directory: ``$SIMTRAIN_PROFILES_DIR``, else the platform's user data dir + ``profiles``.

    It may not exist yet (nothing is created until ``simtrain calibrate`` writes a profile).
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "profiles"


@dataclass(frozen=True, slots=True)
class ProfileRef:
    """One profile file: a built-in (``rel``: its path inside the package's profiles, "/"-separated) or a
    file on disk (``rel``: its path). Hashable, so loaders cache on it."""

    rel: str
    builtin: bool

    @property
    def name(self) -> str:
        """The profile's name: the file's stem, or a calibrated profile's folder name."""
        parts = self.rel.replace(os.sep, "/").split("/")
        return parts[-2] if parts[-1] == PROFILE_FILE and len(parts) > 1 else parts[-1].rsplit(".", 1)[0]

    def file(self) -> Traversable:
        """The file, as a Traversable (a ``Path`` for files on disk and for unzipped packages)."""
        if not self.builtin:
            return Path(self.rel)
        node = builtin_root()
        for part in self.rel.split("/"):
            node = node / part
        return node

    def path(self) -> Path | None:
        """The file as a filesystem path, or None when the package is not on disk (a zip)."""
        f = self.file()
        return f if isinstance(f, Path) else None

    def read_text(self) -> str:
        """The file's text (UTF-8); OSError if it cannot be read."""
        return self.file().read_text(encoding="utf-8")

    def __str__(self) -> str:
        return str(self.file())


def is_path_like(name: str) -> bool:
    """Whether a profile name is a path rather than a name (a YAML suffix or a directory separator)."""
    return name.endswith(YAML_SUFFIXES) or "/" in name or os.sep in name or name.startswith("~")


def _same_file(a: ProfileRef, b: ProfileRef) -> bool:
    pa, pb = a.path(), b.path()
    try:
        return pa is not None and pb is not None and os.path.samefile(pa, pb)
    except OSError:
        return False


@functools.cache
def _builtin_entries(kind: ProfileKind) -> tuple[ProfileRef, ...]:
    """The package's profiles of ``kind`` (read once: installed package data does not change)."""
    pkg = builtin_root() / kind.value
    if not pkg.is_dir():
        return ()
    refs = (_ref_in(kind, f.name, f.is_dir(), builtin=True) for f in pkg.iterdir())
    return tuple(sorted((r for r in refs if r is not None and r.file().is_file()), key=lambda r: r.rel))


def entries(kind: ProfileKind) -> dict[str, list[ProfileRef]]:
    """Every profile of ``kind`` by name: the built-in file first, then the user's (two: ambiguous).

    A user directory that is the package's own folder (``$SIMTRAIN_PROFILES_DIR`` pointing at it)
    counts once.
    """
    out: dict[str, list[ProfileRef]] = {}
    for ref in _builtin_entries(kind):
        out[ref.name] = [ref]
    user = user_root() / kind.value
    if user.is_dir():
        for p in sorted(user.iterdir()):
            uref = _ref_in(kind, str(p), p.is_dir(), builtin=False)
            if uref is None or not Path(uref.rel).is_file():
                continue
            known = out.setdefault(uref.name, [])
            if not any(_same_file(uref, k) for k in known):
                known.append(uref)
    return out


def _ref_in(kind: ProfileKind, entry: str, is_dir: bool, builtin: bool) -> ProfileRef | None:
    """The profile file an entry of a kind folder holds (None: not a profile)."""
    base = f"{kind.value}/{entry}" if builtin else entry
    if kind is ProfileKind.CALIBRATED:
        return ProfileRef(f"{base}/{PROFILE_FILE}" if builtin else str(Path(base) / PROFILE_FILE), builtin) \
            if is_dir else None
    return ProfileRef(base, builtin) if entry.endswith(".yaml") and not is_dir else None


def names(kind: ProfileKind) -> list[str]:
    """Names of the profiles of ``kind`` present, built-in and user, sorted."""
    return sorted(entries(kind))


def resolve(kind: ProfileKind, name: str, path: str, aliases: dict[str, str] | None = None,
            hint: str = "") -> ProfileRef:
    """The file of profile ``name`` (or of the path ``name``); ``path`` is the config field it came from,
    ``hint`` ends the message of a name or file not found.

    Raises:
        ConfigError: no such file; unknown name (listing the valid ones and where they were looked
            for); a name both built-in and in the user directory.
    """
    name = str(name)
    if is_path_like(name) or (kind is ProfileKind.CALIBRATED and Path(name, PROFILE_FILE).is_file()):
        p = Path(name).expanduser()
        if kind is ProfileKind.CALIBRATED and not p.name.endswith(YAML_SUFFIXES):
            p = p / PROFILE_FILE
        if not p.is_file():
            raise ConfigError(problem(path, name, f"no such file ({p}); give a {_what(kind)} name "
                                                  f"({', '.join(names(kind)) or 'none found'}) or an existing file{hint}"))
        return ProfileRef(str(p), builtin=False)
    found = entries(kind)
    key = str(name).strip()
    if kind is not ProfileKind.CALIBRATED:
        key = key.lower().replace("_", "-")
        key = key if key in found else (aliases or {}).get(key, key)
    refs = found.get(key)
    if not refs:
        raise ConfigError(problem(path, name, f"valid {_what(kind)}s: {', '.join(sorted(found)) or '(none)'} "
                                              f"(built-in, and in {user_root() / kind.value}); or a path to a file{hint}"))
    if len(refs) > 1:
        raise ConfigError(problem(path, name, f"ambiguous: both the built-in {refs[0]} and the user profile "
                                              f"{refs[1]} have this name; rename the user file, or give it by path"))
    return refs[0]


def _what(kind: ProfileKind) -> str:
    return {ProfileKind.GPUS: "GPU", ProfileKind.NODES: "node", ProfileKind.CALIBRATED: "calibrated profile"}[kind]


def output_folder(name_or_path: str) -> Path:
    """Where ``simtrain calibrate --out NAME_OR_PATH`` writes: ``<user dir>/calibrated/NAME``, or the folder given.

    Raises:
        ConfigError: NAME is a built-in profile's (the new one would be ambiguous with it).
    """
    if is_path_like(name_or_path) or Path(name_or_path).is_absolute():
        p = Path(name_or_path).expanduser()
        return p.parent if p.name.endswith(YAML_SUFFIXES) else p
    builtin = [r for r in entries(ProfileKind.CALIBRATED).get(name_or_path, []) if r.builtin]
    if builtin:
        raise ConfigError(problem("--out", name_or_path, f"a built-in calibrated profile has this name ({builtin[0]}); "
                                                         "choose another name or give a folder path"))
    return user_root() / ProfileKind.CALIBRATED.value / name_or_path
