"""No file of the tree keeps a merge's conflict markers (one reached docs/architecture.md
once, unseen by every other test). The LLM proposer's SEARCH/REPLACE hunks use the same
marks on purpose and are not conflicts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^(<{7}|>{7}) (?!SEARCH|REPLACE)\S", re.M)


def test_no_tracked_text_file_holds_conflict_markers():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".j2", ".cuh", ".cu", ".sh", ".toml", ".txt", ".yml", ".yaml"}:
            continue
        text = path.read_text(errors="replace")
        hits += [f"{name}: {m.group(0)}" for m in MARK.finditer(text)]
    assert not hits, hits


def test_the_check_sees_a_left_conflict():
    assert MARK.search("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n")
    assert not MARK.search("<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n")
