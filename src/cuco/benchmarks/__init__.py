"""Benchmarks behind ``bench/*.py`` and ``cuco bench``: each writes a result file."""
