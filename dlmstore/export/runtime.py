"""llama.cpp, through llama-cpp-python: finding it, running it apart, and asking it for tokens.

llama-cpp-python is an optional dependency (the ``export`` extra): it
compiles llama.cpp from source, which takes minutes, so ``dlm export``
and ``dlm prompt --backend llama.cpp`` find it lazily and, when it is
missing, fail with the exact command that installs it (:data:`INSTALL`).

A llama.cpp built for the instructions of another CPU dies with SIGILL
(``Illegal instruction``) on its first model load, taking the process with
it: pip's default build uses every instruction the build machine reports
(``GGML_NATIVE``), and some machines report instructions they cannot run.
So ``dlm export`` runs llama.cpp in a child process (:func:`run_child`)
and turns such a death into one error that says which build to install
instead. ``dlm prompt`` loads it in its own process (:func:`load_model`),
after an export has shown that this build runs here.

:func:`greedy` and :func:`chat_tokens` are the decoding the tests, the
bench and ``dlm prompt`` share: the chat template the GGUF carries,
rendered as transformers renders it, tokenized by llama.cpp, and
argmax decoding.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

from dlmstore.errors import ExportError
from dlmstore.store.path_text import utf8_alias

#: The distribution that brings llama.cpp, and the version dlmstore is tested with.
DISTRIBUTION = "llama-cpp-python"
VERSION = "0.3.36"
#: The portable build (see the Makefile): no instructions beyond AVX2/FMA/F16C.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
#: The command that installs it the way ``make install`` does.
INSTALL = f"CMAKE_ARGS=\"{CMAKE_ARGS}\" pip install '{DISTRIBUTION}[server]=={VERSION}'"
#: The same, rebuilding over a build that crashes.
REBUILD = (
    f'CMAKE_ARGS="{CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir --no-binary {DISTRIBUTION} '
    f"'{DISTRIBUTION}[server]=={VERSION}'"
)


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python's version (no import), or None."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def require_llama_cpp(command: str) -> str:
    """The installed version, or an error naming ``command`` and the install command.

    Raises:
        ExportError: llama-cpp-python is not installed.
    """
    version = llama_cpp_version()
    if version is None:
        raise ExportError(f"{command} needs {DISTRIBUTION} (llama.cpp), which is not installed", hint=INSTALL)
    return version


def run_child(module: str, args: list[str], *, what: str) -> str:
    """Run ``python -m <module> <args>`` (a llama.cpp step) and return its stdout.

    Args:
        module: the module to run as the child's main.
        args: its arguments.
        what: what the step does, for messages (``quantizing model.F16.gguf``).

    Raises:
        ExportError: the child died of a signal (SIGILL: a llama.cpp built
            for another CPU; the hint says how to rebuild it) or failed,
            with the last line it wrote.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode == 0:
        return done.stdout
    raise child_error(done.returncode, done.stderr, what=what)


def child_error(returncode: int, stderr: str, *, what: str) -> ExportError:
    """The error for a llama.cpp child that ended with ``returncode`` after writing ``stderr``."""
    if returncode < 0:
        number = -returncode
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        if number == signal.SIGILL:
            return ExportError(
                f"llama.cpp crashed with Illegal instruction (SIGILL) while {what}: this "
                f"{DISTRIBUTION} was built for instructions this CPU cannot run",
                hint=f"rebuild it portable: {REBUILD}",
            )
        return ExportError(f"llama.cpp was killed by {name} while {what}")
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit status {returncode}"
    return ExportError(f"llama.cpp failed while {what}: {last}")


def load_model(path: Path, *, n_ctx: int = 2048, logits_all: bool = False, lora: Path | None = None) -> Any:
    """A ``llama_cpp.Llama`` on the GGUF ``path`` (imports llama_cpp; quiet).

    Args:
        path: the model GGUF.
        n_ctx: the context length to allocate.
        logits_all: keep the logits of every position (teacher forcing).
        lora: a GGUF LoRA to apply on top.

    Raises:
        ExportError: llama-cpp-python is missing, or the file does not load.
    """
    require_llama_cpp("llama.cpp")
    import llama_cpp

    kwargs: dict[str, Any] = {"n_ctx": n_ctx, "verbose": False, "logits_all": logits_all, "seed": 0}
    # llama-cpp-python encodes a path as strict UTF-8; the files are read while the Llama is made.
    with ExitStack() as aliases:
        if lora is not None:
            kwargs["lora_path"] = str(aliases.enter_context(utf8_alias(lora)))
        try:
            return llama_cpp.Llama(model_path=str(aliases.enter_context(utf8_alias(path))), **kwargs)
        except (ValueError, RuntimeError) as exc:
            raise ExportError(f"llama.cpp cannot load {path}: {exc}") from None


def chat_tokens(llm: Any, messages: list[dict[str, str]]) -> list[int]:
    """``messages`` in the GGUF's own chat template, with the generation prompt, as llama.cpp's token ids."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise ExportError(f"{llm.model_path}: the GGUF carries no chat template")
    bos = _token_text(llm, llm.token_bos())
    eos = _token_text(llm, llm.token_eos())
    # llama_cpp types messages as its OpenAI request dicts, which plain role/content dicts are.
    chat: Any = messages
    prompt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=True)(
        messages=chat
    ).prompt
    return list(llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))


def _token_text(llm: Any, token: int) -> str:
    if token < 0:
        return ""
    return bytes(llm.detokenize([token], special=True)).decode("utf-8", errors="replace")


def greedy(llm: Any, tokens: list[int], *, max_new_tokens: int) -> list[int]:
    """Argmax decoding from ``tokens``: at most ``max_new_tokens`` new ids, ending before an end-of-generation id."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out: list[int] = []
    if max_new_tokens < 1:
        return out
    for token in llm.generate(
        tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
    ):
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        out.append(int(token))
        if len(out) >= max_new_tokens:
            break
    return out
