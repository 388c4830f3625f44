"""Run a script under torchrun and read the JSON verdict its rank 0 writes; a run that does not
finish in time has its whole process group killed (a hung kernel must not outlive the test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def verdict(script: Path, args: list[str], out: Path, *, nproc: int, timeout: int,
            env: dict[str, str] | None = None) -> dict:
    """``torchrun --nproc-per-node nproc script *args`` (which writes ``out``), its verdict."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", str(nproc), str(script), *args],
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"{script.name} {' '.join(args[:1])}: no verdict within {timeout} s "
                             "(a hang)") from None
    assert proc.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return json.loads(out.read_text())


def run_mode(script: Path, mode: str, inputs: list[str], tmp_path: Path, *, nproc: int,
             timeout: int) -> dict:
    """``script MODE OUT.json *inputs`` under torchrun (modules loaded eagerly, so no kernel
    loads while a peer's spins), its verdict printed (``-s`` shows it) and returned."""
    out = tmp_path / f"{mode}.json"
    v = verdict(script, [mode, str(out), *inputs], out, nproc=nproc, timeout=timeout,
                env={"CUDA_MODULE_LOADING": "EAGER"})
    print(json.dumps(v))
    return v
