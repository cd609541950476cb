"""Replace the generated tables of the reference pages with what
``python -m cxlmpi --info --markdown`` prints now (run after changing a
setting in cxlmpi.config or an option in cxlmpi.launch.command_line).

    python tools/regen_tables.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"settings": "docs/reference/settings.md", "options": "docs/reference/command-line.md"}


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "cxlmpi", "--info", "--markdown"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    for name, page in PAGES.items():
        block = re.search(rf"<!-- {name}:.*?<!-- end of {name} -->", out, re.S)
        if block is None:
            sys.exit(f"regen_tables: no {name} table in the generator's output")
        path = ROOT / page
        text = path.read_text()
        table = block.group(0)
        new = re.sub(rf"<!-- {name}:.*?<!-- end of {name} -->", lambda _m, t=table: t,
                     text, count=1, flags=re.S)
        if new != text:
            path.write_text(new)
            print(f"regen_tables: {page}: {name} table regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
