#!/usr/bin/env python3
"""Flatten the HTML edition of The Debian Administrator's Handbook to plain
text in reading order (the order of index.html's table of contents).

    python3 html_to_text.py DIR > book.txt

Drops the page chrome (banner, title bar, prev/next navigation), scripts
and styles; keeps headings, paragraphs, lists and code as text."""
import html
import os
import re
import sys


def page_text(path):
    with open(path, encoding="utf-8") as f:
        s = f.read()
    m = re.search(r"<body[^>]*>(.*)</body>", s, re.S)
    s = m.group(1) if m else s
    s = re.sub(r"<(script|style)[^>]*>.*?</\1>", "", s, flags=re.S)
    s = re.sub(r'<div id="banner">.*?</div>', "", s, flags=re.S)
    s = re.sub(r'<p id="title">.*?</p>', "", s, flags=re.S)
    s = re.sub(r'<ul class="docnav.*?</ul>', "", s, flags=re.S)
    s = re.sub(r"<(br|/p|/div|/h\d|/li|/pre|/tr)[^>]*>", "\n", s)
    s = re.sub(r"<[^>]+>", "", s)
    s = html.unescape(s)
    s = re.sub(r"[ \t\r\f\v]+", " ", s)
    s = re.sub(r" *\n *", "\n", s)
    s = re.sub(r"\n{3,}", "\n\n", s)
    return s.strip()


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "index.html"), encoding="utf-8") as f:
        index = f.read()
    pages = []
    for m in re.finditer(r'href="([^"#/]+\.html)', index):
        if m.group(1) not in pages:
            pages.append(m.group(1))
    out = []
    for p in pages:
        if p == "index.html" or not os.path.exists(os.path.join(root, p)):
            continue
        t = page_text(os.path.join(root, p))
        if t:
            out.append(t)
    if not out:
        sys.exit("html_to_text: no pages found under " + root)
    sys.stdout.write("\n\n".join(out) + "\n")


if __name__ == "__main__":
    main()
