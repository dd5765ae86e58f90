"""The campaign's HTML report: one self-contained page with every table view and figure and their captions.

Built from the files of an aggregation scope (table views, PNG figures) and the captions in
``captions/`` beside this module (reStructuredText with Jinja placeholders for the campaign config and the analysis
settings), in the categories of mlcampaign.analysis.outputs.REPORT_CATEGORIES. Figures are embedded as data URIs, so the
page opens anywhere, offline, and no path of the checkout is in it: moving a checkout changes
nothing the report depends on.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from pathlib import Path

import docutils.core
import jinja2

from mlcampaign.analysis.outputs import REPORT_CATEGORIES

CAPTIONS = Path(__file__).resolve().parent / "captions"

_STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 80em; line-height: 1.4; }
h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
figure { margin: 1em 0; } figure img { max-width: 100%; }
iframe { width: 100%; height: 28em; border: 1px solid #ccc; }
.caption { color: #333; font-size: 0.95em; }
"""


def _rst_html(text: str) -> str:
    """reStructuredText as an HTML fragment (docutils)."""
    parts = docutils.core.publish_parts(text, writer_name="html", settings_overrides={"report_level": 5})
    return parts["body"]


def caption(path: Path, context: Mapping) -> str:
    """A caption file rendered: Jinja placeholders filled from ``context`` (``snakemake.config``,
    ``snakemake.params``, ``snakemake.wildcards``), then reStructuredText to HTML."""
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(path.read_text())
    return _rst_html(template.render(snakemake=context))


def build_report(
    title: str, views: Mapping[str, Path], figures: Mapping[str, Path], config: Mapping, analysis: Mapping, scope: str
) -> str:
    """The report page: the workflow's description, then per category its figures and table views.
    Captions see the campaign ``config``, the ``analysis`` settings and the aggregation ``scope``."""
    context = {"config": config, "params": {"analysis": analysis}, "wildcards": {"scope": scope}}
    sections = {category: [] for category in dict.fromkeys(REPORT_CATEGORIES.values())}
    for name, path in figures.items():
        image = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        sections[REPORT_CATEGORIES[name]].append(
            f"<figure id='figure-{name}'><img alt='{html.escape(name)}' src='data:image/png;base64,{image}'>"
            f"<figcaption class='caption'>{caption(CAPTIONS / 'figures' / f'{name}.rst', context)}</figcaption>"
            "</figure>"
        )
    for name, path in views.items():
        page = html.escape(Path(path).read_text(), quote=True)
        sections[REPORT_CATEGORIES[name]].append(
            f"<section id='table-{name}'><h3>{html.escape(name)}</h3>"
            f"<div class='caption'>{caption(CAPTIONS / 'tables' / f'{name}.rst', context)}</div>"
            f"<iframe title='{html.escape(name)}' srcdoc=\"{page}\"></iframe></section>"
        )
    body = "".join(f"<h2>{html.escape(category)}</h2>{''.join(items)}" for category, items in sections.items() if items)
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"{caption(CAPTIONS / 'workflow.rst', context)}{body}</body></html>\n"
    )
