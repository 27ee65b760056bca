"""Copy a study's report into docs/: ``python docs/refresh_study.py STUDY_DIR``.

``docs/study.md`` is ``STUDY_DIR/study.md`` with its figures copied to ``docs/study/`` (links rewritten), the
study folder named as the default command names it (``outputs/study/<task>/<model>/finetuned``) and a line under
the title that points to the README's comparison of the verdicts with the papers.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
COMPARED = ("(The default study's report, copied here by `docs/refresh_study.py`. The README sets each verdict beside "
            "the paper's numbers: [What the default study finds]"
            "(../README.md#what-the-default-study-finds-claim-by-claim).)")


def main(study_dir: str) -> None:
    folder = Path(study_dir)
    summary = json.loads((folder / "study.json").read_text())
    default = f"outputs/study/{summary['task']}/{summary['model']}/finetuned"
    figures = DOCS / "study"
    shutil.rmtree(figures, ignore_errors=True)
    figures.mkdir()

    def copy(match: re.Match) -> str:
        source = match.group(2)
        name = source.replace("/", "_")
        shutil.copyfile(folder / source, figures / name)
        return f"![{match.group(1)}](study/{name})"

    text = re.sub(r"!\[([^]]*)\]\(([^)]+\.png)\)", copy, (folder / "study.md").read_text())
    title, rest = text.split("\n", 1)
    text = f"{title}\n\n{COMPARED}\n{rest}"
    (DOCS / "study.md").write_text(text.replace(str(folder.absolute()), default).replace(str(folder), default))


if __name__ == "__main__":
    main(sys.argv[1])
