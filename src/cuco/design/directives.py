"""One point of the design space: the five dimensions plus tunables."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cuco.design.dimensions import (
    Backend, ChunkSchedule, Core, Issuer, PeerCalls, Placement, Schedule, SyncScope, format_bytes,
)
from cuco.design.field_errors import describe, with_fix
from cuco.design.placement_rules import SWAPPED_TILE_M, TILE_M, launch_time_fields, power_of_two_or_thrice
from cuco.design.problem import Problem
from cuco.design.rules import violations
from cuco.errors import DirectiveError

#: Columns of an output tile: CUTLASS's Hopper collective takes any multiple of 64 its
#: wgmma N and swizzled B layout allow; 64 and 192 fix wave quantization where 128 and 256
#: leave a partial last wave (cuco.kernels.tp.default_mainloop weighs them).
TILE_N = (64, 128, 192, 256)
TILE_K = (32, 64, 128)
RASTER_GROUPS = (1, 4, 8, 16)


SPLIT_K = (1, 2, 3, 4, 6, 8)
#: CTAs of a thread-block cluster along M in the in-kernel mainloop: 1, or 2 (a pair of
#: adjacent m-tiles sharing one B tile, loaded once by TMA multicast).
CLUSTER_M = (1, 2)


def chunk_size_ok(v: int) -> bool:
    """A power of two, three times one, or a multiple of 1 KiB: the in-kernel placements move
    one output tile per flag, and a tile 192 columns wide is 3 x 2^k bytes, one whose rows are
    wgmma's N (``swap_ab``) any multiple of 16 rows of 64+ columns (side_stream takes the first
    two only: :func:`cuco.design.placement_rules.violations`)."""
    return power_of_two_or_thrice(v) or (v > 0 and v % 1024 == 0)


def check_field(field: str, v: int) -> int:
    """Range checks of single tunables that pydantic's ``Field`` cannot express."""
    if field == "chunk_bytes" and (v < 4096 or v > (1 << 28) or not chunk_size_ok(v)):
        raise ValueError(
            f"chunk_bytes={v} must be a power of two between 4K and 256M (e.g. 262144), three "
            "times one (the bytes of a 192-column tile) or a multiple of 1K (an in-kernel tile's)"
        )
    if field == "tile_m" and v not in TILE_M + SWAPPED_TILE_M:
        raise ValueError(f"tile_m={v} is not supported; choose one of {TILE_M}, or with swap_ab=true "
                         "a multiple of 16 from 32 to 256")
    if field == "tile_n" and v not in TILE_N:
        raise ValueError(f"tile_n={v} is not supported; choose one of {TILE_N}")
    if field == "raster_group" and v not in RASTER_GROUPS:
        raise ValueError(f"raster_group={v} is not supported; choose one of {RASTER_GROUPS}")
    if field == "split_k" and v not in SPLIT_K:
        raise ValueError(f"split_k={v} is not supported; choose one of {SPLIT_K}")
    if field == "cluster_m" and v not in CLUSTER_M:
        raise ValueError(f"cluster_m={v} is not supported; choose one of {CLUSTER_M}")
    if field == "tile_k" and v not in TILE_K:
        raise ValueError(f"tile_k={v} is not supported; choose one of {TILE_K}")
    return v


class Directives(BaseModel):
    """A typed, validated, immutable design-space point.

    >>> Directives(backend="lsa", placement="dedicated_ctas", comm_ctas=8).name
    'lsa.dedicated_ctas.kernel.cta.c1M'

    Construction checks the rules that hold for every problem; use
    :meth:`check` (or :meth:`DesignSpace.validate`) for a given problem.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    # the five dimensions
    backend: Backend = Backend.LSA
    placement: Placement = Placement.EPILOGUE
    sync_scope: SyncScope = SyncScope.KERNEL
    issuer: Issuer = Issuer.CTA
    chunk_bytes: int = Field(default=1 << 20, description="bytes per transfer (a power of two, or three times one: a 192-column tile)")
    # tunables
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    stages: int = Field(default=4, ge=2, le=16,
                        description="mainloop pipeline stages (as many as fit beside the staged output tile)")
    comm_ctas: int = Field(default=0, ge=0, le=64, description="CTAs reserved for communication")
    chunk_schedule: ChunkSchedule = ChunkSchedule.DIRECT
    raster_group: int = Field(default=1, description="in-kernel placements: m-tiles a CTA wave "
                              "walks down before moving along N (1: row by row)")
    comm_warps: int = Field(default=0, ge=0, le=3, description="in-kernel placements: spare "
                            "producer warps that run each tile's epilogue while the consumer "
                            "warpgroups compute the next tile (0: the consumers run it)")
    schedule: Schedule = Field(default=Schedule.COOPERATIVE, description="in-kernel placements: "
                               "cooperative (both consumer warpgroups on each tile) or pingpong "
                               "(each its own tiles, taking turns)")
    split_k: int = Field(default=1, description="in-kernel placements: slices of K each output "
                         "tile is cut into, each slice a unit of work of its own, summed in fp32 by "
                         "the slice that finishes last before the tile's epilogue (1: whole K)")
    cluster_m: int = Field(default=1, description="in-kernel placements: CTAs of a cluster along "
                           "the mainloop's M (2: each pair of CTAs computes two adjacent m-tiles of "
                           "one n-tile in lock-step, B loaded once for both by TMA multicast; with "
                           "swap_ab, whose mainloop's M is N, two adjacent n-tiles of one m-tile, A "
                           "loaded once for both; 1: no cluster)")
    swap_ab: bool = Field(default=False, description="in-kernel placements: the mainloop computes "
                          "C^T = B^T A^T, the tile's rows on wgmma's N (tile_m any multiple of 16 "
                          "from 32 to 256: a tile fitted to few or ragged rows) and its columns on "
                          "wgmma's M (false: the rows on wgmma's M, tile_m 64, 128 or 256)")
    core: Core = Field(default=Core.OWN, description="what computes the op's steps: the "
                       "template's own kernel (own) or a library's kernel per phase (flash, "
                       "cudnn: context-parallel attention), beside the communication kernel")
    peer_calls: PeerCalls = Field(default=PeerCalls.PER_PEER, description="a library core: one "
                                  "phase of calls per peer's K/V as it arrives (per_peer), "
                                  "every peer's K/V together, contiguous in the receive buffer, in "
                                  "as few calls as the mask allows (grouped), or one call over "
                                  "every rank's K/V once all have arrived, no merge (all_keys: "
                                  "non-causal)")

    @model_validator(mode="wrap")
    @classmethod
    def _named(cls, values, handler):
        """A refused field is a :class:`DirectiveError` (a ``CucoError``) naming the field,
        the value and one to use, never pydantic's ``ValidationError``."""
        try:
            return handler(values)
        except ValidationError as exc:
            found = [describe(cls, e) for e in exc.errors()]
            first = next((f for f in found if f.fix is not None), found[0])
            raise DirectiveError([with_fix(f) for f in found], param=first.field, fix=first.fix,
                                 guess=first.guess) from None

    @field_validator("chunk_bytes", "raster_group", "split_k", "cluster_m", "tile_m", "tile_n", "tile_k")
    @classmethod
    def _checked(cls, v: int, info) -> int:
        """The fields whose allowed values :func:`check_field` knows (sizes, tiles, counts)."""
        return check_field(info.field_name, v)

    @model_validator(mode="after")
    def _rules(self) -> "Directives":
        bad = violations(self.__dict__)
        if bad:
            raise DirectiveError(bad)
        return self

    def check(self, problem: Problem) -> "Directives":
        """Raise :class:`DirectiveError` if this point is invalid for ``problem``."""
        bad = violations(self.__dict__, problem)
        if bad:
            raise DirectiveError(bad)
        return self

    def replace(self, **changes) -> "Directives":
        """A validated copy with ``changes`` (``model_copy`` would skip validation)."""
        return type(self)(**{**self.model_dump(), **changes})

    @property
    def name(self) -> str:
        """Short variant name: the five dimensions, backend first, then a library core
        where one computes (``lsa.side_stream.chunk.warp.c4M.cudnn``) and how it calls over
        the peers' K/V where that is not a call per peer (``...c4M.cudnn.grouped``,
        ``...c4M.cudnn.all_keys``)."""
        return ".".join((
            self.backend.value, self.placement.value, self.sync_scope.value,
            self.issuer.value, "c" + format_bytes(self.chunk_bytes),
            *((self.core.value,) if self.core.library else ()),
            *((self.peer_calls.value,) if self.peer_calls is not PeerCalls.PER_PEER else ()),
        ))

    @property
    def full_name(self) -> str:
        """Variant name with every tunable, unique per point."""
        extra = f"t{self.tile_m}x{self.tile_n}x{self.tile_k}.s{self.stages}"
        if self.comm_ctas:
            extra += f".cc{self.comm_ctas}"
        if self.raster_group != 1:
            extra += f".g{self.raster_group}"
        if self.comm_warps:
            extra += f".cw{self.comm_warps}"
        if self.schedule is Schedule.PINGPONG:
            extra += ".pp"
        if self.split_k != 1:
            extra += f".sk{self.split_k}"
        if self.cluster_m != 1:
            extra += f".cl{self.cluster_m}"
        if self.swap_ab:
            extra += ".ab"
        return f"{self.name}.{extra}.{self.chunk_schedule.value}"

    def build_point(self) -> "Directives":
        """The point whose build serves this one: the values its placement's kernels take at
        launch (:func:`cuco.design.placement_rules.launch_time_fields`, e.g. an in-kernel
        tile order) at their defaults. Points with one build point render one source."""
        fields = launch_time_fields(self.placement)
        return self.model_copy(update={f: type(self).model_fields[f].default for f in fields})

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> "Directives":
        return cls.model_validate_json(text)
