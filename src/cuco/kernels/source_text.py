"""C++ source text as the compiler reads it: lines spliced, comments out.

The edit rules (:mod:`cuco.kernels.evolve`) and the static stage read a candidate's code
as text. They must read it as nvcc does (its preprocessor is the host compiler's), or
a comment that the rules see and the compiler does not hides code from them: ``// /*``
... ``// */`` (a block comment to a regex that strips block comments first, two line
comments to the compiler), a line comment ended by a lone carriage return, or one
continued onto the next line by a backslash.
"""

from __future__ import annotations

import re

#: A backslash, optional horizontal white space and a newline: one line to the compiler
#: (GCC's preprocessor, which nvcc runs, splices across trailing spaces too).
SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_NUMBER_TOKEN = re.compile(r"[0-9A-Za-z_.]*$")
_RAW_PREFIX = re.compile(r"(?<![0-9A-Za-z_])(?:u8|u|U|L)?R$")


def newlines(text: str) -> str:
    """``text`` with CRLF and lone CR as LF: the compiler ends a line at either."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_comments(text: str) -> tuple[str, str | None]:
    """(``text``'s code, what it leaves open). Every comment becomes one space (a block
    comment keeps its newlines) and every splice vanishes (its newline is put back at the
    end of the line it joined), so line numbers hold; string and character literals stay as
    they are, and nothing in them opens a comment. What is left open at the end is
    ``"a comment"``, ``"a string or character literal"`` or None."""
    src = newlines(text)
    n = len(src)
    out: list[str] = []
    owed = 0  # newlines of the splices passed, written at the next line end

    def past_splices(j: int) -> tuple[int, int]:
        """The index after any splices at ``j``, and how many there were."""
        count = 0
        while j < n and src[j] == "\\":
            m = SPLICE.match(src, j)
            if not m:
                break
            j, count = m.end(), count + 1
        return j, count

    def pair(j: int) -> tuple[str, int, int]:
        """The two characters from ``j`` as the compiler sees them, the index after them and
        the splices between them."""
        k, count = past_splices(j + 1)
        return (src[j] + src[k], k + 1, count) if k < n else (src[j], k, count)

    i = 0
    while i < n:
        i, count = past_splices(i)
        owed += count
        if i >= n:
            break
        ch = src[i]
        two, after, count = pair(i) if ch == "/" else ("", i, 0)
        if two in ("//", "/*"):
            owed += count
            out.append(" ")
            i = after
            while True:
                i, count = past_splices(i)
                owed += count
                if i >= n:
                    if two == "/*":
                        return "".join(out), "a comment"
                    break
                if two == "//" and src[i] == "\n":
                    break
                if two == "/*" and src[i] == "*":
                    close, past, count = pair(i)
                    if close == "*/":
                        owed += count
                        i = past
                        break
                if src[i] == "\n":
                    out.append("\n" * (1 + owed))
                    owed = 0
                i += 1
            continue
        if ch == '"' and _RAW_PREFIX.search("".join(out[-8:])):
            m = re.match(r'"([^ ()\\\t\n]{0,16})\(', src[i:i + 20])
            end = src.find(f"){m.group(1)}\"", i) if m else -1
            if end < 0:
                return "".join(out), "a string or character literal"
            stop = end + len(m.group(1)) + 2
            out.append(src[i:stop])
            i = stop
            continue
        if ch == '"' or (ch == "'" and not _in_number("".join(out[-64:]))):
            j = i + 1
            while j < n and src[j] != ch:
                if src[j] == "\n":
                    return "".join(out), "a string or character literal"
                j += 2 if src[j] == "\\" else 1
            if j >= n:
                return "".join(out), "a string or character literal"
            out.append(src[i:j + 1])
            i = j + 1
            continue
        if ch == "\n":
            out.append("\n" * (1 + owed))
            owed = 0
        else:
            out.append(ch)
        i += 1
    return "".join(out) + "\n" * owed, None


def code_of(text: str) -> str:
    """``text`` with its comments out and its lines spliced (see :func:`strip_comments`)."""
    return strip_comments(text)[0]


def _in_number(before: str) -> bool:
    """Whether a ``'`` after ``before`` is a digit separator (``1'000``), not a literal."""
    token = _NUMBER_TOKEN.search(before).group(0)
    return bool(token) and token[0].isdigit()
