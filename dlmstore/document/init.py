"""``dlm init``: write a new .dlm document with a fresh ULID and its store.

The new document is a working example of every feature, with the optional
parts commented out, so a newcomer learns the format by reading it. It is
written atomically and never over an existing file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlmstore.bases import resolve_base
from dlmstore.document.versions import CURRENT_DLM_VERSION
from dlmstore.errors import DocumentError
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.database import open_store
from dlmstore.store.runs import record_document_path
from dlmstore.ulid import new_ulid

TEMPLATE = """\
---
dlm_id: {dlm_id}
dlm_version: {dlm_version}
base_model: {base_model}
# system_prompt: You are a concise assistant.   # used by `dlm prompt`, not trained
training:
  sequence_len: 2048
  seed: 42
  # lora_r: 8
  # learning_rate: 2e-4
  # num_epochs: 3
  # max_steps: 20               # dlmstore extension: stop early
  # report_to: tensorboard      # dlmstore extension: also log to TensorBoard (pip install 'dlmstore[tensorboard]')
  # sources:                    # train on a folder of files: one prose section per file
  #   - path: ./notes           # relative to this file; ~ expands
  #     include: ["**/*.md"]
  #     exclude: ["drafts/**"]
  #     max_bytes_per_file: 200000
  # sources_policy: strict      # refuse paths that resolve outside this folder
  # cache:
  #   max_bytes: 2147483648     # 2 GiB for the tokenized cache
---
# Notes for my assistant

Text before any fence is prose: it is trained as plain text.

::instruction::
### Q
What is a .dlm file?
### A
Markdown with YAML frontmatter holding prose, instruction pairs and
preference triples that dlm turns into training rows.

### Q
How do I see what dlm will train on?
### A
Run `dlm show` on the file.

::preference::
### Prompt
Summarise dlmstore in one sentence.
### Chosen
A local-first store for LLM training data with cached tokenization.
### Rejected
It is a database.
"""


@dataclass(frozen=True)
class InitResult:
    """What ``dlm init`` created.

    Attributes:
        path: The document written (as given).
        dlm_id: Its fresh document id (a ULID).
        base_model: The ``base_model`` written into its frontmatter.
        store_path: The store folder created for it.
        template: The gallery template it was written from (``--template``), or null.
    """

    path: str
    dlm_id: str
    base_model: str
    store_path: str
    template: str | None = None


def init_document(path: str | Path, *, base_model: str = "smollm2-135m") -> InitResult:
    """Write a new .dlm at ``path`` and create (migrate) its store.

    Raises:
        DocumentError: ``path`` exists or cannot be written.
        BaseModelError: ``base_model`` is not an accepted name.
    """
    dlm_id = new_ulid()
    text = TEMPLATE.format(dlm_id=dlm_id, dlm_version=CURRENT_DLM_VERSION, base_model=yaml_scalar(base_model))
    return write_new_document(path, text, dlm_id=dlm_id, base_model=base_model)


def write_new_document(
    path: str | Path, text: str, *, dlm_id: str, base_model: str, template: str | None = None
) -> InitResult:
    """Write ``text`` as a new document at ``path`` and create (migrate) the store of ``dlm_id``.

    ``base_model`` is resolved first, so a name dlmstore cannot resolve
    writes nothing. The file is written atomically and never over an
    existing one (the one rule of ``dlm init``, with or without a template).

    Raises:
        DocumentError: ``path`` exists, its folder does not, or it cannot be written.
        BaseModelError: ``base_model`` is not an accepted name.
    """
    target = Path(path).expanduser().absolute()
    resolve_base(base_model, relative_to=target.parent)
    if not target.parent.is_dir():
        raise DocumentError(path, "directory does not exist", hint=f"mkdir -p {target.parent}")
    try:
        write_bytes_atomic(target, text.encode("utf-8"), overwrite=False)
    except FileExistsError:
        raise DocumentError(
            path,
            "already exists; dlm init never overwrites a document",
            hint="pick another path, or edit the existing file",
        ) from None
    except OSError as exc:
        raise DocumentError(path, f"cannot write: {exc.strerror or exc}") from None
    with open_store(dlm_id) as store:
        record_document_path(store, target)  # so `dlm stores gc` knows the document before any run
    return InitResult(str(target), dlm_id, base_model, str(store.path), template)


def yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar: as written when plain, else quoted (as JSON)."""
    import json

    # Plain names stay plain; anything YAML could misread is quoted as JSON
    # (a JSON string is a valid YAML double-quoted scalar).
    safe = value.replace("-", "").replace("_", "").replace("/", "").replace(".", "")
    return value if safe.isalnum() else json.dumps(value)
