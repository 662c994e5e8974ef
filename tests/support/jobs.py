"""Starting real multi-process jobs from tests: a free port, and an environment without any launcher's variables."""
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def torchrun(nproc: int, script, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc script args`` on 127.0.0.1; fails the test with the output if it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(script), *map(str, args)]
    done = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(cmd)} exited {done.returncode}:\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}")
    return done
