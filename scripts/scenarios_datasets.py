"""`dlm data`: build-all offline on local files, and a build on a local Ray; the built-in tokenizer.

docs/datasets.md quotes these sessions. No model is trained; the tokenizer
is the built-in SmolLM2's (converted from its GGUF file once: seconds), and
the Ray build starts a local Ray (seconds more), so the tests hold them by
the inputs' hash. The local files are written by the shell steps shown.
"""

from __future__ import annotations

import json

from session_steps import shell  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

_WEB = "\n".join(
    json.dumps({"text": f"Page {i}. {text}"})
    for i, text in enumerate(
        (
            "Compost needs air, water and a mix of green and brown material.",
            "Tomatoes grow best against a warm wall, watered at the root.",
            "Garlic is planted in autumn and lifted when the leaves yellow.",
            "A cold frame lets seedlings harden off before they go out.",
            "Leeks are earthed up to blanch their stems.",
            "Peas climb netting; pick them young and they keep cropping.",
        )
    )
)

_DOLLY = "\n".join(
    json.dumps({"instruction": q, "context": "", "response": a, "category": "open_qa"})
    for q, a in (
        ("When is garlic planted?", "In autumn."),
        ("What does compost need?", "Air, water and a mix of green and brown material."),
        ("Why earth up leeks?", "To blanch their stems."),
        ("How are seedlings hardened off?", "In a cold frame, before they go out."),
        ("Where do tomatoes grow best?", "Against a warm wall."),
        ("How do peas keep cropping?", "Pick them young."),
        ("What do peas climb?", "Netting."),
        ("When is garlic lifted?", "When the leaves yellow."),
        ("How are tomatoes watered?", "At the root."),
        ("What is a cold frame for?", "Hardening off seedlings."),
    )
)

DATASETS = Scenario(
    name="datasets",
    model="real",
    shown={"work": "/home/me", "home": "/home/me/.local/share/dlm"},
    files={
        "fw.jsonl": _WEB + "\n",
        "dolly.jsonl": _DOLLY + "\n",
        **{
            f"notes/{name}.md": f"# {name}\n\n{text}\n"
            for name, text in (
                ("beds", "The beds are watered at dawn."),
                ("compost", "The compost is turned every second week."),
                ("hedge", "The hedge is cut in August."),
            )
        },
    },  # fmt: skip
    steps=(
        Step(
            "build-all",
            (
                "dlm data build-all --cache-dir cache --local fineweb-edu=fw.jsonl --local roam=notes \\",
                "    --local dolly-15k=dolly.jsonl --fineweb-train-tokens 100 --fineweb-val-tokens 20",
            ),
            (
                "data",
                "build-all",
                "--cache-dir",
                "cache",
                "--local",
                "fineweb-edu=fw.jsonl",
                "--local",
                "roam=notes",
                "--local",
                "dolly-15k=dolly.jsonl",
                "--fineweb-train-tokens",
                "100",
                "--fineweb-val-tokens",
                "20",
            ),
            status=1,
        ),  # fmt: skip
        shell(
            "build-all",
            'sqlite3 cache/store.db "select name, kind, split, token_files, tokens, bytes from dataset_split_totals"',
        ),
        Step(
            "offline",
            (
                "HF_HUB_OFFLINE=1 dlm data build-all --cache-dir cache2 --local dolly-15k=dolly.jsonl --only fineweb-edu --only dolly-15k",
            ),
            (
                "data",
                "build-all",
                "--cache-dir",
                "cache2",
                "--local",
                "dolly-15k=dolly.jsonl",
                "--only",
                "fineweb-edu",
                "--only",
                "dolly-15k",
            ),
            status=1,
        ),  # fmt: skip
        shell(
            "ray",
            'seq 3000 | sed \'s/.*/{"text": "Document &: the beds are watered at dawn, the compost turned."}/\' > docs.jsonl',
        ),
        Step(
            "ray",
            ("dlm data build pretrain --from docs.jsonl --out web --engine ray --workers 2",),
            (
                "data",
                "build",
                "pretrain",
                "--from",
                "docs.jsonl",
                "--out",
                "web",
                "--engine",
                "ray",
                "--workers",
                "2",
            ),
            joined=True,
        ),  # fmt: skip
    ),
)
