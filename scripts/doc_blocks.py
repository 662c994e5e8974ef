#!/usr/bin/env python3
"""Run every code block of README.md and docs/*.md as a user would, so that a stale example fails CI.

    python scripts/doc_blocks.py [--list] [--bin VENV/bin] [--only FILE:LINE] [FILE.md ...]

Fence syntax (the one every doc follows):
  ```python / ```bash / ```sh / ```console   run, in order, one process per block, from a scratch folder per file
  ```python norun: REASON                    not run; the reason is required (``norun`` alone is an error)
  ```python needs: MODULE [MODULE ...]       run where every MODULE imports in the venv, else reported as skipped
                                             (TensorFlow and JAX examples: the modern stack runs them)
  ```text, ```json, a bare ``` ...           never run (program output, file contents)
With ``--require-needs`` such a block fails instead (the framework venv of scripts/user_tier.sh).
A ``console`` block runs its ``$ `` lines only. Blocks of one file share that file's scratch folder (a plan
written by one block is read by the next) but no Python state; files run side by side (``--jobs``). Before a
file's first block the folder holds a small generated dataset at ``data/reviews``, ``reviews`` and
``datasets/clicks`` (what the docs' examples name), and cluster URLs are mapped to it: ``hdfs://host/p`` and
``s3://bucket/p`` become ``file://<folder>/p``, ``/tmp/p`` becomes ``<folder>/tmp/p``, ``--master yarn`` becomes
``--master local[2]``. Python blocks start with the names a training loop example assumes (``epochs = 1``,
``rank``/``world_size`` 0/1, a no-op ``train_step``), and RANK=0/WORLD_SIZE=1 are set, as for a single-process
run. ``pip install petastorm-balanced[X]`` installs the wheel under test (``--wheel``). Commands come from
``--bin`` (the user venv's bin folder; default: this interpreter's): the checkout is never on the path, so a
block only passes against the installed package.

Exit 1 when any block fails (each failure is printed with its file:line, the block and its output's tail), 2 on a
malformed fence.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": "console"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
PRELUDE = ("epochs = 1\nrank, world_size = 0, 1\n\n\ndef train_step(batch):\n    pass\n\n\n"
           "# --- the block from {where} ---\n")
# Cluster URLs -> the scratch folder (the scheme's authority, such as a bucket or a namenode, is dropped).
URL = re.compile(r"\b(?:hdfs|s3a?|gs|abfss?|viewfs)://[^/\s\"']*/")
SUBSTITUTIONS = [
    (re.compile(r"--master[ =]yarn\b"), "--master local[2]"),
    (re.compile(r"--master[ =]'?local\[\*\]'?"), "--master local[2]"),
    (re.compile(r"--deploy-mode[ =]cluster\b"), "--deploy-mode client"),
]
TMP = re.compile(r"(?<![\w/.])/tmp/")
PIP_US = re.compile(r"(\bpip install\b[^\n#]*?)['\"]?\bpetastorm-balanced(\[[\w,]*\])?['\"]?(?=\s|$)")
FIXTURE_NAMES = ("data/reviews", "reviews", "datasets/clicks")  # the dataset names the docs use
DATASET_ROWS, DATASET_FILES = 100_000, 12  # enough for the docs' cluster-sized examples (64 ranks x 256)


class FenceError(Exception):
    """A malformed fence: an unclosed block, or ``norun`` without a reason."""


@dataclass(frozen=True)
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    lang: str  # python, bash, console, or the info string's first word for blocks never run
    norun: str | None
    code: str
    needs: tuple[str, ...] = ()  # modules the block needs; without them it is skipped (and reported)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in ("python", "bash", "console") and self.norun is None


def parse(path: str, text: str) -> list[Block]:
    """The fenced blocks of a Markdown file, with what the fence says about running them."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group("fence"), m.group("info").strip(), i
        word = info.split()[0].lower() if info else ""
        norun = None
        rest = info[len(word):].strip() if info else ""
        if rest.startswith("norun"):
            norun = rest[len("norun"):].lstrip(":").strip()
            if not norun:
                raise FenceError(f"{path}:{start + 1}: `norun` needs a reason: ```{word} norun: WHY")
        needs: tuple[str, ...] = ()
        if rest.startswith("needs"):
            needs = tuple(rest[len("needs"):].lstrip(":").replace(",", " ").split())
            if not needs:
                raise FenceError(f"{path}:{start + 1}: `needs` names modules: ```{word} needs: MODULE ...")
        body, i = [], i + 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence) \
                    and not close.group("info").strip():
                break
            body.append(lines[i][len(m.group("indent")):] if lines[i].startswith(m.group("indent")) else lines[i])
            i += 1
        else:
            raise FenceError(f"{path}:{start + 1}: the block opened here is never closed")
        i += 1
        blocks.append(Block(path, start + 1, RUNNABLE.get(word, word or "bare"), norun, "\n".join(body) + "\n",
                            needs))
    return blocks


def localize(code: str, folder: str) -> str:
    """Map /tmp, cluster URLs and cluster masters to the scratch folder and local[2], and ``pip install
    petastorm-balanced[...]`` to the wheel under test (``$PB_WHEEL``)."""
    code = TMP.sub(folder + "/tmp/", code)  # first: the scratch folder may itself be under /tmp
    code = URL.sub("file://" + folder + "/", code)  # a URL stays a URL (Petastorm refuses scheme-less paths)
    code = PIP_US.sub(lambda m: f'{m.group(1)}"$PB_WHEEL{m.group(2) or ""}"', code)
    for pattern, replacement in SUBSTITUTIONS:
        code = pattern.sub(replacement, code)
    return code


def console_commands(code: str) -> str:
    return "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))


def make_dataset(python: str, root: Path, env: dict) -> Path:
    """The small skewed dataset every file's examples read (generated once, with the installed package)."""
    dataset = root / "fixture" / "reviews"
    subprocess.run([python, "-m", "petastorm_balanced.datagen", str(dataset), "--rows", str(DATASET_ROWS),
                    "--files", str(DATASET_FILES)], check=True, env=env, cwd=root, stdout=subprocess.DEVNULL)
    return dataset


def prepare(folder: Path, dataset: Path) -> None:
    (folder / "tmp").mkdir(parents=True)
    for name in FIXTURE_NAMES:  # links: the dataset is generated once and only read
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(dataset, target_is_directory=True)


def run_block(block: Block, folder: Path, python: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    code = localize(block.code, str(folder))
    name = f"block_{block.line}"
    if block.lang == "python":
        script = folder / f"{name}.py"
        script.write_text(PRELUDE.format(where=block.where) + code)
        cmd = [python, str(script)]
    else:
        script = folder / f"{name}.sh"
        script.write_text(console_commands(code) if block.lang == "console" else code)
        cmd = ["bash", "-euo", "pipefail", str(script)]
    try:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own process group: a timeout ends Spark and torchrun too
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\ntimed out after {timeout:.0f} s")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def block_env(bindir: str, wheel: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    python = os.path.join(bindir, "python")
    env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=os.path.dirname(bindir),
               PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python, SPARK_LOCAL_IP="127.0.0.1",
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533",
               PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    if wheel:
        env["PB_WHEEL"] = os.path.abspath(wheel)
    return env


def importable(python: str, module: str, env: dict) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True).returncode == 0


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/*.md)")
    parser.add_argument("--bin", default=os.path.dirname(sys.executable), help="the user venv's bin folder")
    parser.add_argument("--list", action="store_true", help="list the blocks and what happens to each; run none")
    parser.add_argument("--only", action="append", default=[], metavar="FILE:LINE", help="run these blocks only")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per block (default 300)")
    parser.add_argument("--wheel", help="the wheel under test: `pip install petastorm-balanced[...]` installs it")
    parser.add_argument("--jobs", type=int, default=2, help="files run side by side (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders (printed)")
    parser.add_argument("--require-needs", action="store_true",
                        help="a block whose `needs:` module does not import fails instead of being skipped")
    args = parser.parse_args(argv)
    files = args.files or [str(root / "README.md")] + sorted(str(p) for p in (root / "docs").glob("*.md"))
    try:
        blocks = [b for f in files for b in parse(os.path.relpath(f, root), Path(f).read_text())]
    except FenceError as exc:
        print(f"doc_blocks: {exc}", file=sys.stderr)
        return 2
    if args.only:
        blocks = [b for b in blocks if b.where in args.only]
    if args.list:
        for b in blocks:
            what = "run" if b.runnable else (f"norun: {b.norun}" if b.norun else "never run")
            print(f"{b.where:28} {b.lang:8} {what}")
        return 0
    python = os.path.join(args.bin, "python")
    env = block_env(args.bin, args.wheel)
    missing = {m for b in blocks if b.runnable for m in b.needs if not importable(python, m, env)}
    unmet = [b for b in blocks if b.runnable and missing.intersection(b.needs)]
    for b in unmet:
        print(f"doc_blocks: {b.where:28} {b.lang:8} skipped: needs {', '.join(sorted(missing & set(b.needs)))}")
    if unmet and args.require_needs:
        print(f"doc_blocks: --require-needs, but {', '.join(sorted(missing))} cannot be imported with {python}",
              file=sys.stderr)
        return 1
    blocks = [b for b in blocks if b not in unmet]
    scratch = Path(tempfile.mkdtemp(prefix="pb-doc-blocks-"))
    started, failures, ran = time.perf_counter(), [], 0
    try:
        dataset = make_dataset(python, scratch, env)
        by_file: dict = {}
        for b in blocks:
            if b.runnable:
                by_file.setdefault(b.path, []).append(b)
        lock = threading.Lock()

        def run_file(path: str) -> None:  # a file's blocks in order, in its own folder
            nonlocal ran
            folder = scratch / re.sub(r"\W", "_", path)
            prepare(folder, dataset)
            for b in by_file[path]:
                t0 = time.perf_counter()
                result = run_block(b, folder, python, env, args.timeout)
                status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
                with lock:
                    ran += 1
                    print(f"doc_blocks: {b.where:28} {b.lang:8} {time.perf_counter() - t0:6.1f} s  {status}",
                          flush=True)
                    if result.returncode != 0:
                        failures.append(b)
                        print(f"---- {b.where} ----\n{b.code.rstrip()}\n---- stdout ----\n{tail(result.stdout)}\n"
                              f"---- stderr ----\n{tail(result.stderr)}\n----", flush=True)

        # Files are independent, so they run side by side (a Spark block mostly waits for its JVM).
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for future in [pool.submit(run_file, path) for path in by_file]:
                future.result()
    finally:
        if args.keep:
            print(f"doc_blocks: scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    failures.sort(key=lambda b: (b.path, b.line))
    skipped = [b for b in blocks if b.norun is not None]
    print(f"doc_blocks: {ran} blocks run, {len(failures)} failed, {len(skipped)} marked norun, {len(unmet)} "
          "skipped for a missing module, "
          f"{time.perf_counter() - started:.0f} s")
    for b in failures:
        print(f"doc_blocks: FAILED {b.where}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
