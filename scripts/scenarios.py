"""Every scenario behind the sessions README.md and docs/*.md quote, by name (see scripts/sessions.py).

Each :class:`~sessions.Scenario` is the commands of one story, run in order
in a scratch folder and a fresh home; its steps name the quoted blocks their
output goes to, ``<scenario>/<block>`` in the docs' markers.
"""

from __future__ import annotations

from scenarios_bench import EXPORT_BENCH, PREFIX  # scripts/ is on sys.path when this runs
from scenarios_datasets import DATASETS
from scenarios_export import EXPORT
from scenarios_format import FORMAT, REFUSALS
from scenarios_garden import GARDEN, RESUME
from scenarios_home import CACHE, DEDUP, STORES
from scenarios_lock import LOCK
from scenarios_named import NAMED
from scenarios_pack import PACK
from scenarios_replay import REPLAY
from scenarios_scale import SCALE
from scenarios_templates import TEMPLATES
from scenarios_tour import ERRORS, TOUR
from sessions import Scenario

SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        TOUR,
        ERRORS,
        GARDEN,
        RESUME,
        STORES,
        CACHE,
        DEDUP,
        LOCK,
        FORMAT,
        REFUSALS,
        EXPORT,
        DATASETS,
        PREFIX,
        EXPORT_BENCH,
        REPLAY,
        PACK,
        TEMPLATES,
        NAMED,
        SCALE,
    )
}
