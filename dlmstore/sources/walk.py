"""Walk a ``training.sources`` directive: which files belong, in path order.

A directive names a directory (or a single file) relative to the .dlm file's
directory (``~`` expands). :func:`walk_directive` chooses the files below it
that survive the filters, as ``(relpath, path)`` pairs where ``relpath`` is
the POSIX path relative to the directive root; :mod:`dlmstore.sources.read`
then reads them into sections. A directive naming a single file yields that
file, as ``relpath`` its name, with globs and default excludes not applied.

Filters, in the order a file meets them:

1. **Directories pruned on sight** are never listed: symlinked directories
   (not followed, so a link cycle cannot loop the walk), ``.dlm`` (never a
   source), directories matched by the default excludes or an ignore file,
   directories an ``exclude`` glob covers in full (``build/**``), and
   directories below which no ``include`` glob could match (``src/**/*.py``
   never lists ``docs/``). Like git, a ``!`` rule cannot re-include a file
   inside a directory that was itself excluded.
2. **Globs** (``include``, default ``["**/*"]``, and ``exclude``) match the
   path relative to the directive root; see ``dlmstore.sources.ignore`` for the
   syntax. A file is kept when some include matches and no exclude does.
3. **Built-in default excludes** (:data:`DEFAULT_EXCLUDES`, off with
   ``default_excludes: false``), in gitignore syntax: VCS metadata
   (``.git .hg .svn .bzr``), virtualenvs (``.venv/ venv/ .tox/ .nox/``),
   dependencies and caches (``node_modules/ __pycache__/ .mypy_cache/
   .pytest_cache/ .ruff_cache/``), build output (``build/ dist/ target/
   .eggs/ *.egg-info/``), lock files (``*.lock package-lock.json
   pnpm-lock.yaml``; ``*.lock`` covers yarn, poetry, Cargo and uv),
   archives (``*.zip *.tar *.gz *.tgz *.bz2 *.xz *.7z *.rar``), keys and
   secrets (``*.pem *.key *.p12 *.pfx id_rsa* id_ed25519* .env .env.*``)
   and ``.DS_Store``. They act as an ignore file above the root, so a
   ``.dlm/ignore`` can re-include a file (``!.env.example``).
4. **``.dlm/ignore`` files** anywhere in the tree (gitignore subset); deeper
   files override shallower ones, the last matching rule wins.

Filters 2-4 are :class:`Matcher` objects, in the ordered list that
:func:`matchers` builds: adding a filter is writing one matcher and adding it
there. A file a matcher skips counts as ``excluded``, a directory as
``excluded_dirs``. Default excludes and ignore files are one matcher
(:class:`IgnoreFiles`), not two, because a ``!`` rule in an ignore file can
re-include a default exclude: they are one chain of rules. A matcher is not
called per entry; it hands the walk compiled :class:`Test` objects, mostly a
regex ``fullmatch`` over the bare name, which the walk's loop calls inline.
Calling a Python ``skip(entry)`` method per entry per matcher was measurably
slower over the entries of the walk below (``bench/bench_sources.py``).

Symlinked *files* are followed when the target lies inside the document's
directory (or inside the directive root). Otherwise the ``strict`` policy
raises :class:`SourceError` and ``permissive`` skips the file with a warning
(counted as ``skipped_outside``). A directive path outside the document's
directory is an error under ``strict``; ``permissive`` reads it (``path:
~/notes`` is a deliberate choice, and what that policy is for). The symlink
policy is not a matcher: it resolves the link (two syscalls), may raise, and
counts apart; a link that resolves to a file then meets the same tests as a
file would.

Output order is deterministic: entries are sorted so that files come out in
code-point (= UTF-8 byte) order of their relpath, directories and files
interleaved (``a.py`` sorts before ``a/b.py``).

Speed: the walk trusts ``os.scandir`` entry types (no ``stat`` per entry),
builds a relpath only for entries that pass the name tests (or for a test
that needs the path), and every glob list or ignore file is one compiled
regex (``dlmstore.sources.ignore``). A chosen file is a plain tuple: building
a dataclass or ``NamedTuple`` per file costs more than the tuple, for no
gain inside the package.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple, Protocol

from dlmstore.document.frontmatter import SourceDirective
from dlmstore.errors import SourceError
from dlmstore.sources.ignore import GlobSet, IgnoreRules, is_ignored

#: Ignore rules applied below every directive root unless the directive sets
#: ``default_excludes: false`` (gitignore syntax: ``/`` = directories only).
DEFAULT_EXCLUDES: tuple[str, ...] = (
    # version control
    ".git", ".hg", ".svn", ".bzr",
    # virtualenvs and tool environments
    ".venv/", "venv/", ".tox/", ".nox/",
    # dependencies and caches
    "node_modules/", "__pycache__/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/",
    # build output
    "build/", "dist/", "target/", ".eggs/", "*.egg-info/",
    # lock files (yarn.lock, poetry.lock, Cargo.lock, uv.lock, ...)
    "*.lock", "package-lock.json", "pnpm-lock.yaml",
    # archives
    "*.zip", "*.tar", "*.gz", "*.tgz", "*.bz2", "*.xz", "*.7z", "*.rar",
    # keys and secrets
    "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_ed25519*", ".env", ".env.*",
    # OS litter
    ".DS_Store",
)  # fmt: skip

#: Where ignore files live, relative to the directory they apply to.
IGNORE_FILE = ".dlm/ignore"

#: The ignore files met on the way down to a directory, shallowest first.
Chain = tuple[IgnoreRules, ...]

#: A chosen file: ``(relpath, path to open)``; the path is a symlink's target
#: for a followed link.
ChosenFile = tuple[str, str]


class Test(NamedTuple):
    """One compiled question a matcher asks of every file (or directory).

    ``call`` gets the entry's bare name when ``on_name`` is true, else its
    relpath; a truthy answer is a match. A miss skips the entry when
    ``skip_on_miss`` is true (include globs); otherwise a match skips it.
    """

    on_name: bool
    call: Callable[[str], object]
    skip_on_miss: bool


class Matcher(Protocol):
    """One named filter of the walk; :func:`matchers` lists them in order."""

    @property
    def name(self) -> str:
        """What the filter is, as a directive or the docs call it."""
        ...

    def tests(self, chain: Chain) -> tuple[Test | None, Test | None]:
        """Its test of files and its test of directories in a directory
        whose ignore files are ``chain``; ``None`` where it skips nothing."""
        ...


def _never(_: str) -> None:
    """The answer of an empty glob list: no match."""
    return None


def _glob_test(globs: GlobSet, skip_on_miss: bool) -> Test:
    names = globs.name_matcher()
    if names is not None:
        return Test(True, names, skip_on_miss)
    return Test(False, globs.path_matcher() or _never, skip_on_miss)


@dataclass(frozen=True)
class IncludeGlobs:
    """``include``: a file is kept only if a glob matches it; a directory only
    if a glob could match below it."""

    globs: GlobSet
    name: ClassVar[str] = "include"

    def tests(self, chain: Chain) -> tuple[Test | None, Test | None]:
        return _glob_test(self.globs, skip_on_miss=True), Test(False, self.globs.can_contain, True)


@dataclass(frozen=True)
class ExcludeGlobs:
    """``exclude``: a file a glob matches is skipped, and so is a directory a
    glob covers in full (``build/**``)."""

    globs: GlobSet
    name: ClassVar[str] = "exclude"

    def tests(self, chain: Chain) -> tuple[Test | None, Test | None]:
        if not self.globs.patterns:
            return None, None
        return _glob_test(self.globs, skip_on_miss=False), Test(False, self.globs.covers_dir, False)


@functools.cache
def _default_rules() -> IgnoreRules:
    return IgnoreRules.parse("\n".join(DEFAULT_EXCLUDES))


def _chain_test(chain: Chain, is_dir: bool) -> Test:
    def ignored(rel: str) -> bool:
        return is_ignored(chain, rel, rel[rel.rfind("/") + 1 :], is_dir)

    return Test(False, ignored, False)


@dataclass(frozen=True)
class IgnoreFiles:
    """The built-in default excludes (unless ``default_excludes: false``) and
    the ``.dlm/ignore`` files, as one chain of gitignore rules."""

    default_excludes: bool
    name: ClassVar[str] = "ignore"

    def tests(self, chain: Chain) -> tuple[Test | None, Test | None]:
        if self.default_excludes:
            chain = (_default_rules(), *chain)
        if not chain:
            return None, None
        simple = chain[0].simple_matchers() if len(chain) == 1 else None
        if simple is None:
            return _chain_test(chain, False), _chain_test(chain, True)
        # Name-only rules without "!" (the defaults): any match means ignored.
        files, dirs = simple
        return (
            Test(True, files, False) if files is not None else None,
            Test(True, dirs, False) if dirs is not None else None,
        )


def matchers(directive: SourceDirective) -> tuple[Matcher, ...]:
    """The filters of ``directive``, in the order an entry meets them."""
    return (
        IncludeGlobs(GlobSet.compile(directive.include)),
        ExcludeGlobs(GlobSet.compile(directive.exclude)),
        IgnoreFiles(directive.default_excludes),
    )


@dataclass(frozen=True)
class SourceWalk:
    """The files one directive chose, and what its walk left out.

    Attributes:
        root: the resolved absolute path that was walked.
        files: the chosen files, in relpath order.
        excluded: files a matcher skipped, and the document itself.
        excluded_dirs: directories not descended into (a matcher skipped
            them, or they are symlinked); their files are not counted.
        skipped_outside: symlinked files resolving outside the document's
            directory and the directive root (permissive policy).
        warnings: one line each, meant for stderr.
    """

    root: str
    files: tuple[ChosenFile, ...]
    excluded: int
    excluded_dirs: int
    skipped_outside: int
    warnings: tuple[str, ...]


def walk_directive(
    directive: SourceDirective,
    *,
    label: str,
    doc_dir: Path,
    doc_root: str,
    policy: str,
    document: str | None = None,
) -> SourceWalk:
    """Choose the files of ``directive``, a path relative to ``doc_dir``.

    ``doc_root`` is the real path of ``doc_dir``. ``document`` is the real
    path of the .dlm file: a walk that reaches it (``path: .``) skips it,
    counted as excluded, so a document never trains on its own source text.
    ``label`` starts every warning and error message.

    Raises:
        SourceError: the directive path does not exist, or (``strict``
            policy) it or a symlinked file below it resolves outside
            ``doc_dir``.
    """
    given = os.path.join(os.path.expanduser(doc_dir), os.path.expanduser(directive.path))
    if not os.path.exists(given):
        raise SourceError(
            f"{label}: no such file or directory (resolved to {os.path.abspath(given)})",
            hint="relative source paths start at the .dlm file's directory; fix the path or remove the entry",
        )
    root = os.path.realpath(given)
    if policy == "strict" and not _inside(root, doc_root):
        raise SourceError(_outside_message(label, "the path", root, doc_root))
    walker = _Walker(matchers(directive), label, root, doc_root, policy)
    if os.path.isdir(root):
        walker.walk(root, "", walker.filters(()))
    elif os.path.isfile(root):  # a file named explicitly is taken as is, globs aside
        walker.files.append((os.path.basename(given), root))
    else:
        raise SourceError(f"{label}: {root} is neither a regular file nor a directory")
    files = walker.files
    if document is not None and _inside(document, root):
        # Chosen paths lie under the real root (symlinked dirs are not
        # followed), so a string comparison finds the document.
        kept = [file for file in files if file[1] != document]
        walker.excluded += len(files) - len(kept)
        files = kept
    return SourceWalk(
        root=root,
        files=tuple(files),
        excluded=walker.excluded,
        excluded_dirs=walker.excluded_dirs,
        skipped_outside=walker.skipped_outside,
        warnings=tuple(walker.warnings),
    )


def _inside(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (both real paths)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _outside_message(label: str, what: str, target: str, doc_root: str) -> str:
    return (
        f"{label}: {what} resolves to {target}, outside the document's directory "
        f"{doc_root}; move it inside, or set training.sources_policy: permissive"
    )


#: What ``_classify`` keeps of a directory's entries, sorted by their first
#: element: a file's ``(relpath, path)`` (a :data:`ChosenFile`) or a
#: directory's ``(relpath + "/", path, relpath)``, the slash making ``a.py``
#: sort before ``a/b.py``.
_Item = tuple[str, str] | tuple[str, str, str]


#: A :class:`Test` as a plain tuple, and in a slot of the hot loop
#: (``call`` ``None`` where there is no test).
_Plain = tuple[bool, Callable[[str], object], bool]
_Slot = tuple[bool, Callable[[str], object] | None, bool]
_NO_TEST: _Slot = (True, None, False)


@dataclass(frozen=True)
class _Filters:
    """The matchers' tests for directories whose ignore files are ``chain``.

    ``files`` and ``dirs`` hold every test, in matcher order. For the hot
    loop the first three file tests also sit in slots of their own and only
    the others in ``later``: today's matchers give at most three, most
    directives two (an include glob and the built-in defaults), so a file
    costs those calls and no iterator object (looping over the tests
    costs more instructions in that loop). The order is the matchers'
    order, cheapest and most selective first: a file must pass every test,
    so the order changes the cost, never the answer.
    """

    chain: Chain
    files: tuple[_Plain, ...]
    dirs: tuple[_Plain, ...]
    slots: tuple[_Slot, _Slot, _Slot]
    later: tuple[_Plain, ...]


def _passes(tests: Sequence[_Plain], name: str, rel: str) -> bool:
    """Whether an entry with this name and relpath survives ``tests``."""
    for on_name, call, skip_on_miss in tests:
        if (not call(name if on_name else rel)) is skip_on_miss:
            return False
    return True


class _Walker:
    """Mutable state of one directive's walk; its result is a frozen :class:`SourceWalk`."""

    def __init__(
        self, matchers: Sequence[Matcher], label: str, root: str, doc_root: str, policy: str
    ) -> None:
        self.matchers = matchers
        self.label = label
        self.boundaries = (doc_root, root)
        self.doc_root = doc_root
        self.policy = policy
        self.files: list[ChosenFile] = []
        self.warnings: list[str] = []
        self.excluded = 0
        self.excluded_dirs = 0
        self.skipped_outside = 0

    def filters(self, chain: Chain) -> _Filters:
        """The tests of every matcher for directories whose ignore files are ``chain``."""
        files: list[_Plain] = []
        dirs: list[_Plain] = []
        for matcher in self.matchers:
            file_test, dir_test = matcher.tests(chain)
            # As plain tuples: unpacking a NamedTuple (a tuple subclass) in a
            # loop takes the slow path, an iterator object each time.
            if file_test is not None:
                files.append((file_test.on_name, file_test.call, file_test.skip_on_miss))
            if dir_test is not None:
                dirs.append((dir_test.on_name, dir_test.call, dir_test.skip_on_miss))
        padded = (*files, _NO_TEST, _NO_TEST, _NO_TEST)
        slots = (padded[0], padded[1], padded[2])
        return _Filters(chain, tuple(files), tuple(dirs), slots, tuple(files[3:]))

    def walk(self, dir_abs: str, dir_rel: str, filters: _Filters) -> None:
        """Append the kept files below ``dir_abs`` to ``files``, sorted."""
        try:
            with os.scandir(dir_abs) as it:
                entries = list(it)
        except OSError as exc:
            self.warnings.append(f"{self.label}: cannot list {dir_rel or '.'}: {exc.strerror}")
            return
        items, links, has_dlm, excluded, pruned = self._classify(entries, dir_rel, filters)
        if has_dlm:  # rare: classify again under this directory's ignore file
            rules = self._ignore_file(dir_abs, dir_rel)
            if rules is not None:
                filters = self.filters((*filters.chain, rules))
                items, links, _, excluded, pruned = self._classify(entries, dir_rel, filters)
        self.excluded += excluded
        self.excluded_dirs += pruned
        prefix = dir_rel + "/" if dir_rel else ""
        for entry in links:
            self._symlink(entry.path, prefix + entry.name, entry.name, filters, items)
        items.sort()
        files = self.files
        for item in items:
            if len(item) == 3:  # a directory: (relpath + "/", path, relpath)
                self.walk(item[1], item[2], filters)
            else:  # a file: (relpath, path), the chosen file itself
                files.append(item)

    def _classify(
        self, entries: list[os.DirEntry[str]], dir_rel: str, filters: _Filters
    ) -> tuple[list[_Item], list[os.DirEntry[str]], bool, int, int]:
        """Split one directory's entries into kept items (:data:`_Item`),
        symlinks to look at, whether ``.dlm`` is there, and the two exclusion
        counts.

        This is the hot loop of the walk: a file meets its first tests
        in slots (see :class:`_Filters`), and its relpath is built only for
        a test that needs it or once it passes. Directories, far fewer, loop
        over their tests.
        """
        prefix = dir_rel + "/" if dir_rel else ""
        (on_name_1, test_1, miss_1), (on_name_2, test_2, miss_2), (on_name_3, test_3, miss_3) = filters.slots
        later, dir_tests = filters.later, filters.dirs
        items: list[_Item] = []
        links: list[os.DirEntry[str]] = []
        has_dlm = False
        excluded = pruned = 0
        for entry in entries:
            name = entry.name
            if entry.is_file(follow_symlinks=False):
                if (
                    (test_1 is not None and (not test_1(name if on_name_1 else prefix + name)) is miss_1)
                    or (test_2 is not None and (not test_2(name if on_name_2 else prefix + name)) is miss_2)
                    or (test_3 is not None and (not test_3(name if on_name_3 else prefix + name)) is miss_3)
                    or (later and not _passes(later, name, prefix + name))
                ):
                    excluded += 1
                else:
                    items.append((prefix + name, entry.path))
            elif entry.is_dir(follow_symlinks=False):
                if name == ".dlm":
                    has_dlm = True
                    continue
                rel = prefix + name
                for on_name, call, skip_on_miss in dir_tests:
                    if (not call(name if on_name else rel)) is skip_on_miss:
                        pruned += 1
                        break
                else:
                    items.append((rel + "/", entry.path, rel))
            elif entry.is_symlink():
                links.append(entry)
            # sockets, FIFOs and devices are never sources
        return items, links, has_dlm, excluded, pruned

    def _ignore_file(self, dir_abs: str, dir_rel: str) -> IgnoreRules | None:
        where = f"{dir_rel}/{IGNORE_FILE}" if dir_rel else IGNORE_FILE
        try:
            with open(os.path.join(dir_abs, IGNORE_FILE), encoding="utf-8") as handle:
                return IgnoreRules.parse(handle.read(), dir_rel)
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not valid UTF-8"
            self.warnings.append(f"{self.label}: ignoring unreadable {where}: {reason}")
            return None

    def _symlink(self, path: str, rel: str, name: str, filters: _Filters, items: list[_Item]) -> None:
        """Apply the symlink policy to one link, appending a followed file to ``items``."""
        try:
            target = os.path.realpath(path, strict=True)
            mode = os.stat(target).st_mode
        except OSError:
            self.warnings.append(f"{self.label}: skipping {rel}: broken symlink")
            return
        if stat.S_ISDIR(mode):
            self.excluded_dirs += 1  # warn only if it would have been walked
            if _passes(filters.dirs, name, rel):
                self.warnings.append(f"{self.label}: not following symlinked directory {rel}")
            return
        if not stat.S_ISREG(mode):
            return
        if not _passes(filters.files, name, rel):
            self.excluded += 1
            return
        if not any(_inside(target, boundary) for boundary in self.boundaries):
            if self.policy == "strict":
                raise SourceError(_outside_message(self.label, f"symlink {rel}", target, self.doc_root))
            self.skipped_outside += 1
            self.warnings.append(
                f"{self.label}: skipping {rel}: symlink to {target}, outside the document's directory"
            )
            return
        items.append((rel, target))
