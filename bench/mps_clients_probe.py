"""How many MPS clients, each asking for N work queues, one GPU takes at once (issue #35).

    python bench/mps_clients_probe.py --clients 16 --connections 8 --clients 16 --connections 1

Under the running MPS daemon (CUDA_MPS_PIPE_DIRECTORY), starts the given number of processes
together, each with ``CUDA_DEVICE_MAX_CONNECTIONS`` set; each creates its CUDA context and
holds it until all have tried. Prints, per setting, how many contexts started and the first
error. Volta+ MPS clients own their work queues out of one pool shared by all clients, so the
count that fits falls as each asks for more. A probe: no timings.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os


def client(connections: int, barrier, q) -> None:
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    try:
        import cupy
        cupy.cuda.Device(0).use()
        cupy.zeros(1 << 20, dtype=cupy.float32).sum().item()
        q.put(None)
    except Exception as exc:  # noqa: BLE001 - the probe reports whatever context creation says
        q.put(f"{type(exc).__name__}: {exc}"[:160])
    barrier.wait(timeout=120)  # every context is held until all have tried


def trial(clients: int, connections: int) -> tuple[int, str | None]:
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(clients), ctx.Queue()
    procs = [ctx.Process(target=client, args=(connections, barrier, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    errors = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=120)
    failed = [e for e in errors if e]
    return clients - len(failed), (failed[0] if failed else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, action="append", required=True)
    ap.add_argument("--connections", type=int, action="append", required=True)
    args = ap.parse_args()
    for n, c in zip(args.clients, args.connections):
        ok, err = trial(n, c)
        print(f"{n} clients x CUDA_DEVICE_MAX_CONNECTIONS={c}: {ok} started" + (f"; first error: {err}" if err else ""),
              flush=True)


if __name__ == "__main__":
    main()
