"""Class: text from data in reports. Prompts and model output are inert in every format: no Markdown image, link,
autolink or raw HTML from data renders in ``report.md`` (the HTML page escapes everything already)."""

from __future__ import annotations

import pytest

from miniverl.artifacts.report_render import _md_text

PAYLOADS = [
    "![pixel](https://evil.example/p.png)",
    "[click](https://evil.example/)",
    "<https://evil.example/auto>",
    "<img src=x onerror=alert(1)>",
    "<a href='https://evil.example'>x</a>",
    "` ![in](https://evil.example/code-break.png) `",
    "``` ![fenced](https://evil.example/f.png)\n```",
    "a | b ![p](https://evil.example/pipe.png) | c",
    "line one\n![second](https://evil.example/l2.png)",
    "[ref]\n\n[ref]: https://evil.example/ref",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_markdown_from_data_is_inert(payload: str) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    renderer = markdown_it.MarkdownIt("commonmark").enable("table")  # raw HTML on, as GitHub-like viewers
    table = f"| prompt | reward |\n|---|---|\n| {_md_text(payload)} | 1 |\n"
    html = renderer.render(table)
    assert "<img" not in html and "<a " not in html
    assert "<code>" in html  # the text is shown, as text
    assert _md_text("") == ""
