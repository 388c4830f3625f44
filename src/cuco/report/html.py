"""One self-contained HTML page per candidate database (or per run).

Plots are inline SVG from matplotlib; the page loads nothing from the network
and runs no script. Sections: best per workload, and for each run: fitness
over evaluations per island (phase switch and migrations marked), failures by
stage, LLM cost, the best candidate's lineage and its kernel's diff from the
fast-path baseline.
"""

from __future__ import annotations

import difflib
import html
import io
from collections import Counter
from pathlib import Path

from cuco.db import Candidate, CandidateDB, Evaluation, Run
from cuco.errors import CucoError, InputError

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:.3em .6em;
font-size:.9em;text-align:left} th{background:#f4f4f4} pre{background:#f8f8f8;padding:.8em;
overflow-x:auto;font-size:.8em} .add{background:#e6ffed} .del{background:#ffeef0}
.muted{color:#777} .model{background:#fff4d6;padding:.4em} figure{margin:1em 0} ul.lineage{font-family:monospace;font-size:.85em}
"""


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _fmt(x, nd=3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


class Report:
    def __init__(self, db: CandidateDB, run_id: int | None = None):
        self.db = db
        self.runs = [db.run(run_id)] if run_id is not None else db.runs()
        evs = db.evaluations()
        self.latest: dict[int, Evaluation] = {}
        for e in evs:
            self.latest[e.candidate_id] = e

    def is_model(self, run: Run) -> bool:
        """Whether the run's scores are analytic-model predictions (a dry run)."""
        return any(self.latest[c.id].is_model for c in self.db.candidates(run_id=run.id)
                   if c.id in self.latest)

    # ---- sections -----------------------------------------------------------------------
    def best_table(self) -> str:
        rows = []
        for r in self.runs:
            hit = self.db.best(r.workload, run_id=r.id)
            if hit is None:
                rows.append(f"<tr><td>{r.id}</td><td>{html.escape(r.workload)}</td>"
                            "<td colspan=6 class=muted>no correct candidate</td></tr>")
                continue
            c, e = hit
            rows.append(
                f"<tr><td>{r.id}</td><td>{html.escape(r.workload)}</td><td>{c.id}</td>"
                f"<td><code>{html.escape(_name(c))}</code></td>"
                + "".join(f"<td class={e.evidence}>{html.escape(e.label(v, nd))}</td>" for v, nd in (
                    (e.speedup, 3), ((e.extra or {}).get("torch_speedup"), 3), (e.overlap_eff, 3),
                    (e.time_ms, 4)))
                + "</tr>")
        return ("<table id=best><tr><th>run</th><th>workload</th><th>candidate</th><th>directives</th>"
                "<th>speedup vs host</th><th>vs PyTorch</th><th>overlap eff.</th><th>ms</th></tr>"
                + "".join(rows) + "</table>")

    def fitness_plot(self, run: Run) -> str:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cands = self.db.candidates(run_id=run.id)
        order = sorted((self.latest[c.id].id, c) for c in cands if c.id in self.latest)
        fig, ax = plt.subplots(figsize=(9, 3.6))
        best: dict[int, float] = {}
        series: dict[int, list[tuple[int, float]]] = {}
        for i, (_, c) in enumerate(order, start=1):
            e = self.latest[c.id]
            score = e.speedup if e.status == "ok" and e.speedup else 0.0
            isl = c.island or 0
            best[isl] = max(best.get(isl, 0.0), score)
            series.setdefault(isl, []).append((i, best[isl]))
            ax.scatter([i], [score], s=8, color=f"C{isl}", alpha=.35)
        for isl, pts in sorted(series.items()):
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color=f"C{isl}",
                    label=f"island {isl}")
        gen_end = {ev["generation"]: ev["data"]["evaluations"]
                   for ev in self.db.events(run.id, "generation")}
        for ev in self.db.events(run.id, "phase_switch"):
            x = ev["data"].get("evaluations", 0)
            ax.axvline(x, color="k", ls="--", lw=1)
            ax.annotate("exploitation", (x, ax.get_ylim()[1]), fontsize=8, va="top")
        for ev in self.db.events(run.id, "migration"):
            x = gen_end.get(ev["generation"])
            if x:
                ax.axvline(x, color="grey", ls=":", lw=.8)
        ax.set_xlabel("evaluation")
        ax.set_ylabel("speedup, model (0 = failed)" if self.is_model(run) else "speedup (0 = failed)")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"run {run.id}: best so far per island (dotted: migrations)")
        return f"<figure id=fitness-{run.id}>{_svg(fig)}</figure>"

    def failures(self, run: Run) -> str:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        counts = Counter(f"{self.latest[c.id].stage_reached}:{self.latest[c.id].status}"
                         for c in self.db.candidates(run_id=run.id)
                         if c.id in self.latest and self.latest[c.id].status != "ok")
        fig, ax = plt.subplots(figsize=(6, 2.4))
        if counts:
            names, vals = zip(*sorted(counts.items()))
            ax.barh(names, vals, color="C3")
        else:
            ax.text(.5, .5, "no failures", ha="center", va="center")
            ax.axis("off")
        ax.set_title("failures by stage")
        return f"<figure id=failures-{run.id}>{_svg(fig)}</figure>"

    def llm_cost(self, run: Run) -> str:
        rows = self.db.llm_summary(run.id)
        if not rows:
            return "<p class=muted>No LLM calls (offline proposer).</p>"
        body = "".join(f"<tr><td>{html.escape(r['provider'])}</td><td>{html.escape(r['model'])}</td>"
                       f"<td>{r['status']}</td><td>{r['calls']}</td><td>{r['prompt_tokens']}</td>"
                       f"<td>{r['completion_tokens']}</td><td>${r['cost_usd']:.4f}</td></tr>"
                       for r in rows)
        return ("<table class=llm><tr><th>provider</th><th>model</th><th>status</th><th>calls</th>"
                "<th>prompt tokens</th><th>completion tokens</th><th>cost</th></tr>" + body +
                f"</table><p>Total: ${self.db.llm_cost(run.id):.4f}</p>")

    def lineage(self, run: Run) -> str:
        hit = self.db.best(run.workload, run_id=run.id)
        if hit is None:
            return "<p class=muted>No correct candidate, no lineage.</p>"
        items = []
        for c in self.db.lineage(hit[0].id):
            e = self.latest.get(c.id)
            items.append(f"<li>#{c.id} gen {c.generation} island {c.island} {c.origin} "
                         f"<code>{html.escape(_name(c))}</code> → {e.status if e else '—'} "
                         f"{html.escape(e.speedup_label()) if e else ''} "
                         f"parents {c.parents or '—'}</li>")
        return "<ul class=lineage>" + "".join(items) + "</ul>"

    def source_diff(self, run: Run) -> str:
        hit = self.db.best(run.workload, run_id=run.id)
        if hit is None:
            return ""
        best = hit[0]
        cands = self.db.candidates(run_id=run.id)
        base = next((c for c in cands if c.origin == "fastpath"), None)
        new, old = _source(best, run), _source(base, run) if base else None
        if new is None:
            return "<p class=muted>The best candidate's source is not stored or renderable.</p>"
        if old is None:
            return f"<pre>{html.escape(new)}</pre>"
        lines = []
        for ln in difflib.unified_diff(old.splitlines(), new.splitlines(),
                                       f"fast-path #{base.id}", f"best #{best.id}", lineterm="", n=3):
            cls = "add" if ln.startswith("+") and not ln.startswith("+++") else (
                "del" if ln.startswith("-") and not ln.startswith("---") else "")
            lines.append(f"<span class='{cls}'>{html.escape(ln)}</span>")
        diff = "\n".join(lines) or "(identical to the fast-path baseline)"
        return (f"<h3>Diff from the fast-path baseline</h3><pre id=diff-{run.id}>{diff}</pre>"
                f"<details><summary>Full source of #{best.id}</summary><pre>{html.escape(new)}</pre></details>")

    def render(self) -> str:
        parts = [f"<!doctype html><html><head><meta charset=utf-8><title>cuco report</title>"
                 f"<style>{CSS}</style></head><body><h1>cuco report</h1>"
                 f"<p class=muted>{html.escape(self.db.url)} — {len(self.runs)} run(s)</p>",
                 "<h2>Best per workload</h2>", self.best_table()]
        for r in self.runs:
            model = self.is_model(r)
            parts += [f"<h2 id=run-{r.id}>Run {r.id}: {html.escape(r.name)} ({r.status})"
                      + (" — analytic model (dry run)" if model else "") + "</h2>",
                      ("<p class=model><b>Dry run:</b> every speedup in this run is the analytic "
                       "model's prediction, not a measurement; no kernel was run or checked.</p>"
                       if model else ""),
                      f"<p class=muted>{html.escape(r.workload)} {html.escape(str(r.problem or ''))}</p>",
                      self.fitness_plot(r), self.failures(r), "<h3>LLM cost</h3>", self.llm_cost(r),
                      "<h3>Lineage of the best</h3>", self.lineage(r), self.source_diff(r)]
        parts.append("</body></html>")
        return "\n".join(parts)


def _name(c: Candidate) -> str:
    if not c.directives:
        return "(source only)"
    from cuco.design import Directives
    return Directives(**c.directives).full_name


def _source(c: Candidate | None, run: Run) -> str | None:
    if c is None:
        return None
    if c.source:
        return c.source
    if not c.directives or not run.problem:
        return None
    try:
        from cuco.design import Directives, problem_from_dict
        from cuco.workloads import for_problem
        return for_problem(problem_from_dict(run.problem)).render(Directives(**c.directives)).source
    except Exception:  # noqa: BLE001 - not renderable (e.g. a user workload not registered here)
        return None


def write_report(db: CandidateDB | str, path: str | Path, run_id: int | None = None) -> Path:
    """Render the report of ``db`` (or one run of it) to ``path``."""
    out = Path(path)
    if not out.parent.is_dir():
        raise InputError(f"cannot write the report to {out}: the directory {out.parent} does not "
                         "exist; create it or write the report elsewhere", param="output",
                         fix="report.html")
    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
    if not store.runs():  # a page of empty tables would look like a search that found nothing
        where = store.file or store.url
        raise CucoError(f"{where} holds no search run: nothing to report; search into it first "
                        f"(cuco search --dry-run --db {where}) or give the database a search "
                        "wrote (cuco db ls --db FILE lists its runs)")
    page = Report(store, run_id).render()
    try:
        out.write_text(page)
    except OSError as exc:
        raise InputError(f"cannot write the report to {out}: {exc.strerror or exc}; write it "
                         "elsewhere", param="output", fix="report.html") from None
    return out
