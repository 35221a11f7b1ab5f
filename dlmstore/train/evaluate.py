"""``dlm eval``: the val split and the probes against a stored adapter, the base, or two side by side.

The same evaluation ``dlm train`` runs after each phase
(``dlmstore.train.loops.validation.after_phase``), on demand and recorded
as a run of its own (``runs.command = 'eval'``, rows in ``evaluations``
and ``probe_results`` with phase ``eval``):

1. the document is resolved as ``dlm train`` resolves it, and its rows go
   through the same tokenize pass (the cache, so a trained document's val
   rows are all hits: nothing is tokenized again);
2. the val split is the training's (``dlmstore.eval.split``: the row keys
   and the seed decide it), with the token datasets' ``val`` splits, and
   the probes are the training's (``dlmstore.eval.probes``);
3. the base is loaded once, and each adapter asked for is checked against
   the sha256 recorded when it was registered, then loaded onto it by
   peft; the base is the same model with its adapters disabled;
4. each model is evaluated (the val loss, each probe's greedy answer and
   scores) and everything is recorded in one transaction.

Retention is measured as ``dlm train`` measures it after each phase: the
``### Q !probe`` pairs of earlier versions and the rows of the frozen
retention slice that the document no longer holds (the replay history's,
:func:`dlmstore.replay.run_plan.retention`) are asked and evaluated beside the
current ones, for each model. With ``--against vM`` the first adapter's
retention loss is compared with vM's (``retention_delta``).

What is evaluated: ``--adapter vN`` (default: the newest adapter) or
``--base``, compared with ``--against vM``, or else with the base (nothing
when the base is the one asked for). Nothing is written to the adapters:
their bytes are read, and checked, only.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.eval.results import EvalReport
    from dlmstore.store.database import Store
    from dlmstore.train.adapters import AdapterVersion
    from dlmstore.train.data.replay_rows import Retention


_DAMAGED_HINT = "train again (dlm train) or evaluate another version with --adapter"
_NOTHING_TRAINED = "run `dlm train {path}` first, or `dlm eval {path} --base` to evaluate the base model"


def evaluate_document(
    path: str,
    *,
    adapter: int | None = None,
    base: bool = False,
    against: int | None = None,
    no_cache: bool = False,
    name: str | None = None,
) -> EvalReport:
    """Evaluate a stored adapter (or the base) of the document at ``path`` on its val split and probes.

    Args:
        path: the .dlm document.
        adapter: the adapter version to evaluate (``--adapter``); the newest when None.
        base: evaluate the base model instead (``--base``).
        against: the adapter version to compare with (``--against``); the base when None.
        no_cache: tokenize every row, neither reading nor writing the cache.
        name: the named adapter (``training.adapters``) whose versions, val split and probes are
            evaluated; a multi-adapter document needs it, unless ``adapter`` names a version (whose
            adapter it then is).

    Raises:
        DocumentError: the document is invalid.
        StoreError: no adapter trained yet, no such version, ``against`` is
            the adapter evaluated, or an adapter's weights do not match the
            sha256 recorded for them.
        BaseModelError: the base model cannot be loaded.
        TrainingError: a token dataset cannot be read, or the settings ask
            for what this machine cannot run.
        AdapterChoiceError: ``name`` does not fit the document, or a multi-adapter document is
            evaluated without one.
    """
    from dlmstore.bases import load_tokenizer
    from dlmstore.corpus.weights import weighed_split
    from dlmstore.document.parser import parse_document
    from dlmstore.errors import StoreError
    from dlmstore.eval.probes import extract_probes, marked_keys
    from dlmstore.eval.results import EvalReport, record_evaluation
    from dlmstore.home import store_dir
    from dlmstore.store.connection import DB_NAME
    from dlmstore.store.database import open_store
    from dlmstore.store.runs import recorded_run
    from dlmstore.train import stages
    from dlmstore.train.data.examples import held_out, validation_examples
    from dlmstore.train.data.inputs import check_dataset_input, context_length

    started = time.perf_counter()
    options = stages.Options(no_cache=no_cache)
    parsed = parse_document(path)
    dlm_id = parsed.dlm_id
    if name is not None:  # a name the document does not declare is refused before anything is opened
        from dlmstore.document.adapter_routing import chosen_adapter

        chosen_adapter(parsed, name, command="dlm eval")
    if not base and not (store_dir(dlm_id) / DB_NAME).is_file():
        raise StoreError(f"{path}: no adapter has been trained yet", hint=_NOTHING_TRAINED.format(path=path))
    with open_store(dlm_id) as store:
        name = _adapter_name(store, parsed, name, adapter)
        subjects = _subjects(
            store, path, adapter=adapter, base=base, against=against, name=name
        )  # before the slow part
        setup = stages.resolve(path, options, adapter=name)
        files = stages.locate(setup)
        document, settings = setup.document, setup.settings
        with recorded_run(
            store, command="eval", dlm_path=document.path, dlm_sha256=document.sha256, adapter=name
        ) as run_id:
            tokenizer = load_tokenizer(setup.ref)
            inputs = [
                check_dataset_input(
                    spec,
                    tokenizer_sha256=files.fingerprint,
                    vocab_size=len(tokenizer),
                    sequence_len=settings.sequence_len,
                    context_len=context_length(files.folder),
                )  # fmt: skip
                for spec in setup.specs
            ]
            tokenized = stages.tokenize(store, run_id, setup, files, tokenizer, options)
            found = tokenized.contamination  # rows training.dedup keeps out of the split trained
            kept_out = frozenset() if found is None else found.kept_out()
            trains, val_rows = held_out(tokenized.rows, setup.seed, marked_keys(document.sections) | kept_out)
            _, val_rows = weighed_split(tokenized.corpus, trains, val_rows, setup.seed)
            val = validation_examples(val_rows, inputs, sequence_len=settings.sequence_len)
            probes = extract_probes(document.sections, seed=setup.seed)
            kept = _retention(store, run_id, setup, tokenized, tokenizer, options)
            evaluations = _evaluate(store, setup, tokenizer, subjects, val, probes, kept)
            with store.write() as conn:
                for evaluation in evaluations:
                    record_evaluation(conn, run_id, "eval", evaluation)
    event = tokenized.result.event
    return EvalReport(
        run_id=run_id,
        dlm_id=document.dlm_id,
        seed=setup.seed,
        val_rows=len(val_rows),
        models=evaluations,
        cache_hits=event.cache_hits,
        cache_misses=event.cache_misses,
        seconds=round(time.perf_counter() - started, 3),
    )


def _adapter_name(store: Store, document: Any, name: str | None, version: int | None) -> str | None:
    """The named adapter evaluated: ``name`` checked against the document, or the one version ``vN`` is of."""
    from dlmstore.document.adapter_routing import adapter_names, chosen_adapter
    from dlmstore.train.adapters import find_version

    if name is None and version is not None and adapter_names(document):
        found = find_version(store, version)
        if found is not None and found.name is not None:
            name = found.name
    return chosen_adapter(document, name, command="dlm eval")


def _subjects(
    store: Store, path: str, *, adapter: int | None, base: bool, against: int | None, name: str | None = None
) -> list[AdapterVersion | None]:
    """What to evaluate, first the one asked for: adapter versions (of the named adapter ``name``), None for
    the base."""
    from dlmstore.errors import StoreError
    from dlmstore.train.adapters import checked_folder, find_version, latest

    def version(number: int, option: str) -> AdapterVersion:
        found = find_version(store, number)
        if found is not None and found.name != name:
            whose = "the document's one adapter" if found.name is None else f"adapter {found.name}"
            raise StoreError(
                f"{path}: {option} v{number:04d} is a version of {whose}, not of "
                f"{'adapter ' + name if name else 'the document'}",
                hint="compare versions of one adapter (`dlm metrics` lists each adapter's versions)",
            )
        if found is None:
            newest = latest(store, name=name)
            known = (
                "no adapter has been trained yet"
                if newest is None
                else f"the newest is v{newest.version:04d}"
            )
            raise StoreError(
                f"{path}: {option} v{number:04d}: no such adapter version ({known})",
                hint=f"`dlm metrics {path}` lists the runs and the adapters they wrote",
            )
        checked_folder(store, found, hint=_DAMAGED_HINT)
        return found

    first: AdapterVersion | None
    if base:
        first = None
    elif adapter is not None:
        first = version(adapter, "--adapter")
    else:
        first = latest(store, name=name)
        if first is None:
            raise StoreError(
                f"{path}: no adapter has been trained yet", hint=_NOTHING_TRAINED.format(path=path)
            )
        checked_folder(store, first, hint=_DAMAGED_HINT)
    if first is not None and against == first.version:
        which = (
            "is the adapter evaluated" if adapter is not None else "is the newest adapter, the one evaluated"
        )
        raise StoreError(
            f"{path}: --against v{against:04d} {which}, so there is nothing to compare it with",
            hint="compare it with another version (--adapter vN --against vM), or leave --against out "
            "to compare it with the base",
        )
    second = version(against, "--against") if against is not None else None
    if against is None and first is not None:
        return [first, None]
    if first is None and second is None:
        return [None]
    return [first, second]


def _retention(
    store: Store, run_id: int, setup: Any, tokenized: Any, tokenizer: Any, options: Any
) -> Retention:
    """The replay history's retention slice rows and probes of earlier versions the document no
    longer holds, as ``dlm train`` measures them (none without history)."""
    from dlmstore.train.data.replay_rows import Retention, retention_of

    if tokenized.corpus is None:
        return Retention(None, ())
    return retention_of(
        store, tokenized.corpus, run_id=run_id, tokenizer_sha256=tokenized.result.tokenizer_sha256,
        tokenizer=tokenizer, use_cache=setup.settings.cache.enabled and not options.no_cache,
    )  # fmt: skip


def _evaluate(
    store: Store,
    setup: Any,
    tokenizer: Any,
    subjects: list[AdapterVersion | None],
    val: tuple[Any, int] | None,
    probes: Any,
    kept: Retention,
) -> list[Any]:
    """Load the base once, the adapters on it, and evaluate each subject in order; the first
    adapter's retention loss is compared with the second's when both are adapters (``--against``)."""
    from dlmstore.eval.inference import as_base, evaluate_model
    from dlmstore.eval.results import with_previous
    from dlmstore.train.data.examples import Collator, pad_token_id, validation_examples
    from dlmstore.train.plan import dlm_target_modules, resolve_plan
    from dlmstore.train.stages import load_base_model

    settings = setup.settings
    with warnings.catch_warnings():
        # transformers deprecation notices about its own internals are noise here (as in dlm train)
        warnings.filterwarnings("ignore", category=FutureWarning)
        model = load_base_model(setup.ref, settings.adapter, setup.precision, seed=setup.seed)
        plan = resolve_plan(
            settings, setup.hardware, base_params=model.num_parameters(),
            auto_target_modules=dlm_target_modules(setup.ref), seed=setup.seed,
        )  # fmt: skip
        for subject in subjects:
            if subject is not None:
                model = _load_adapter(store, model, subject)
    pad = pad_token_id(tokenizer)
    args = None if val is None else (val[0], Collator(pad, val[1]), plan.micro_batch_size)
    examples = validation_examples(kept.rows, (), sequence_len=settings.sequence_len)
    answered: dict[str, list[list[int]]] = {}  # each model's answers: drafts for the next

    def evaluated(adapter_version: int | None) -> Any:
        retention = (
            None
            if examples is None
            else (examples[0], Collator(pad, examples[1]), plan.micro_batch_size)  # a fresh collator each
        )
        return evaluate_model(
            model, tokenizer, adapter_version=adapter_version, val=args, probes=probes,
            system_prompt=setup.document.frontmatter.system_prompt, answered=answered,
            retained=kept.probes, retention=retention,
        )  # fmt: skip

    out = []
    for subject in subjects:
        if subject is None:
            with as_base(model):
                out.append(evaluated(None))
        else:
            model.set_adapter(_name(subject))
            out.append(evaluated(subject.version))
    if len(out) == 2 and all(subject is not None for subject in subjects):
        out[0] = with_previous(out[0], out[1].retention_loss)
    return out


def _name(adapter: AdapterVersion) -> str:
    return f"v{adapter.version:04d}"


def _load_adapter(store: Store, model: Any, adapter: AdapterVersion) -> Any:
    """``model`` with ``adapter`` loaded on it (named ``v0003``)."""
    from peft import PeftModel

    from dlmstore.store.path_text import utf8_alias

    with utf8_alias(store.path / adapter.path) as folder:  # safetensors opens only UTF-8 paths
        if isinstance(model, PeftModel):
            model.load_adapter(str(folder), adapter_name=_name(adapter))
            return model
        return PeftModel.from_pretrained(model, str(folder), adapter_name=_name(adapter))
