"""The prebuilt Horovod wheel in ``../shared/wheels``: find it, say whether it fits this stack, install it.

Horovod 0.28.1 ships only as source and takes minutes to over an hour to build here, so CI installs a wheel built
once for this stack (see ``../shared/wheels/README.md`` and docs/distributed.md). The wheel links against torch
2.13.0's C++ ABI and CPython 3.11, so it is installed only where both match, with ``--no-deps`` (pip must never
bring or change torch), after its sha256 matches the one in the wheels README.

``python scripts/horovod_wheel.py`` installs (``scripts/install_horovod.sh`` calls it); ``--status`` only prints
why it would skip. The tests import ``skip_reason()`` so that a skipped Horovod test says why.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOROVOD_VERSION = "0.28.1"
WHEEL = f"horovod-{HOROVOD_VERSION}-cp311-cp311-linux_x86_64.whl"
PYTHON = (3, 11)
TORCH = "2.13.0"  # the torch the wheel was compiled against (any local variant: +cpu, +cu...)
# What Horovod imports at run time (its wheel metadata), pinned; installed only when missing, never upgraded.
RUNTIME = {"cloudpickle": "cloudpickle==3.1.2", "psutil": "psutil==7.2.2", "yaml": "PyYAML==6.0.4",
           "packaging": "packaging==26.4", "cffi": "cffi==2.1.1"}
WHEELS_ENV = "PETASTORM_BALANCED_WHEELS"  # a folder to use instead of ../shared/wheels


def wheel_dirs() -> list:
    if os.environ.get(WHEELS_ENV):
        return [Path(os.environ[WHEELS_ENV])]
    return [ROOT.parent / "shared" / "wheels", ROOT / "shared" / "wheels"]


def find_wheel() -> Path | None:
    for folder in wheel_dirs():
        if (folder / WHEEL).is_file():
            return folder / WHEEL
    return None


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def stack_mismatch() -> str | None:
    """Why this interpreter cannot use the wheel, or None."""
    problems = []
    if sys.version_info[:2] != PYTHON:
        problems.append(f"Python {sys.version_info[0]}.{sys.version_info[1]} (wheel: {PYTHON[0]}.{PYTHON[1]})")
    if (sys.platform, platform.machine()) != ("linux", "x86_64"):
        problems.append(f"{sys.platform}/{platform.machine()} (wheel: linux/x86_64)")
    torch = installed_version("torch")
    if torch is None:
        problems.append(f"torch not installed (wheel: torch {TORCH})")
    elif torch.split("+")[0] != TORCH:
        problems.append(f"torch {torch} (wheel: torch {TORCH}; rebuild with the recipe in docs/distributed.md)")
    return "; ".join(problems) or None


def expected_sha256(wheel: Path) -> str | None:
    """The sha256 the wheels README gives for ``wheel`` (the line after its heading), or None."""
    readme = wheel.parent / "README.md"
    if not readme.is_file():
        return None
    section = readme.read_text().split(f"## {wheel.name}", 1)
    found = re.search(r"^sha256:\s*([0-9a-f]{64})\s*$", section[1], re.M) if len(section) == 2 else None
    return found.group(1) if found else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def skip_reason() -> str | None:
    """Why a Horovod test cannot run here (None: the wheel fits this stack, so Horovod should be installed)."""
    wheel = find_wheel()
    if wheel is None:
        where = " or ".join(str(d) for d in wheel_dirs())
        return (f"the Horovod wheel {WHEEL} is not in {where} (CI has it in ../shared/wheels; to build one see "
                "docs/distributed.md)")
    mismatch = stack_mismatch()
    if mismatch:
        return f"the Horovod wheel {wheel} does not fit this stack: {mismatch}"
    return None


def in_venv() -> bool:
    return sys.prefix != sys.base_prefix


def stamp_path(digest: str) -> Path:
    return Path(sys.prefix) / f".horovod-{digest[:16]}"


def install() -> int:
    """Install the wheel into this interpreter's venv; 0 when installed or skipped (with the reason printed)."""
    reason = skip_reason()
    if reason:
        print(f"install_horovod: skipped: {reason}")
        return 0
    if not in_venv():
        print(f"install_horovod: skipped: {sys.executable} is not in a virtual environment (activate .venv)")
        return 0
    wheel = find_wheel()
    want = expected_sha256(wheel)
    if want is None:
        print(f"install_horovod: {wheel.parent / 'README.md'} gives no sha256 for {wheel.name}; not installing an "
              "unverified wheel", file=sys.stderr)
        return 1
    stamp = stamp_path(want)
    if stamp.is_file() and installed_version("horovod") == HOROVOD_VERSION:
        print(f"install_horovod: Horovod {HOROVOD_VERSION} already installed from {wheel.name}")
        return 0
    got = sha256(wheel)
    if got != want:
        print(f"install_horovod: {wheel} has sha256 {got}, its README says {want}; not installing it",
              file=sys.stderr)
        return 1
    missing = [pin for module, pin in RUNTIME.items() if not module_installed(module)]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", str(wheel), *missing]
    print(f"install_horovod: {' '.join(cmd[3:])}")
    done = subprocess.run(cmd)
    if done.returncode != 0:
        print(f"install_horovod: pip failed ({done.returncode})", file=sys.stderr)
        return 1
    check = subprocess.run([sys.executable, "-c", "import horovod.torch as hvd; hvd.init(); hvd.shutdown()"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        print(f"install_horovod: installed, but `import horovod.torch` fails:\n{check.stderr[-2000:]}",
              file=sys.stderr)
        return 1
    for old in Path(sys.prefix).glob(".horovod-*"):
        old.unlink()
    stamp.touch()
    print(f"install_horovod: Horovod {HOROVOD_VERSION} installed from {wheel} (torch untouched: "
          f"{installed_version('torch')})")
    return 0


def module_installed(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def main(argv) -> int:
    if argv[1:] == ["--status"]:
        reason = skip_reason()
        print(reason or f"{find_wheel()} fits this stack; Horovod installed: {installed_version('horovod')}")
        return 0
    if argv[1:]:
        print(f"usage: {argv[0]} [--status]", file=sys.stderr)
        return 2
    return install()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
