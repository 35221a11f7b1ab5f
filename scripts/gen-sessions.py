"""Regenerate the terminal sessions quoted in README.md and docs/*.md (see scripts/sessions.py).

python scripts/gen-sessions.py            # every scenario (the tour trains SmolLM2-135M: minutes)
python scripts/gen-sessions.py errors     # only the scenarios named
"""

from __future__ import annotations

import sys

from scenarios import SCENARIOS  # scripts/ is on sys.path when this file runs
from sessions import regenerate

regenerate(SCENARIOS, sys.argv[1:] or None)
