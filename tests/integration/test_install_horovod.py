"""scripts/install_horovod.sh (logic in scripts/horovod_wheel.py): it installs the prebuilt Horovod wheel only
where it fits and its sha256 matches the wheels README, and otherwise says why. The real install is what CI runs
(scripts/setup.sh); these tests stay on the paths that must not install anything."""
import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.support.jobs import ROOT

SCRIPT = ROOT / "scripts" / "install_horovod.sh"


def wheel_module():
    spec = importlib.util.spec_from_file_location("horovod_wheel", ROOT / "scripts" / "horovod_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(wheels: Path, *args):
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PETASTORM_BALANCED_WHEELS": str(wheels)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def fake_wheel(folder: Path, readme_sha: str) -> Path:
    module = wheel_module()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / module.WHEEL
    wheel.write_bytes(b"not a wheel")
    (folder / "README.md").write_text(f"# wheels\n\n## {module.WHEEL}\nabout it\n\nsha256: {readme_sha}\n")
    return wheel


def test_absent_wheel_is_a_skip_that_names_the_folder(tmp_path):
    done = run_script(tmp_path / "nowhere")
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stdout and str(tmp_path / "nowhere") in done.stdout
    assert "docs/distributed.md" in done.stdout


def test_readme_sha_is_read_for_the_named_wheel(tmp_path):
    module = wheel_module()
    wheel = fake_wheel(tmp_path, "ab" * 32)
    assert module.expected_sha256(wheel) == "ab" * 32
    (tmp_path / "README.md").write_text("## another.whl\nsha256: " + "cd" * 32 + "\n")
    assert module.expected_sha256(wheel) is None  # a sha under another heading does not vouch for this wheel


def test_wheel_with_another_sha_is_refused(tmp_path):
    """A wheel that fits the stack but not its README's sha256 is never installed (exit 1, both sums named);
    where the stack does not fit, the script skips before looking at the file and says why."""
    wheel = fake_wheel(tmp_path, "0" * 64)
    done = run_script(tmp_path)
    reason = wheel_module().stack_mismatch()
    if reason:
        assert done.returncode == 0 and "does not fit this stack" in done.stdout, done.stdout + done.stderr
        return
    if sys.prefix == sys.base_prefix:
        assert "not in a virtual environment" in done.stdout
        return
    assert done.returncode == 1, done.stdout + done.stderr
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() in done.stderr and "0" * 64 in done.stderr
    assert "not installing" in done.stderr


def test_status_says_whether_the_wheel_fits(tmp_path):
    fake_wheel(tmp_path, "0" * 64)
    done = run_script(tmp_path, "--status")
    assert done.returncode == 0
    reason = wheel_module().stack_mismatch()
    assert (f"does not fit this stack: {reason}" if reason else "fits this stack") in done.stdout
