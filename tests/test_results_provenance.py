"""Every reported number names its source.

Each ``bench/results/*.json`` records the commit it measured, the device, the world size
and whether the world was emulated. Every figure in the README (and docs/) that sits in a
paragraph, list item or table row citing a result file (``bench/results/NAME.json``; a table
row or list item without a citation of its own takes the paragraph's before it) must
appear, to the precision shown, among that file's numbers; in the README's "What has been
measured" section every figure must be cited. A figure is a number with a decimal point, or
one followed by ``×``, ``%``, ``ms`` or ``s``; code spans, shapes (``4096×8192``, ``8192³``),
device counts (``2 × H200``) and versions (``2.28.9``) are not figures.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from cuco import results

ROOT = Path(__file__).resolve().parents[1]
RESULT_FILES = sorted((ROOT / "bench" / "results").glob("*.json"))
MEASURED = "## What has been measured"

CITE = re.compile(r"bench/results/(\{[\w,]+\}|[\w-]+)\.json")
CODE = re.compile(r"`[^`]*`")
FIGURE = re.compile(
    r"(?<![\w.×/^-])(\d+(?:\.\d+)?)(?![\w³]|\.\d|×\d|\s×\s*[A-Za-z])(\s?(?:×|%|ms\b|s\b))?")


@dataclass(frozen=True)
class Figure:
    text: str  # as shown, e.g. "1.38"
    unit: str  # "×", "%", "ms", "s" or ""

    def matches(self, value: float) -> bool:
        decimals = len(self.text.split(".")[1]) if "." in self.text else 0
        shown, half = float(self.text), 0.5 * 10 ** -decimals + 1e-9
        return abs(value - shown) <= half or (self.unit == "%" and abs(100 * value - shown) <= half)


def numbers(doc) -> list[float]:
    """Every number a result document holds, at any depth (booleans are not numbers)."""
    if isinstance(doc, bool):
        return []
    if isinstance(doc, (int, float)):
        return [float(doc)]
    if isinstance(doc, dict):
        return [x for v in doc.values() for x in numbers(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in numbers(v)]
    return []


def units(markdown: str) -> list[tuple[str, str, str]]:
    """(section, unit text, citing text) for each paragraph, list item and table row; a row or
    item without a citation of its own is cited by the paragraph before it."""
    out, section, lead, in_code = [], "", "", False
    for block in re.split(r"\n\s*\n", markdown):
        lines = block.strip("\n").splitlines()
        if not lines:
            continue
        if lines[0].startswith("```"):
            in_code = not (len(lines) > 1 and lines[-1].startswith("```")) if not in_code else False
            continue
        if in_code:
            in_code = not lines[-1].startswith("```")
            continue
        if lines[0].startswith("#"):
            section = lines[0].strip()
            lines = lines[1:]
        pieces: list[list] = []  # [text, is a row or item]
        for line in lines:
            row, item = line.startswith("|"), re.match(r"\s*[-*] ", line) is not None
            if row or item or not pieces or pieces[-1][0].startswith("|"):
                pieces.append([line, row or item])
            else:  # the paragraph's or the item's next line
                pieces[-1][0] += " " + line.strip()
        for text, nested in pieces:
            if not nested:
                lead = text
            out.append((section, text, text if CITE.search(text) or not nested else lead + " " + text))
    return out


def cited(text: str) -> list[str]:
    names = []
    for m in CITE.finditer(text):
        names += m.group(1).strip("{}").split(",")
    return names


def figures(text: str) -> list[Figure]:
    text = CODE.sub(" ", text)
    found = []
    for m in FIGURE.finditer(text):
        value, unit = m.group(1), (m.group(2) or "").strip()
        if "." in value or unit:
            found.append(Figure(value, unit))
    return found


def unsupported(markdown: str, results_dir: Path, *, require_in: str | None = MEASURED) -> list[str]:
    """What is wrong with a document's figures, one line each; empty when every cited figure is
    in its file (and every figure of the ``require_in`` section is cited)."""
    problems, cache = [], {}
    for section, text, citing in units(markdown):
        names = cited(citing)
        figs = figures(text)
        if not figs:
            continue
        if not names:
            if require_in and section == require_in:
                problems.append(f"uncited figures {[f.text for f in figs]} in: {text[:100]}")
            continue
        values = []
        for name in names:
            path = results_dir / f"{name}.json"
            if not path.exists():
                problems.append(f"cites {path.name}, which does not exist: {text[:100]}")
                continue
            if name not in cache:
                cache[name] = numbers(json.loads(path.read_text()))
            values += cache[name]
        for fig in figs:
            if values and not any(fig.matches(v) for v in values):
                problems.append(f"{fig.text}{fig.unit} is in none of {names}: {text[:100]}")
    return problems


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_every_result_file_names_its_commit_device_world_size_and_emulation(path):
    doc = json.loads(path.read_text())
    assert results.provenance_problems(doc) == [], path.name
    assert doc["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", doc["commit"])


def test_every_readme_figure_is_in_the_file_it_cites():
    readme = (ROOT / "README.md").read_text()
    assert unsupported(readme, ROOT / "bench" / "results") == []
    checked = [f for _, text, citing in units(readme) if cited(citing) for f in figures(text)]
    assert len(checked) > 60  # the check saw the measured figures, not nothing


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_figures_the_docs_cite_are_in_their_files(doc):
    assert unsupported(doc.read_text(), ROOT / "bench" / "results", require_in=None) == []


def test_the_check_catches_a_wrong_an_uncited_and_a_missing_figure(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"rows": [{"ms": 0.84374, "speedup": 1.3784,
                                                           "share": 0.0618}]}))
    good = ("## What has been measured\n\n`bench/results/x.json` (2 × H200, NCCL 2.28.9): "
            "0.844 ms at 8192³, 1.38× and 1.378×, 6.18 % of the time, at 4096×8192×28672.\n\n"
            "| shape | x |\n|---|---|\n| 8192³ | 0.8437 ms |\n")
    assert unsupported(good, tmp_path) == []
    wrong = good.replace("1.378×", "1.478×")
    assert unsupported(wrong, tmp_path) == [
        "1.478× is in none of ['x']: `bench/results/x.json` (2 × H200, NCCL 2.28.9): 0.844 ms at "
        "8192³, 1.38× and 1.478×, 6.18 % of the t"]
    row = good.replace("| 0.8437 ms |", "| 0.8447 ms |")  # a table row takes the paragraph's file
    assert [p.split(" is in")[0] for p in unsupported(row, tmp_path)] == ["0.8447ms"]
    uncited = good + "\nThe evaluator ran 35.2 candidates a minute.\n"
    assert unsupported(uncited, tmp_path) == [
        "uncited figures ['35.2'] in: The evaluator ran 35.2 candidates a minute."]
    assert unsupported(uncited.replace("## What has been measured", "## Status"), tmp_path) == []
    missing = good.replace("x.json", "y.json")
    assert unsupported(missing, tmp_path)[0].startswith("cites y.json, which does not exist")
