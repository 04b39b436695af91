#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown: the file it names exists, and the
anchor (`#section`) is a heading of that file, as GitHub renders it. Links to other sites are
not fetched (CI has no internet); they are listed with --external.

Usage: check_links.py [--external] [ROOT]   (exit 1 on a broken link, each printed)

Hand-written rather than a link checker such as lychee: what is checked is offline and small
(files and GitHub's heading anchors), and a 60-line script costs CI nothing to build.
"""

import os
import re
import sys

SKIP_DIRS = {".git", "target", "node_modules", "dist"}
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".md"):
                yield os.path.join(dirpath, name)


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if fence is None:
                fence = marker
            elif marker == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading: rendered text, lower-cased, punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        for _, line in prose_lines(path):
            m = HEADING.match(line.rstrip("\n"))
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    external = "--external" in sys.argv
    root = os.path.abspath(args[0] if args else ".")
    broken, checked = [], 0
    for path in markdown_files(root):
        for number, line in prose_lines(path):
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                where = f"{os.path.relpath(path, root)}:{number}"
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    if external:
                        print(f"{where}: external {target}")
                    continue
                checked += 1
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    broken.append(f"{where}: {target}: no such file")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    broken.append(f"{where}: {target}: no heading #{anchor} in {os.path.relpath(dest, root)}")
    for b in broken:
        print(b)
    print(f"check_links: {checked} relative links, {len(broken)} broken", file=sys.stderr)
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
