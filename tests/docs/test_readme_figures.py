"""The README's measured figures are the benchmark pages' figures.

The README's **Measured** list gives a few figures, each bullet linking to the benchmark
page it comes from (docs/benchmarks/*.md, whose tables tests/benchmarks checks against
the data files).  Every number a bullet shows must appear, as written, in the page it
links to, and the link's anchor must be a heading of that page: a figure re-measured on
its page, or a page renamed, fails here until the README says the same.
"""

from __future__ import annotations

import re

from tests.fixtures import REPO

README = REPO / "README.md"
_LINK = re.compile(r"\]\((?P<path>docs/benchmarks/[a-z0-9-]+\.md)(?:#(?P<anchor>[a-z0-9-]+))?\)")
_NUMBER = re.compile(r"(?<![\d.,])\d[\d,]*(?:\.\d+)?(?![\d])")


def figure_bullets(text: str) -> list[str]:
    """The bullets of the README's **Measured** list, each as one line."""
    start = text.index("\n**Measured**")
    end = text.index("\n\n", text.index("\n* ", start))
    bullets = re.split(r"\n\* ", text[start:end])[1:]
    return [" ".join(b.split()) for b in bullets]


def numbers(text: str) -> set[str]:
    return {n.rstrip(",") for n in _NUMBER.findall(text)}


def slug(heading: str) -> str:
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def mismatches(bullet: str) -> list[str]:
    links = list(_LINK.finditer(bullet))
    if len(links) != 1:
        return [f"'{bullet[:60]}...': links {len(links)} benchmark pages, not one"]
    page_path = REPO / links[0]["path"]
    if not page_path.is_file():
        return [f"'{bullet[:60]}...': {links[0]['path']} does not exist"]
    page = page_path.read_text(encoding="utf-8")
    problems = []
    anchor = links[0]["anchor"]
    if anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.+)$", page, re.M)}:
        problems.append(f"{links[0]['path']}#{anchor}: no such heading")
    shown = numbers(_LINK.sub("]", bullet))
    for n in sorted(shown - numbers(page)):
        problems.append(f"{n} (in '{bullet[:60]}...') is not on {links[0]['path']}")
    return problems


def test_every_readme_figure_is_on_the_page_it_links_to():
    bullets = figure_bullets(README.read_text(encoding="utf-8"))
    assert 3 <= len(bullets) <= 6, f"the README's Measured list has {len(bullets)} figures: keep a few"
    problems = [p for b in bullets for p in mismatches(b)]
    assert not problems, "README.md's measured figures differ from the benchmark pages:\n  " + \
        "\n  ".join(problems)


def test_a_figure_that_is_not_on_its_page_is_caught():
    good = ("**Push.** 8 nodes in 36.7 s against 192.0 s by hand "
            "([push](docs/benchmarks/push.md)).")
    assert mismatches(good) == []
    assert mismatches(good.replace("36.7", "36.8")) == [
        "36.8 (in '**Push.** 8 nodes in 36.8 s against 192.0 s by hand ([push](...') "
        "is not on docs/benchmarks/push.md"]
    assert mismatches(good.replace("push.md", "push.md#no-such-part")) == [
        "docs/benchmarks/push.md#no-such-part: no such heading"]
    assert "links 0 benchmark pages" in mismatches("**Push.** 8 nodes in 36.7 s.")[0]
