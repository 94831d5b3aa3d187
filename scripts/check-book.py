#!/usr/bin/env python3
"""Checks the book (docs/) and the README without mdbook: every chapter in
SUMMARY.md exists and every file under docs/src is in it; every
{{#include path[:anchor]}} names a file, and an anchor that encloses
something (`ANCHOR: name` ... `ANCHOR_END: name`); every relative link in
the book, the README and the changelog points at a file that exists; the
README stays within 200 lines. Exits 1 naming each problem."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
src = root / "docs" / "src"
problems = []

summary = (src / "SUMMARY.md").read_text()
chapters = {src / m for m in re.findall(r"\]\(([^)]+\.md)\)", summary)}
for c in sorted(chapters):
    if not c.is_file():
        problems.append(f"SUMMARY.md lists {c.relative_to(root)}, which does not exist")
for md in sorted(src.rglob("*.md")):
    if md.name != "SUMMARY.md" and md not in chapters:
        problems.append(f"{md.relative_to(root)} is not in SUMMARY.md")

include = re.compile(r"\{\{#include ([^}:\s]+)(?::([A-Za-z0-9_-]+))?\s*\}\}")
link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
pages = sorted(src.rglob("*.md")) + [root / "README.md", root / "CHANGELOG.md"]
for md in pages:
    text = md.read_text()
    where = md.relative_to(root)
    for path, anchor in include.findall(text):
        target = (md.parent / path).resolve()
        if not target.is_file():
            problems.append(f"{where}: includes {path}, which does not exist")
            continue
        if anchor:
            body = target.read_text()
            start = re.search(rf"ANCHOR:\s*{anchor}\b", body)
            end = re.search(rf"ANCHOR_END:\s*{anchor}\b", body)
            if not start or not end or end.start() <= start.end():
                problems.append(f"{where}: {path} has no anchor {anchor!r} (ANCHOR / ANCHOR_END)")
            elif not body[start.end():end.start()].strip("/ \n"):
                problems.append(f"{where}: anchor {anchor!r} of {path} encloses nothing")
    for target in link.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        if not (md.parent / target).exists():
            problems.append(f"{where}: links to {target}, which does not exist")

# A page with Rust blocks that are not `ignore` must be a doctest in lib.rs.
lib = (root / "loader" / "src" / "lib.rs").read_text()
for md in sorted(src.rglob("*.md")):
    rel = md.relative_to(root).as_posix()
    compiled = re.search(r"^```rust(?!,ignore)", md.read_text(), re.M)
    if compiled and f'include_str!("../../{rel}")' not in lib:
        problems.append(f"{rel} has Rust blocks but is not a doctest in loader/src/lib.rs (book_doctests)")

readme_lines = len((root / "README.md").read_text().splitlines())
if readme_lines > 200:
    problems.append(f"README.md has {readme_lines} lines (at most 200)")

for p in problems:
    print(f"check-book: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-book: {len(chapters)} chapters, includes, anchors and links resolve; README {readme_lines} lines")
