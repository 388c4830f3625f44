"""Errors cuco raises on bad input or a missing environment.

Every message says what is wrong *and* what to do about it, because the
person reading it is usually in a notebook or a build log, not in our code.

Rule violations (:class:`DirectiveError`, :class:`ShapeError`) deliberately do
not derive from ``ValueError``: raised inside a pydantic validator they then
reach the caller as themselves, not wrapped in a ``ValidationError``.
"""

from __future__ import annotations

import shlex


class CucoError(Exception):
    """Base class of every error cuco raises on purpose.

    An error that one argument can fix names it: ``param`` (as the Python API spells it)
    and ``fix`` (the value to pass instead; ``guess`` when it is a close match of what was
    typed). ``str(err)`` spells the fix as a Python argument (``budget=100``);
    ``err.render("--budget")`` as a command-line flag (``--budget 100``).
    """

    def __init__(self, message: str = "", *, param: str | None = None, fix: object = None,
                 guess: bool = False):
        self.message, self.param, self.fix, self.guess = message, param, fix, guess
        super().__init__(self.render())

    def render(self, flag: str | None = None) -> str:
        """The message, its fix spelled as ``flag VALUE`` (a CLI flag) or ``param=VALUE``."""
        if self.param is None or self.fix is None:
            return self.message
        # a flag's value as a shell takes it (compat:URL|MODEL's bar would be a pipe)
        spelled = f"{flag} {shlex.quote(str(self.fix))}" if flag else f"{self.param}={self.fix!r}"
        return (f"{self.message}; did you mean {spelled}?" if self.guess
                else f"{self.message}; use {spelled}")

    def __str__(self) -> str:  # never KeyError's repr
        return self.args[0] if len(self.args) == 1 and isinstance(self.args[0], str) else super().__str__()


class InputError(CucoError):
    """An argument cuco refuses (an unknown name, a count below 1, ...); raised before
    anything is opened, compiled or started."""


class ArchError(InputError, ValueError):
    """A GPU architecture name nvcc cannot take."""


class UnknownId(InputError, KeyError):
    """A run or candidate id that the database does not hold (still a ``KeyError``)."""


class DirectiveError(CucoError):
    """A point of the design space that is invalid (alone or for a problem).

    ``problems`` lists one line per violated rule; each names the dimension
    and what to choose instead.
    """

    def __init__(self, problems: list[str], *, param: str | None = None, fix: object = None,
                 guess: bool = False):
        self.problems = list(problems)
        super().__init__("invalid directives:\n  - " + "\n  - ".join(self.problems))
        # a refused field's lines already end with their fix; these are for programs
        self.param, self.fix, self.guess = param, fix, guess


class ShapeError(InputError):
    """A problem shape that the world size or a tile does not divide."""


class EnvironmentProblem(CucoError, RuntimeError):
    """Something the machine lacks: a GPU, enough GPUs, nvcc, a library."""


class NoGPUError(EnvironmentProblem):
    """No CUDA device is visible."""


class TooFewGPUsError(EnvironmentProblem):
    """Fewer GPUs than the requested world size."""


class LibraryNotFound(EnvironmentProblem):
    """nvcc, NCCL, NVSHMEM or CUTLASS could not be located."""


class LibraryConflict(EnvironmentProblem):
    """Two copies of one library would meet in a process (e.g. torch's libnccl and
    another NCCL cuco was pointed at), or a library's headers and binary disagree."""


class CompileError(CucoError):
    """nvcc rejected a kernel; ``summary`` holds the lines that matter."""

    def __init__(self, summary: str, log: str = "", command: list[str] | None = None):
        self.summary = summary
        self.log = log
        self.command = command or []
        super().__init__(f"kernel does not compile:\n{summary}")


class DatabaseError(CucoError):
    """The candidate database cannot be opened or is of a newer schema."""


class DatabaseNotWritable(InputError, DatabaseError):
    """The candidate database's file or folder is read-only: SQLite writes beside the file
    (its journal) even to read it, so the user picks a database in a folder they can write."""


def install_extra(extra: str) -> str:
    """How to install one of cuco's extras (``torch``, ``llm``, ``ray``, ``postgres``): from
    cuco's clone, since the name ``cuco`` on the package index is another project's, which
    ``pip install 'cuco[...]'`` would fetch over this one."""
    return f'python3 -m pip install -e ".[{extra}]" in cuco\'s clone'


def exit_code(exc: BaseException) -> int:
    """A command's exit status for ``exc``: 2 when the user fixes the command (a refused
    argument, shape or directive), 1 when the machine or data is at fault."""
    return 2 if isinstance(exc, (InputError, DirectiveError)) else 1


def run_script(main) -> None:
    """Run a script's ``main()`` (returning its exit status): a :class:`CucoError` is one
    line on stderr and exit :func:`exit_code`, never a traceback (``CUCO_DEBUG=1`` shows it)."""
    import os
    import sys
    try:
        code = main()
    except CucoError as exc:
        if os.environ.get("CUCO_DEBUG", "") not in ("", "0"):
            raise
        text = " ".join((exc.render() if not isinstance(exc, DirectiveError)
                         else "invalid directives: " + "; ".join(exc.problems)).split())
        print(f"error: {text}", file=sys.stderr)
        sys.exit(exit_code(exc))
    sys.exit(code)
