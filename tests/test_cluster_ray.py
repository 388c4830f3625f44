"""A search on a real local Ray cluster with CPU-only "hosts" (actors), including a host
that dies mid-run: its candidate is evaluated again elsewhere and nothing is lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuco import CandidateDB, GemmProblem
from cuco.agents import EvolutionAgent
from cuco.agents.api import gpu_space
from cuco.evaluate.analytic import AnalyticEvaluator

ray = pytest.importorskip("ray", reason="Ray not installed (python3 -m pip install -e '.[ray]')")

P = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)


class DiesOnce(AnalyticEvaluator):
    """The host process dies the first time any host sees a warp-issued candidate: the one
    that creates the marker (O_EXCL: two hosts meeting warp candidates at once would both
    have found it missing and both died)."""

    def __init__(self, marker: str):
        super().__init__(P, delay_s=0.02)
        self.marker = marker

    def evaluate(self, cand):
        if cand.directives.issuer.value == "warp":
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return super().evaluate(cand)
            os.write(fd, b"died")
            os.close(fd)
            os._exit(1)
        return super().evaluate(cand)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")  # keep the local cluster on loopback
    yield
    ray.shutdown()


def test_search_spreads_over_hosts_and_survives_a_lost_one(cluster, tmp_path):
    from cuco.cluster import RayBackend
    marker = str(tmp_path / "died")
    backend = RayBackend(lambda: DiesOnce(marker), problem=P, hosts=3)
    db = CandidateDB(tmp_path / "c.db")
    res = EvolutionAgent(backend, db, space=gpu_space(P), islands=3, population=3, children=3,
                         budget=30, seed=3).run()
    backend.close()
    assert res.evaluations == 30
    cands = db.candidates(run_id=res.run_id)
    evs = {e.candidate_id: e for e in db.evaluations()}
    assert len(cands) == 30 and all(c.id in evs for c in cands)  # nothing lost
    assert all(evs[c.id].status == "ok" for c in cands)  # the lost one was judged again
    assert Path(marker).exists() and backend.lost_actors == 1
    hosts = {(evs[c.id].extra or {}).get("host") for c in cands}
    assert len(hosts) >= 3  # spread over the actors (and the replacement)


def test_cli_search_on_a_local_cluster(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "search", "--dry-run", "--cluster", "local",
                        "--hosts", "2", "--budget", "12", "--islands", "2", "--db",
                        str(tmp_path / "c.db")], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, COLUMNS="200"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "12 evaluations" in r.stdout
    db = CandidateDB(tmp_path / "c.db")
    hosts = {(e.extra or {}).get("host") for e in db.evaluations()}
    assert len(hosts) == 2


def test_a_cluster_that_cannot_be_joined_is_one_line_with_the_fix(tmp_path):
    """`--cluster ray://...` without Ray Client (or without a head there) used to be an
    'internal error'; it is an environment problem naming the extra and the head."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "search", "--cluster", "ray://127.0.0.1:1",
                        "--dry-run", "--budget", "4", "--db", str(tmp_path / "c.db")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot join the Ray cluster at ray://127.0.0.1:1" in r.stderr and "Traceback" not in r.stderr
    assert "internal error" not in r.stderr and '".[ray]"' in r.stderr
