"""Generates python/docs/api.html, the package's API reference, from its docstrings (pdoc).

    .venv/bin/python python/docs/gen_api.py           # rewrite api.html
    .venv/bin/python python/docs/gen_api.py --check   # exit 1 if api.html is not current

It documents the installed ``tidegate`` package (``python/run-tests.sh`` installs the working
tree first); tests/test_docs.py runs the check.
"""

from __future__ import annotations

import os
import sys

import pdoc
import pdoc.render

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "api.html")


def render() -> str:
    os.chdir(HERE)  # document the installed package, not a `tidegate` directory in the cwd
    pdoc.render.configure(docformat="restructuredtext", search=False, show_source=False, footer_text="tidegate")
    return pdoc.pdoc("tidegate")


def main() -> int:
    html = render()
    if "--check" in sys.argv:
        with open(TARGET, encoding="utf-8") as f:
            if f.read() != html:
                print(f"{TARGET} is not current: run python/docs/gen_api.py", file=sys.stderr)
                return 1
        return 0
    with open(TARGET, "w", encoding="utf-8") as f:
        f.write(html)
    print(f"wrote {TARGET} ({len(html)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
