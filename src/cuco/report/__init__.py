"""Self-contained HTML reports of candidate databases."""

from cuco.report.html import Report, write_report

__all__ = ["Report", "write_report"]
