"""Element-wise comparison of a candidate's output with an fp32 reference."""

from __future__ import annotations

from typing import Any

from cuco.runtime import dtypes


def compare(got_storage, ref32, dtype: str, rtol: float, atol: float) -> dict[str, Any]:
    """Every element must satisfy ``|got - ref| <= rtol * |ref| + atol``; NaN never passes.

    Returns ``correct``, ``bad_elements``, ``rel_l2_error`` and ``max_abs_error``.
    """
    import cupy
    got = dtypes.to_float32(got_storage.reshape(-1), dtype)
    ref = ref32.reshape(-1)
    if got.size != ref.size:
        raise ValueError(f"output has {got.size} elements, reference {ref.size}")
    diff = cupy.abs(got - ref)
    bad = int(cupy.count_nonzero(~(diff <= rtol * cupy.abs(ref) + atol)))
    denom = float(cupy.linalg.norm(ref)) or 1.0
    finite = cupy.nan_to_num(diff, nan=1e30, posinf=1e30)
    return {"correct": bad == 0, "bad_elements": bad,
            "rel_l2_error": float(cupy.linalg.norm(finite)) / denom,
            "max_abs_error": float(finite.max()) if finite.size else 0.0}
