"""bf16/fp16/fp32 buffers on CuPy (which has no bfloat16: bf16 lives in uint16)."""

from __future__ import annotations

from dataclasses import dataclass

STORAGE = {"bf16": "uint16", "fp16": "float16", "fp32": "float32"}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Unit roundoff of each dtype (half an ulp of 1.0): the scale of every tolerance.
EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
NAN_BITS = {"bf16": 0x7FC0}


def empty(n: int, dtype: str):
    import cupy
    return cupy.empty(n, dtype=STORAGE[dtype])


def from_float32(x, dtype: str):
    """fp32 CuPy array -> storage of ``dtype`` (bf16 rounded to nearest even)."""
    import cupy
    if dtype == "bf16":
        bits = x.astype(cupy.float32).view(cupy.uint32)
        rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
        return rounded.astype(cupy.uint16)
    return x.astype(STORAGE[dtype])


def to_float32(x, dtype: str):
    import cupy
    if dtype == "bf16":
        return (x.astype(cupy.uint32) << 16).view(cupy.float32)
    return x.astype(cupy.float32)


def random(n: int, dtype: str, seed: int):
    """Normal(0, 1) values in ``dtype`` storage, from ``seed`` (never zeros)."""
    import cupy
    rs = cupy.random.RandomState(seed)
    return from_float32(rs.standard_normal(n, dtype=cupy.float32), dtype)


def poison(x, dtype: str) -> None:
    """Fill with NaN so an element nobody wrote fails the check."""
    if dtype == "bf16":
        x.fill(NAN_BITS["bf16"])
    else:
        x.fill(float("nan"))


#: NaN bit layouts: (exponent all ones, mantissa bits).
_NAN_LAYOUT = {"bf16": (0x7F80, 7), "fp16": (0x7C00, 10), "fp32": (0x7F800000, 23)}


@dataclass(frozen=True)
class Poison:
    """One call's poison: a NaN of random sign and payload, or keyed random bytes.

    Every verified call draws a new one, so a kernel cannot tell a checked call by
    recognising a fixed pattern in its outputs (NaN, or one bit pattern): with random
    bytes the outputs hold ordinary numbers that are simply wrong. The bytes are keyed
    noise under a 128-bit key drawn per call (:func:`cuco.runtime.sealed.fill_keyed_bytes`):
    one kernel per buffer, on the caller's stream, that allocates nothing and never waits
    (the former bytes poison made a cuRAND generator per call, with its state, and drew 4
    bytes per byte; ``bench/poison.py`` times both and tells whether each waits for the device).
    A buffer whose elements are not as wide as the dtype the NaN was drawn for (a host
    program's int32 counts, its fp32 scores beside bf16 data) gets keyed bytes instead.
    """

    kind: str  # "nan" | "bytes"
    bits: int = 0  # the NaN's bit pattern ("nan")
    key: int = 0  # the bytes' 128-bit key ("bytes")
    width: int = 0  # bytes of the dtype the NaN was drawn for ("nan")

    @classmethod
    def draw(cls, rng, dtype: str) -> "Poison":
        if rng.random() < 0.5:
            return cls("bytes", key=rng.getrandbits(128))
        exp, mant_bits = _NAN_LAYOUT[dtype]
        payload = rng.randrange(1, 1 << mant_bits)  # non-zero: NaN, never infinity
        sign = (1 << (8 * ITEMSIZE[dtype] - 1)) if rng.random() < 0.5 else 0
        return cls("nan", bits=sign | exp | payload, width=ITEMSIZE[dtype])

    def apply(self, x) -> None:
        """Overwrite every element of the C-contiguous CuPy array ``x`` (any dtype, any
        shape) on the current stream: the NaN where its elements are ``width`` bytes wide,
        keyed bytes otherwise (for a NaN poison, keyed by its bits)."""
        import cupy
        if not x.flags.c_contiguous:  # reshape would copy: the poison would land in the copy
            raise ValueError(f"poison needs a C-contiguous buffer (got strides {x.strides})")
        flat = x.reshape(-1)
        if self.kind == "nan" and x.itemsize == self.width:
            flat.view(cupy.uint16 if self.width == 2 else cupy.uint32).fill(self.bits)
        else:
            from cuco.runtime.sealed import fill_keyed_bytes
            fill_keyed_bytes(flat, self.key if self.kind == "bytes" else self.bits)
