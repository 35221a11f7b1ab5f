"""Quantisation by llama.cpp's own quantiser, in a child process, checked by loading the result.

``dlm export --quant Q4_K_M`` (``Q5_K_M``, ``Q6_K``, ``Q8_0``) writes the
F16 GGUF (:mod:`.model_gguf`) and hands it to ``llama_model_quantize``, the
function behind llama.cpp's ``llama-quantize``: the k-quants choose their
mixes of types per tensor (``_M`` keeps some layers at higher precision),
and a tensor whose rows do not divide into a quant's blocks falls back to a
type that fits, exactly as llama.cpp decides. No quantisation is written by
hand here.

The quantiser runs in a child process (``python -m
dlmstore.export.quantize IN OUT TYPE``), which then loads the file it wrote
and evaluates a few tokens: a llama.cpp that cannot run on this CPU dies
there, and :func:`dlmstore.export.runtime.run_child` turns that into an
error instead of taking ``dlm export`` down with it. Each row is quantised
on its own, so the output does not depend on the number of threads, and
the same input gives the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dlmstore.export.runtime import run_child

#: The quantisations an export offers, as llama.cpp names its file types (``LLAMA_FTYPE_MOSTLY_*``).
QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")
#: What ``--quant`` defaults to when the document's ``export.default_quant`` does not say (DLM's default).
DEFAULT_QUANT = "Q4_K_M"


def quantize(source: Path, out: Path, quant: str) -> None:
    """Quantise the GGUF ``source`` to ``quant`` into ``out`` with llama.cpp, and load the result once.

    Raises:
        ExportError: llama.cpp failed or crashed (see :func:`~dlmstore.export.runtime.run_child`).
    """
    run_child(__name__, [str(source), str(out), quant], what=f"quantizing {source.name} to {quant}")


def smoke(path: Path) -> None:
    """Load the GGUF ``path`` in a child process and evaluate a few tokens (see :func:`quantize`).

    Raises:
        ExportError: llama.cpp failed or crashed.
    """
    run_child(__name__, [str(path)], what=f"loading {path.name}")


def _quantize_here(source: str, out: str, quant: str) -> None:
    import ctypes

    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}")
    params.nthread = 0  # all cores; the bytes do not depend on it
    status = llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params))
    if status != 0:
        raise SystemExit(f"llama_model_quantize returned {status}")


def _smoke_here(path: str) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=64, verbose=False)
    llm.eval(llm.tokenize(b"Hello, world", add_bos=False)[:8] or [0])


def main(argv: list[str]) -> None:
    """The child's entry point: ``IN OUT QUANT`` quantises then loads OUT; ``PATH`` only loads."""
    if len(argv) == 3:
        _quantize_here(*argv)
        _smoke_here(argv[1])
    elif len(argv) == 1:
        _smoke_here(argv[0])
    else:
        raise SystemExit("usage: python -m dlmstore.export.quantize IN OUT QUANT | PATH")


if __name__ == "__main__":
    main(sys.argv[1:])
