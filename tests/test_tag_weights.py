"""Tag weights: ``.dlm/training.yaml`` ``metadata`` tags source rows, ``weights`` repeats them (as DLM does)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.corpus.assemble import Corpus, load_corpus
from dlmstore.corpus.pass_result import TokenizedRows
from dlmstore.corpus.weights import RowWeights, draw, repeat_rows, row_weights, weighed_split
from dlmstore.document.parser import parse_document

from .helpers import write_doc

SOURCES = "training:\n  seed: 7\n  sources:\n    - path: src\n      include: ['**/*.txt']\n"


def weighted_doc(tmp_path: Path, files: dict[str, str], frontmatter: str = SOURCES) -> Path:
    for rel, text in files.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text, encoding="utf-8")
    return write_doc(tmp_path / "doc.dlm", "Body prose.\n", frontmatter)


def weights_of(doc: Path) -> tuple[Corpus, RowWeights | None]:
    corpus = load_corpus(parse_document(doc))
    return corpus, row_weights(corpus)


def key_of(corpus: Corpus, name: str) -> str:
    return next(row.row_key for row in corpus.rows() if f"# source: {name}\n" in str(row.data.get("text")))


def test_the_nearest_training_yaml_wins_per_metadata_key_and_weights_merge_deepest_last(
    tmp_path: Path,
) -> None:
    doc = weighted_doc(
        tmp_path,
        {
            ".dlm/training.yaml": "metadata: {lang: en, kind: doc}\nweights: {lang: {en: 2, fr: 3}}\n",
            "a.txt": "alpha",
            "sub/.dlm/training.yaml": "metadata: {lang: fr}\nweights: {lang: {fr: 4}}\n",
            "sub/b.txt": "beta",
        },
    )
    corpus, weights = weights_of(doc)
    assert weights is not None
    assert weights.tags[key_of(corpus, "a.txt")] == {"lang": "en", "kind": "doc"}
    assert weights.tags[key_of(corpus, "sub/b.txt")] == {"lang": "fr", "kind": "doc"}
    assert weights.weights == {"lang": {"en": 2.0, "fr": 4.0}}
    assert weights.weight(key_of(corpus, "sub/b.txt")) == 4.0
    body = next(row.row_key for row in corpus.rows() if "Body prose" in str(row.data.get("text")))
    assert weights.weight(body) == 1.0  # in-body rows carry no tags


def test_tags_multiply_and_an_integer_weight_is_that_many_copies(tmp_path: Path) -> None:
    doc = weighted_doc(
        tmp_path,
        {
            ".dlm/training.yaml": "metadata: {a: x, b: y}\nweights: {a: {x: 1.5}, b: {y: 2}}\n",
            "one.txt": "one",
        },
    )
    corpus, weights = weights_of(doc)
    assert weights is not None
    key = key_of(corpus, "one.txt")
    assert weights.weight(key) == 3.0
    assert weights.copies(key, seed=0) == 3 == weights.copies(key, seed=99)


def test_a_weight_of_zero_drops_the_row_and_no_weights_means_no_weighting(tmp_path: Path) -> None:
    doc = weighted_doc(
        tmp_path, {".dlm/training.yaml": "metadata: {gen: 'yes'}\nweights: {gen: {'yes': 0}}\n", "g.txt": "g"}
    )
    corpus, weights = weights_of(doc)
    assert weights is not None and weights.copies(key_of(corpus, "g.txt"), seed=7) == 0
    plain = weighted_doc(tmp_path / "plain", {".dlm/training.yaml": "metadata: {gen: 'yes'}\n", "g.txt": "g"})
    assert weights_of(plain)[1] is None
    one_file = "training:\n  sources:\n    - path: src/g.txt\n"  # DLM reads no .dlm/ folder for it
    assert (
        weights_of(
            weighted_doc(
                tmp_path / "one",
                {".dlm/training.yaml": "weights: {gen: {'yes': 0}}\n", "g.txt": "g"},
                one_file,
            )
        )[1]
        is None
    )


def test_the_fractional_draw_is_fixed_by_seed_and_row_and_changes_with_the_seed(tmp_path: Path) -> None:
    files = {".dlm/training.yaml": "metadata: {t: h}\nweights: {t: {h: 0.5}}\n"}
    files.update({f"f{i:02d}.txt": f"file {i}" for i in range(40)})
    corpus, weights = weights_of(weighted_doc(tmp_path, files))
    assert weights is not None
    keys = [row.row_key for row in corpus.rows()][1:]  # the source rows
    first = [weights.copies(key, seed=7) for key in keys]
    assert first == [weights.copies(key, seed=7) for key in keys]
    assert set(first) == {0, 1}
    assert first != [weights.copies(key, seed=8) for key in keys]
    # The draw is sha256 of "seed:row_key": the same number on every machine.
    key = "sha256:" + "0" * 64
    assert draw(7, key) == int(hashlib.sha256(f"7:{key}".encode()).hexdigest()[:16], 16) / 2**64
    assert draw(7, key) == 0.12340288950441786


def test_repeated_rows_share_their_token_ids_in_corpus_order(tmp_path: Path) -> None:
    doc = weighted_doc(
        tmp_path,
        {".dlm/training.yaml": "metadata: {t: h}\nweights: {t: {h: 2}}\n", "a.txt": "a", "b.txt": "b"},
    )
    corpus, weights = weights_of(doc)
    assert weights is not None
    keys = tuple(row.row_key for row in corpus.rows())
    rows = TokenizedRows(
        keys, ("text",) * 3, np.array([0, 1, 3, 6]), np.array([9, 1, 2, 3, 4, 5], dtype=np.uint16)
    )
    repeated = repeat_rows(rows, weights, seed=7)
    assert repeated.row_keys == (keys[0], keys[1], keys[1], keys[2], keys[2])
    assert [repeated.input_ids(i).tolist() for i in range(5)] == [[9], [1, 2], [1, 2], [3, 4, 5], [3, 4, 5]]


def test_held_out_rows_are_never_repeated_and_a_weight_of_zero_is_not_scored_either(tmp_path: Path) -> None:
    doc = weighted_doc(
        tmp_path,
        {
            ".dlm/training.yaml": "metadata: {t: h}\nweights: {t: {h: 2, z: 0}}\n",
            "a.txt": "a",
            "z/.dlm/training.yaml": "metadata: {t: z}\n",
            "z/b.txt": "b",
        },
    )
    corpus = load_corpus(parse_document(doc))
    body, a, b = (row.row_key for row in corpus.rows())
    ids = np.array([1, 2, 3], dtype=np.uint16)
    train = TokenizedRows((body,), ("text",), np.array([0, 1]), ids[:1])
    val = TokenizedRows((a, b), ("text",) * 2, np.array([0, 1, 2]), ids[1:])
    weighed_train, weighed_val = weighed_split(corpus, train, val, seed=7)
    assert weighed_train is train  # the body row: untagged, once
    assert weighed_val.row_keys == (a,)  # a.txt held out once, not twice; b.txt (weight 0) gone


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("weights: {t: {h: -1}}\n", "1: weights.t.h: must be 0 or more, not -1.0"),
        (
            "weights: {t: {h: many}}\n",
            "1: weights.t.h: input should be a valid number, unable to parse string as a number (got 'many')",
        ),
        ("metadata: {t: [1]}\n", "1: metadata.t: input should be a valid string (got [1])"),
    ],
)
def test_bad_weights_and_metadata_are_refused_in_one_line_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    from dlmstore.cli.main import cli

    doc = weighted_doc(tmp_path, {".dlm/training.yaml": text, "a.txt": "a"})
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    root = (tmp_path / "src").resolve()
    assert (
        result.stderr.splitlines()[0] == f"error: training.sources 'src': {root}/.dlm/training.yaml:{message}"
    )


def test_dlm_show_says_what_each_weight_added_or_dropped(tmp_path: Path) -> None:
    from dlmstore.cli.main import cli

    doc = weighted_doc(
        tmp_path,
        {
            ".dlm/training.yaml": "metadata: {k: doc}\nweights: {k: {doc: 3, gen: 0}}\n",
            "a.txt": "a",
            "b.txt": "b",
            "gen/.dlm/training.yaml": "metadata: {k: gen}\n",
            "gen/c.txt": "c",
        },
    )
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("weight:")]
    assert lines == [
        "weight:   k=doc x3: 2 rows, 4 copies added",
        "weight:   k=gen x0: 1 row, 1 row dropped",
    ]
    shown = json.loads(CliRunner().invoke(cli, ["show", str(doc), "--json"]).stdout)
    assert shown["tag_weights"] == [
        {"tag": "k", "value": "doc", "weight": 3.0, "rows": 2, "added": 4, "dropped": 0},
        {"tag": "k", "value": "gen", "weight": 0.0, "rows": 1, "added": 0, "dropped": 1},
    ]


@pytest.mark.slow
def test_a_weighted_tree_trains_its_repeated_rows_tokenized_once_and_the_same_bytes_twice(
    tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    front = (
        f"base_model: {tiny_base}\n"
        "training:\n  seed: 7\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n"
        "  preference:\n    enabled: false\n"
        "  sources:\n    - path: src\n      include: ['**/*.txt']\n"
    )
    files = {
        ".dlm/training.yaml": "metadata: {k: doc}\nweights: {k: {doc: 3, gen: 0}}\n",
        "a.txt": "alpha beta gamma",
        "b.txt": "delta epsilon",
        "gen/.dlm/training.yaml": "metadata: {k: gen}\n",
        "gen/c.txt": "zeta eta theta",
    }
    hashes = []
    for home in ("one", "two"):
        monkeypatch.setenv("DLM_HOME", str(tmp_path / home))
        doc = weighted_doc(tmp_path / f"doc-{home}", files, front)
        result = train_document(str(doc))
        hashes.append(result.adapter_sha256)
        # seed 7 holds the body row out for validation; a.txt and b.txt train three times each,
        # gen/c.txt (weight 0) not at all
        assert (result.rows_trained, result.val_rows) == (6, 1)
        assert (
            result.tokenization.cache_misses == 4
        )  # each distinct row tokenized once, however often it trains
    assert hashes[0] == hashes[1]


@pytest.mark.slow
def test_weights_that_drop_every_row_that_would_train_are_one_error(tmp_path: Path, tiny_base: Path) -> None:
    from dlmstore.cli.main import cli

    front = f"base_model: {tiny_base}\ntraining:\n  sources:\n    - path: src\n"
    make = {".dlm/training.yaml": "metadata: {k: gen}\nweights: {k: {gen: 0}}\n", "a.txt": "a", "b.txt": "b"}
    for rel, text in make.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text, encoding="utf-8")
    doc = write_doc(tmp_path / "doc.dlm", "", front)
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    assert f"error: {doc}: the weights of .dlm/training.yaml drop every row that would train" in result.stderr
