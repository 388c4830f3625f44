"""``python -m cuco.runtime.verifier_entry FD DEVICE``: a verifier process's entry point
(:mod:`cuco.runtime.verifier`), apart so that running it as ``__main__`` does not import
that module twice."""

import sys

from cuco.runtime.verifier import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
