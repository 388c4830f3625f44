"""GPU tests of the CP library route's grouped calls (``peer_calls=grouped``; 3+ ranks: 4 GPUs,
or one GPU with ``CUCO_EMULATE=4``): every grouped variant judged by the evaluator's job like
every other (output poisoned, transfers stressed late in checked calls, every element against
the workload's reference on fresh seeds), causal and not, head dim 64 and 128, both backends;
and a grouped variant whose compute stream does not wait for its peers' chunks is caught. Not
yet run on a GPU."""

from __future__ import annotations

import pytest

from conftest import TEST_WORLD
from cuco.design import Directives
from gpu_checks import assert_edit_is_caught, assert_variants_correct

pytestmark = pytest.mark.gpu(count=4)

#: _pipeline.cu.j2's wait_flags body: what the compute stream waits on before a grouped call
WAIT = "for (int i = threadIdx.x; i < n; i += blockDim.x) flag_wait_ge(a, flag_off + (size_t)(first + i) * 8, v);"


@pytest.fixture(autouse=True)
def _needs():
    pytest.importorskip("torch")
    if TEST_WORLD < 3:
        pytest.skip(f"grouped calls need 3+ ranks (CUCO_EMULATE=4); this world has {TEST_WORLD}")


def _wl(causal: bool, head_dim: int):
    from cuco.workloads.cp import CPAttention
    return CPAttention(TEST_WORLD, seq=512 * TEST_WORLD, heads=4, head_dim=head_dim, causal=causal)


def grouped(core: str, backend: str = "lsa", issuer: str = "warp", chunk: int = 64 << 10) -> Directives:
    return Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=chunk, comm_ctas=3, core=core, peer_calls="grouped")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_variants_are_correct(gpu_group, causal, head_dim):
    points = [grouped(core, backend, issuer) for core in ("flash", "cudnn")
              for backend, issuer in (("lsa", "warp"), ("nvshmem", "cta"))]
    assert_variants_correct(gpu_group, _wl(causal, head_dim), points, programs=("host_nccl", "host_torch_flash"))


@pytest.mark.parametrize("causal", [True, False])
def test_a_grouped_variant_that_skips_its_wait_is_caught(gpu_group, causal):
    assert_edit_is_caught(gpu_group, _wl(causal, 128), grouped("cudnn"), WAIT, "", "cp_grouped_racy")
