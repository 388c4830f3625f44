"""One kernel built with cuco's light library headers and with the whole ones, timed and
compared (``bench/light_headers.py``, ``tests/test_light_headers.py``).

``cuco/nccl_lsa.cuh`` and ``cuco/nvshmem_device.cuh`` include only the device API the kernels
call; a build with :data:`FULL_HEADERS` takes ``<nccl_device.h>`` and ``<nvshmem.h>`` /
``<nvshmemx.h>`` whole. The two builds' device code (:func:`cuco.kernels.compiler.device_code`:
SASS, resources, launch attributes) must be equal: the headers change build time only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cuco.kernels import Compiler
from cuco.kernels.collectives import KernelSource
from cuco.kernels.compiler import device_code

#: The define that makes cuco's light headers include the whole library headers.
FULL_HEADERS = "-DCUCO_FULL_HEADERS"


@dataclass(frozen=True)
class HeaderBuilds:
    """Seconds of each build (each from an empty cache) and whether their device code agrees."""

    light_s: float
    full_s: float
    same_device_code: bool


def build_both(src: KernelSource, root: Path, arch: str = "sm_90a", *, full_first: bool = False,
               light_cache: Path | None = None) -> HeaderBuilds:
    """Build ``src`` with the light headers and with the whole ones, each in a cache of its own
    under ``root`` (``full_first``: in that order, for interleaved A/B timing). ``light_cache``:
    the light build's cache instead (the build every other compile of ``src`` makes, so a
    cache that holds it already serves it; its seconds are then a cache hit's, not a build's)."""
    seconds, code = {}, {}
    for kind in (("full", "light") if full_first else ("light", "full")):
        cache = Path(light_cache) if kind == "light" and light_cache is not None else Path(root) / kind
        comp = Compiler(arch=arch, cache_dir=cache,
                        extra_flags=(FULL_HEADERS,) if kind == "full" else ())
        t0 = time.perf_counter()
        built = comp.compile(src.source, needs=src.needs, name=src.name)
        seconds[kind] = time.perf_counter() - t0
        code[kind] = device_code(built.path.read_bytes())
    return HeaderBuilds(seconds["light"], seconds["full"], bool(code["light"]) and code["light"] == code["full"])
