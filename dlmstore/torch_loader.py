"""torch, imported by the work that runs a model, or one line saying why it cannot load.

Only ``dlm train``, ``dlm eval``, ``dlm prompt`` and ``dlm export`` run a
model; every other command stays clear of torch (``tests/test_cli.py``
runs each in a fresh process and looks for it). Whatever must load torch
calls :func:`require_torch` first, naming what needs it.

torch's CPU library is linked with Intel oneMKL, whose loader ends the
process when the working directory cannot be named: one of ``PATH_MAX``
bytes or more (the kernel's ``getcwd`` refuses it, though Python's
``os.getcwd()`` still walks it) or one that was removed. It prints
``Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so`` and exits 2 from
inside ``import torch``: no Python exception, nothing to catch. So the
working directory is checked before the import, and an import that fails
the ordinary way (a missing shared library, a broken install) is turned into
the same kind of error.
"""

from __future__ import annotations

import os
import sys

from dlmstore.errors import TorchUnavailableError

#: The longest working directory, in bytes with its terminating NUL, that the kernel's getcwd returns.
PATH_MAX = 4096


def require_torch(needed_for: str) -> None:
    """Import torch for ``needed_for``, or raise :class:`TorchUnavailableError` saying why it cannot load.

    Args:
        needed_for: what needs torch, as the start of a sentence
            (``"dlm train trains the adapter in torch"``).
    """
    if "torch" in sys.modules:
        return
    problem = working_directory_problem()
    if problem is not None:
        raise TorchUnavailableError(
            f"{needed_for}, and torch's native library (libtorch_cpu.so, through Intel oneMKL) "
            f"cannot load with {problem}",
            hint="cd to a shorter directory that exists and run the command again",
        )
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TorchUnavailableError(
            f"{needed_for}, and torch cannot be imported: {first_line}",
            hint="reinstall it (`make install`, or pip install --force-reinstall torch)",
        ) from exc


def working_directory_problem() -> str | None:
    """Why oneMKL's loader cannot start from the current working directory, or ``None`` when it can."""
    try:
        cwd = os.getcwd()
    except OSError as exc:
        return f"the working directory gone or unreadable ({exc.strerror or exc})"
    length = len(os.fsencode(cwd))
    if length + 1 > PATH_MAX:
        return f"a working directory of {length:,} bytes, beyond PATH_MAX ({PATH_MAX:,})"
    return None
