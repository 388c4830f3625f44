"""cuco's build of the library's own tiling: the twin of a cuBLASLt algorithm.

Where the fastest library GEMM beats cuco's best point, the first question is whether the
library's kernel does less work or does the same work faster. cuBLASLt describes each
heuristic algorithm it runs (tile, cluster, split-K: :func:`cuco.runtime.cublaslt.describe`);
this module turns that description into the in-kernel mainloop with the same tiles, the same
cluster and the same slices of K, or into the design space's own words for why cuco cannot
build it. The GEMM-alone bench (:mod:`cuco.benchmarks.gemm_alone`) times each twin beside the
sweep, so a row that loses says either "the same tiles, a slower kernel" or "a tiling cuco
cannot build", with the reason.

cuBLASLt is column-major: cuco's ``C[M, N] = A[M, K] B[K, N]`` is its ``C^T = B^T A^T`` (see
:class:`cuco.runtime.cublaslt.LtGemm`), so its tile ``TMxTN`` is ``TM`` of cuco's N by ``TN`` of
cuco's M, and its cluster ``CMxCNx1`` is ``CM`` CTAs along cuco's N and ``CN`` along cuco's M.
Checked on every algorithm of ``bench/results/gemm_mainloop.json`` (256, at 64 cases): its tile
count ``ceil(N / TM) * ceil(M / TN)`` is the ``waves`` cuBLASLt reports times 132 SMs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from cuco.design import Directives, GemmProblem
from cuco.errors import DirectiveError
from cuco.kernels.tp import Mainloop, deepest, most_stages, supported, with_mainloop


class LibraryTiles(NamedTuple):
    """A cuBLASLt algorithm's tiling in cuco's terms (row-major ``C[M, N]``)."""

    rows: int          # the tile's extent along cuco's M
    cols: int          # along cuco's N
    cluster_n: int     # CTAs of a cluster along cuco's N
    cluster_m: int     # along cuco's M
    split_k: int

    @classmethod
    def of(cls, algo: dict[str, Any]) -> "LibraryTiles":
        """From :func:`cuco.runtime.cublaslt.describe`'s ``tile`` ("TMxTN", cuBLASLt's
        column-major M first), ``cluster`` ("CMxCNx1") and ``split_k``; :class:`ValueError`
        where the description lacks them."""
        try:
            tm, tn = (int(x) for x in str(algo["tile"]).split("x"))
            cm, cn = (int(x) for x in str(algo.get("cluster", "1x1x1")).split("x")[:2])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"no tile and cluster in {algo!r}") from exc
        return cls(rows=tn, cols=tm, cluster_n=cm, cluster_m=cn, split_k=max(1, int(algo.get("split_k", 1))))

    def tiles(self, m: int, n: int) -> int:
        return -(-m // self.rows) * -(-n // self.cols)

    def text(self) -> str:
        cl = f", clusters of {self.cluster_n} along N" if self.cluster_n > 1 else ""
        cl += f", clusters of {self.cluster_m} along M" if self.cluster_m > 1 else ""
        return f"{self.rows}x{self.cols} tiles" + cl + (f", K in {self.split_k} slices" if self.split_k > 1 else "")


class Twin(NamedTuple):
    """The twin of one library algorithm: its tiling, cuco's mainloop with that tiling (None
    where the design space or the templates refuse every candidate) and why not."""

    tiles: LibraryTiles
    mainloop: Mainloop | None
    why_not: str | None


def candidates(t: LibraryTiles, dtype_bytes: int = 2) -> list[Mainloop]:
    """The mainloops with ``t``'s tiling, most faithful first: A and B swapped (the library's M,
    cuco's N, on wgmma's M, as cuBLASLt runs it) where the cluster is along N only; then
    unswapped (cuco's M on wgmma's M) where it is along M only; each cooperative, then
    pingpong; the most stages that fit."""
    out = []
    orientations = []
    if t.cluster_m == 1:
        orientations.append((True, t.cluster_n))
    if t.cluster_n == 1:
        orientations.append((False, t.cluster_m))
    for swap, cluster in orientations:
        for schedule in ("cooperative", "pingpong"):
            out.append(Mainloop(schedule, t.cols, most_stages(t.rows, t.cols, dtype_bytes), t.rows,
                                t.split_k, cluster, swap))
    return out


def _items(text: str) -> list[str]:
    """The refusals of one :class:`DirectiveError` (or one of :func:`supported`'s), each on
    one line without the list's dashes."""
    parts = text.replace("invalid directives:", "").split("\n  - ")
    return [" ".join(p.split()).lstrip("- ") for p in parts if p.strip()]


def library_twin(algo: dict[str, Any], problem: GemmProblem, base: Directives) -> Twin:
    """cuco's mainloop on ``base`` (an in-kernel point) with the tiling of cuBLASLt algorithm
    ``algo`` at ``problem``: the first of :func:`candidates` the design space takes and the
    templates render there, or None and every candidate's refusal, in the design space's words."""
    t = LibraryTiles.of(algo)
    whys: list[str] = []
    if t.cluster_m > 1 and t.cluster_n > 1:
        whys.append(f"clusters along both M and N ({t.cluster_n}x{t.cluster_m}): cuco's clusters run along one")
    elif t.cluster_m > 1:
        whys.append("with A and B swapped, cuco's clusters run along N only")
    elif t.cluster_n > 1:
        whys.append("unswapped, cuco's clusters run along M only")
    for ml in candidates(t, problem.dtype_bytes):
        ml = deepest(problem, ml, base)  # the stages a ring-staged tile leaves room for
        try:
            d = with_mainloop(base, ml, problem.dtype_bytes)
        except DirectiveError as exc:
            whys += _items(str(exc))
            continue
        refused = supported(problem, d)
        if not refused:
            return Twin(t, ml, None)
        whys += [w for r in refused for w in _items(r)]
    return Twin(t, None, "; ".join(dict.fromkeys(whys)) or "no candidate")
