"""README.md is the operator's first page: at most 200 lines (the detail lives in docs/*.md, one
short paragraph and a link each), and every link of its own leads somewhere: a file of the
repository and, where it names one, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MOST_LINES = 200

LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {anchor(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def test_the_readme_is_at_most_200_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MOST_LINES, (
        f"README.md has {lines} lines: move detail into docs/*.md (a short paragraph and a link stay)"
    )


def test_every_link_of_the_readme_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # (another site's)
        name, _, fragment = target.partition("#")
        path = ROOT / name if name else README
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_the_anchors_are_made_as_github_makes_them() -> None:
    assert anchor(" The console: `/` on the metrics port") == "the-console--on-the-metrics-port"
    assert anchor("Deploying: `deploy/`") == "deploying-deploy"
