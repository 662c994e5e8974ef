#!/usr/bin/env python3
"""Run every code block of README.md and docs/*.md exactly as a user pastes it, so that a stale example fails CI.

    python scripts/doc_blocks.py [--list] [--bin VENV/bin] [--only FILE:LINE] [FILE.md ...]

THE CONVENTION (every page follows it; the fence's info string says what happens to a block):
  ```python / ```bash / ```sh / ```console   run verbatim, in order, one process per block
  ```python torchrun: N                      saved to a file and run as ``torchrun --standalone --nproc_per_node N
                                             FILE`` (a block that needs ranks; the page says to run it that way)
  ```python norun: REASON                    not run; REASON says what the reader must supply or replace (a
                                             cluster, a GPU, their own model); ``norun`` alone is an error
  ```python needs: MODULE [MODULE ...]       run where every MODULE imports in the venv, else reported as skipped
                                             (TensorFlow and JAX examples: the framework venv runs them)
  ```text, ```json, a bare ``` ...           never run (program output, file contents)
A ``console`` block runs its ``$ `` lines only. Nothing is rewritten and nothing is defined for a block: each
Markdown file gets an empty working directory, and its blocks run there in order, with the venv's bin folder first
on PATH (as an activated venv), sharing files (a dataset one block writes, the next reads) but no Python state.
So a runnable block must create the data it reads or read what a block above it on the same page wrote (relative
paths: the working directory is the reader's), and define every name it uses (a tiny ``train_step`` included).
What a reader must replace (a cluster URL, a bucket) goes in a ``norun`` block, with the runnable local twin
beside it where there is one. Files run side by side (``--jobs``) in folders removed afterwards.

Commands come from ``--bin`` (the user venv's bin folder; default: this interpreter's): the checkout is never on
the path, so a block only passes against the installed package. With ``--require-needs`` a block whose module
does not import fails instead (the framework venv of scripts/user_tier.sh).

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
OPTIONS = ("norun", "needs", "torchrun")  # what may follow the language word in a fence's info string


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
    ranks: int | None = None  # ``torchrun: N``: run as N processes under torchrun

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
        rest = info[len(word):].strip() if info else ""
        option = rest.split(":")[0].split()[0] if rest else ""
        value = rest[len(option):].lstrip(":").strip()
        if option and option not in OPTIONS:
            raise FenceError(f"{path}:{start + 1}: unknown fence option {option!r} (one of {', '.join(OPTIONS)})")
        norun = value if option == "norun" else None
        if option == "norun" and not norun:
            raise FenceError(f"{path}:{start + 1}: `norun` needs a reason: ```{word} norun: WHY")
        needs = tuple(value.replace(",", " ").split()) if option == "needs" else ()
        if option == "needs" and not needs:
            raise FenceError(f"{path}:{start + 1}: `needs` names modules: ```{word} needs: MODULE ...")
        ranks = None
        if option == "torchrun":
            if word != "python" or not value.isdigit() or int(value) < 1:
                raise FenceError(f"{path}:{start + 1}: `torchrun` takes a python block and a process count: "
                                 "```python torchrun: 2")
            ranks = int(value)
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
                            needs, ranks))
    return blocks


def console_commands(code: str) -> str:
    return "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))


def run_block(block: Block, folder: Path, python: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    name = f"block_{block.line}"
    if block.lang == "python":
        script = folder / f"{name}.py"
        script.write_text(block.code)  # verbatim: nothing added, nothing replaced
        cmd = [python, str(script)]
        if block.ranks is not None:  # torchrun from the venv, as the page says to run it
            cmd = [os.path.join(os.path.dirname(python), "torchrun"), "--standalone",
                   f"--nproc_per_node={block.ranks}", script.name]
    else:
        script = folder / f"{name}.sh"
        script.write_text(console_commands(block.code) if block.lang == "console" else block.code)
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


def block_env(bindir: str) -> dict:
    """What an activated venv gives a user's shell; PYTHONPATH goes (the checkout must not be importable)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=os.path.dirname(bindir),
               PYTHONDONTWRITEBYTECODE="1")
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
            what += f" under torchrun, {b.ranks} processes" if b.ranks and b.runnable else ""
            print(f"{b.where:28} {b.lang:8} {what}")
        return 0
    python = os.path.join(args.bin, "python")
    env = block_env(args.bin)
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
        by_file: dict = {}
        for b in blocks:
            if b.runnable:
                by_file.setdefault(b.path, []).append(b)
        lock = threading.Lock()

        def run_file(path: str) -> None:  # a file's blocks in order, in its own folder
            nonlocal ran
            folder = scratch / re.sub(r"\W", "_", path)
            folder.mkdir()
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
