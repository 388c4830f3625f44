"""Kernel templates, their rendering, and the nvcc driver."""

from cuco.kernels.compiler import CompiledKernel, Compiler, summarize_errors
from cuco.kernels.render import render, templates

__all__ = ["CompiledKernel", "Compiler", "render", "summarize_errors", "templates"]
