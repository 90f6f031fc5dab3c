#!/usr/bin/env python3
"""Checks the built book: every relative href and src of every page leads to a
file of the book, and every #anchor to an id on its page. Exits 1 naming each
broken link. Links to other sites are not followed (the build is offline)."""
import html.parser
import pathlib
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value is not None:
                self.links.append(value)


def main(root):
    root = pathlib.Path(root).resolve()
    pages = {}
    for path in root.rglob("*.html"):
        if path.name == "404.html":
            continue  # its links are absolute, from the site's root
        page = Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path] = page
    if not pages:
        sys.exit(f"no pages under {root}")
    broken = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or url.netloc or link.startswith("javascript:"):
                continue
            target = (path.parent / urllib.parse.unquote(url.path)).resolve() if url.path else path
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(root)}: {link}"
            if not target.exists():
                broken.append(f"{where}: no such file")
            elif url.fragment and target in pages and url.fragment not in pages[target].ids:
                broken.append(f"{where}: no such anchor")
    for b in broken:
        print(b, file=sys.stderr)
    if broken:
        sys.exit(f"{len(broken)} broken links in the book")
    print(f"book: {len(pages)} pages, every relative link and anchor leads somewhere")


main(sys.argv[1] if len(sys.argv) > 1 else "target/book")
