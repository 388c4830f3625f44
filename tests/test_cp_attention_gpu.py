"""The context-parallel attention kernel alone on one GPU (bench/cp_attention_kernel.py's
checks): one pass and the fused call's two phases against fp32 for W = 1, 2, 4, causal and
not, head_dim 64 and 128, bf16 and fp16; and a call whose peers' data and flags land while
it runs (a kernel that did not wait would read NaN)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu(count=1)


def test_attention_kernel_alone_is_correct_and_waits_for_its_flags():
    pytest.importorskip("torch")
    path = Path(__file__).parents[1] / "bench" / "cp_attention_kernel.py"
    spec = importlib.util.spec_from_file_location("cp_attention_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    report: list[dict] = []
    assert mod.correctness(report), [r for r in report if r["bad"]]
    assert {r["check"] for r in report} == {"output", "flag_wait"}
