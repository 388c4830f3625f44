"""The placements' rules live in cuco.design.placement_rules; templates refuse only what
they cannot render (#38)."""

from __future__ import annotations

import pytest

from cuco import DirectiveError, GemmProblem
from cuco.design import placement_rules
from cuco.design.dimensions import Placement
from cuco.kernels import tp as templates

AR = GemmProblem(workload="gemm_allreduce", m=4096, n=4096, k=4096, world_size=2)


def test_placements_name_every_placement_once_side_stream_first():
    assert sorted(placement_rules.PLACEMENTS) == sorted(p.value for p in Placement)
    assert placement_rules.PLACEMENTS[0] == "side_stream"
    assert all(Placement(p).in_kernel for p in placement_rules.PLACEMENTS[1:])


@pytest.mark.parametrize("change,dimension", [
    ({"sync_scope": "cta"}, "sync_scope"),
    ({"chunk_bytes": 1 << 20}, "chunk_bytes"),
    ({"placement": "dedicated_ctas", "comm_ctas": 40}, "comm_ctas"),
])
def test_a_design_rule_is_the_design_layers_and_the_render_still_refuses_it(change, dimension):
    d = templates.in_kernel("epilogue").replace(**change) if "placement" not in change else \
        templates.in_kernel("dedicated_ctas", comm_ctas=8).replace(comm_ctas=change["comm_ctas"])
    assert templates.supported(AR, d) == []  # the template could render it
    bad = placement_rules.in_kernel_violations(d.__dict__, AR)
    assert [b.split(":")[0] for b in bad] == [dimension]
    with pytest.raises(DirectiveError) as exc:
        templates.render_tp(AR, d)
    assert any(p.startswith(dimension + ":") for p in exc.value.problems)


def test_rows_that_do_not_split_per_rank_name_side_stream():
    ragged = GemmProblem(workload="gemm_allreduce", m=4097, n=4096, k=4096, world_size=2)
    bad = placement_rules.in_kernel_violations(templates.in_kernel("epilogue").__dict__, ragged)
    assert bad and "placement=side_stream" in bad[0]
    side = templates.in_kernel("epilogue").replace(placement="side_stream", comm_ctas=8)
    assert placement_rules.in_kernel_violations(side.__dict__, ragged) == []


def test_what_only_a_template_refuses_stays_with_the_template():
    d = templates.in_kernel("epilogue", backend="gin")
    assert placement_rules.in_kernel_violations(d.__dict__, AR) == []
    assert [b.split(":")[0] for b in templates.supported(AR, d)] == ["backend"]


def test_a_python_chunk_epilogue_is_refused_in_kernel_only():
    msg = placement_rules.chunk_epilogue_refusal("MyGemm", Placement.EPILOGUE)
    assert msg and "MyGemm" in msg and "placement=side_stream" in msg
    assert placement_rules.chunk_epilogue_refusal("MyGemm", Placement.SIDE_STREAM) is None
