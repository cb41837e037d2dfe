"""Citations of NNTrainer's C++ resolve inside the repository.

The C++ facts the code relies on are in docs/nntrainer.md; code and docs cite a section by its
heading, ``docs/nntrainer.md, "The step buffer"`` (several: ``docs/nntrainer.md, "A", "B"``),
and markdown links to its anchors. No file cites the labels of a document outside the
repository (section signs, "porting spec" numbers, gotcha numbers such as ``G12``), and every
cited heading or anchor exists."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "nntrainer.md")
SKIP_DIRS = {"__pycache__", "fixtures", "build"}

OLD_LABEL = re.compile("\u00a7" r"|(?i:porting spec|\bspec\s+(?:G\d|\d)|\bgotcha)|\bG\d{1,2}\b")
"""A section sign, "porting spec", "spec 7.4", "spec G13", a gotcha number ("G4", "gotcha")."""
CITATION = re.compile(r'nntrainer\.md,\s+((?:"[^"]+"(?:,\s*|\s+and\s+)?)+)')
"""``docs/nntrainer.md, "A section"``, or several: ``docs/nntrainer.md, "A", "B" and "C"``."""
LINK = re.compile(r"nntrainer\.md#([\w-]+)|\]\(#([\w-]+)\)")


def source_files():
    """Every .py and .md file of the repository, this file excepted (it spells the labels)."""
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in SKIP_DIRS]
        for f in files:
            path = os.path.join(d, f)
            if f.endswith((".py", ".md")) and path != os.path.abspath(__file__):
                yield path


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def headings():
    """The headings of docs/nntrainer.md (outside code blocks), in order."""
    out, fenced = [], False
    for line in read(DOC).splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,4} ", line):
            out.append(line.lstrip("#").strip())
    return out


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")


def unwrapped(text):
    """``text`` with line breaks (and a comment's ``#`` after one) read as single spaces."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


@pytest.mark.slow
def test_no_citation_of_a_document_outside_the_repository():
    found = [f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}"
             for path in source_files()
             for n, line in enumerate(read(path).splitlines(), 1) if OLD_LABEL.search(line)]
    assert found == []


def test_every_cited_section_exists():
    names = headings()
    assert len(names) == len(set(names)), "headings must be unique: they are the citations"
    anchors = {anchor(h) for h in names}
    cited, linked, missing = set(), set(), []
    for path in source_files():
        text = unwrapped(read(path))
        where = os.path.relpath(path, ROOT)
        for name in (n for names_ in CITATION.findall(text) for n in re.findall('"([^"]+)"',
                                                                                 names_)):
            cited.add(name)
            if name not in names:
                missing.append(f'{where}: "{name}"')
        if path == DOC or "nntrainer.md#" in text:
            for ref in LINK.findall(text):
                target = ref[0] or ref[1]
                if path != DOC and not ref[0]:
                    continue  # another page's own anchors
                linked.add(target)
                if target not in anchors:
                    missing.append(f"{where}: #{target}")
    assert missing == []
    assert len(cited) >= 20 and len(linked) >= 10  # the code does cite the page
