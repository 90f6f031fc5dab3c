#!/usr/bin/env bash
# Builds the book (docs/, mdbook) into target/book and checks every
# relative link and anchor of the built pages. scripts/test.sh runs it.
#
#   scripts/book.sh           build and check
set -euo pipefail
cd "$(dirname "$0")/.."
mdbook=$(scripts/ensure-mdbook.sh)
rm -rf target/book
"$mdbook" build docs >/dev/null
python3 scripts/check-links.py target/book
