"""``python -m cuco.runtime.worker_entry FD``: a worker process's entry point.

Kept apart from :mod:`cuco.runtime.worker` so that running it as ``__main__``
does not import that module twice.
"""

import sys
from multiprocessing.connection import Connection

from cuco.runtime.worker import die_with_parent, worker_main

if __name__ == "__main__":
    die_with_parent()
    conn = Connection(int(sys.argv[1]))
    rank, world, device, options = conn.recv()
    worker_main(rank, world, device, conn, options)
