"""RayBackend: one actor per GPU host, each owning that host's evaluator.

The search process keeps the candidate database and the proposers (and any API
keys); actors receive only ``(directives, source)`` and send back verdicts.
A lost actor (host gone, process killed) is replaced and its candidate is
queued again, so nothing is lost; the agent writes every verdict to the one
database. Use it wherever an evaluator goes::

    backend = RayBackend(lambda: Evaluator(GemmAllReduce(m=8192, n=8192, k=8192, world_size=2),
                                           group=WorkerGroup(2)), hosts=4,
                         actor_options={"num_gpus": 2})
    EvolutionAgent(backend, db, ...).run()
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from cuco.design import Directives
from cuco.errors import EnvironmentProblem, install_extra
from cuco.evaluate.evaluator import Candidate, EvalResult


class _EvalActor:
    def __init__(self, factory: Callable[[], Any]):
        self.evaluator = factory()
        if getattr(self.evaluator, "db", None) is not None:
            self.evaluator.db = None  # verdicts travel back to the head, which owns the DB

    def evaluate(self, items: list[tuple[str, str | None]]) -> list[dict]:
        """A batch, so the host's evaluator overlaps its compiles with GPU stages."""
        from dataclasses import asdict
        cands = [Candidate(Directives.from_json(d), src) for d, src in items]
        many = getattr(self.evaluator, "evaluate_many", None)
        verdicts = many(cands) if many and len(cands) > 1 else [self.evaluator.evaluate(c) for c in cands]
        out = []
        for r in verdicts:
            rec = asdict(r)
            rec["extra"] = {**rec.get("extra", {}), "host": _hostname()}
            out.append(rec)
        return out


def _hostname() -> str:
    import os
    import platform
    return f"{platform.node()}:{os.getpid()}"


class RayBackend:
    """Looks like an evaluator (``problem``, ``evaluate``, ``evaluate_many``); evaluates on actors."""

    db = None  # the agent stores verdicts

    def __init__(self, factory: Callable[[], Any], *, problem, hosts: int = 2,
                 address: str | None = None, actor_options: dict[str, Any] | None = None,
                 max_restarts_per_candidate: int = 3, init_kwargs: dict[str, Any] | None = None):
        import ray

        if not ray.is_initialized():
            kw = dict(init_kwargs or {})
            if address is None:  # a local cluster stays on loopback
                kw.setdefault("_node_ip_address", "127.0.0.1")
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, **kw)
            except (ValueError, ConnectionError) as exc:  # Ray Client's missing extra, no head
                raise EnvironmentProblem(f"cannot join the Ray cluster at {address}: {exc}; for a ray:// "
                                         f"address install the ray extra ({install_extra('ray')}), "
                                         "and check that the head runs (ray start --head)") from None
        self._ray = ray
        self.problem = problem
        self.factory = factory
        self.options = dict(actor_options or {"num_cpus": 1})
        # actors import what this process can import (user modules, tests, src layouts)
        env = dict(self.options.get("runtime_env") or {})
        env.setdefault("env_vars", {})
        env["env_vars"].setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        self.options["runtime_env"] = env
        self.max_restarts = max_restarts_per_candidate
        self._remote = ray.remote(_EvalActor)
        self.actors = [self._spawn() for _ in range(hosts)]
        self.lost_actors = 0

    def _spawn(self):
        return self._remote.options(**self.options).remote(self.factory)

    def evaluate(self, cand: Candidate) -> EvalResult:
        return self.evaluate_many([cand])[0]

    def evaluate_many(self, cands: list[Candidate]) -> list[EvalResult]:
        """Spread over the actors in batches (one per actor and round); requeue what a
        lost actor was holding."""
        ray = self._ray
        queue = deque(range(len(cands)))
        results: dict[int, EvalResult] = {}
        tries = [0] * len(cands)
        running: dict[Any, tuple[list[int], int]] = {}  # ref -> (candidate indices, actor slot)
        free = deque(range(len(self.actors)))
        per_actor = max(1, -(-len(cands) // max(1, len(self.actors))))
        while queue or running:
            while queue and free:
                slot = free.popleft()
                batch = [queue.popleft() for _ in range(min(per_actor, len(queue)))]
                items = [(cands[i].directives.to_json(), cands[i].source) for i in batch]
                running[self.actors[slot].evaluate.remote(items)] = (batch, slot)
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            batch, slot = running.pop(ref)
            try:
                for i, out in zip(batch, ray.get(ref)):
                    results[i] = EvalResult(**out)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError,
                    ray.exceptions.ActorUnavailableError) as exc:
                self.lost_actors += 1
                self.actors[slot] = self._spawn()  # the host's replacement
                for i in reversed(batch):
                    tries[i] += 1
                    if tries[i] > self.max_restarts:
                        results[i] = EvalResult("error", "cluster",
                                                f"actor lost {tries[i]} times: {str(exc)[-1500:]}")
                    else:
                        queue.appendleft(i)
            except ray.exceptions.RayTaskError as exc:
                for i in batch:
                    results[i] = EvalResult("error", "cluster", str(exc)[-2000:])
            free.append(slot)
        return [results[i] for i in range(len(cands))]

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
