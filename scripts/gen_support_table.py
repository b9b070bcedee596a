"""Print, check or rewrite docs/ops.md (supported ops per backend) from the kernel registry.

    python scripts/gen_support_table.py            # print the generated section
    python scripts/gen_support_table.py --check    # exit 1 when docs/ops.md differs from the registry
    python scripts/gen_support_table.py --write    # rewrite the section of docs/ops.md in place

Only the text between the support-table markers of docs/ops.md is touched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ggmlpy.testops.support_table import readme_section, replace_readme_section, support_section


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="compare with docs/ops.md")
    g.add_argument("--write", action="store_true", help="rewrite the section of docs/ops.md")
    p.add_argument("--readme", type=Path, default=ROOT / "docs" / "ops.md")
    args = p.parse_args()
    section = support_section()
    if not (args.check or args.write):
        sys.stdout.write(section)
        return 0
    text = args.readme.read_text(encoding="utf-8")
    if args.check:
        same = readme_section(text) == section
        print("docs/ops.md support table is up to date" if same else
              "docs/ops.md support table differs from the registry: run with --write")
        return 0 if same else 1
    args.readme.write_text(replace_readme_section(text, section), encoding="utf-8")
    print(f"wrote the support table of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
