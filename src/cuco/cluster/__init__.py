"""Evaluations beyond one process: a Ray backend with one actor per host."""

from cuco.cluster.ray_backend import RayBackend

__all__ = ["RayBackend"]
