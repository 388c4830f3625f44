"""Kernel templates, their rendering, and the nvcc driver."""

from cuco.kernels.collectives import KernelSource
from cuco.kernels.compiler import CompiledKernel, Compiler, summarize_errors
from cuco.kernels.render import render, templates

__all__ = ["CompiledKernel", "Compiler", "KernelSource", "render", "summarize_errors", "templates"]
