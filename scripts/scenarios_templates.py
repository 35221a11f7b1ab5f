"""The template gallery: listed, one template written as a new document, a name refused.

docs/templates.md quotes these sessions. No model runs and torch is never
imported (`dlm show` reads the base's name only), so the docs test reruns
them every time and compares.
"""

from __future__ import annotations

from sessions import Scenario, Step  # scripts/ is on sys.path when this runs

TEMPLATES = Scenario(
    name="templates",
    inputs=("dlmstore/templates/gallery/*",),
    rerun=True,
    steps=(
        Step("list", ("dlm templates list",), ("templates", "list")),
        Step(
            "init",
            ("dlm init tutor.dlm --template coding-tutor",),
            ("init", "tutor.dlm", "--template", "coding-tutor"),
        ),
        Step("init", ("dlm show tutor.dlm",), ("show", "tutor.dlm")),
        Step(
            "refused",
            ("dlm init tutor.dlm --template coding-tutor   # the file is there now",),
            ("init", "tutor.dlm", "--template", "coding-tutor"),
            status=1,
        ),
        Step(
            "refused",
            ("dlm init notes.dlm --template tutor",),
            ("init", "notes.dlm", "--template", "tutor"),
            status=1,
        ),
    ),
)
