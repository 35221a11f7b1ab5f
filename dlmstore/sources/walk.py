"""Walk a ``training.sources`` directive: which files belong, in DLM's order.

A directive names a directory (or a single file) relative to the .dlm file's
directory (``~`` expands); a .dlm file kept in a ``.dlm/`` folder
(``corpus/.dlm/corpus.dlm``) anchors at the folder's parent (``corpus/``), as
in DocumentLanguageModel (``dlmstore.sources.expand`` passes that directory
in). :func:`walk_directive` chooses the files below it, as ``(relpath,
path)`` pairs where ``relpath`` is the POSIX path relative to the directive
root; :mod:`dlmstore.sources.read` then reads them into sections.

Which files: DLM's decision, file for file (``dlmstore.sources.rules``):
include and exclude globs, the default excludes
(``dlmstore.sources.defaults``), and the ``.dlm/training.yaml`` and
``.dlm/ignore`` files of every ``.dlm/`` folder met on the way down
(``dlmstore.sources.config``). A directive naming a single file matches its
globs and the defaults against the file's name, as DLM does. A file a filter
drops counts as ``excluded``.

Order: DLM sorts the paths (``sorted(root.rglob("*"))``), and a ``Path``
compares folder by folder, so a folder's files come out right where its name
sorts among its siblings: ``A.py``, ``a/b.py``, ``a-b.py``, ``a.py``. The
walk lists each directory, sorts its entries by name (code point order) and
descends into a folder in its place, which is that order.

Skipping folders: DLM tests every file of every folder; a walk that does
not test each file of ``.git/`` or ``node_modules/`` is faster, and gives
the same answer when no file below could be read anyway
(:meth:`~.rules.Scope.may_skip`: no include glob can match below, or an
exclude covers it and no ``!`` rule reaches in). Two things below a folder
could still change the answer: a ``.dlm/`` folder (its training.yaml can
turn the defaults off or replace the include, its ignore file can
re-include) and a name holding a newline (DLM's ``**`` stops at one). So
before skipping a folder, the walk lists what is below it for those two
only (:func:`_nothing_below`: names, no tests); a folder that holds either
is walked like any other. Those listings are the price of exactness: on the
standard library (``bench/bench_sources.py``) the 3,119 ``__pycache__``
folders cost about 20 ms of kernel time, where the walk before skipped them
unlisted. A skipped folder counts as one ``excluded_dirs``; its files are
not counted.

Symlinked *files* are followed when the target lies inside the document's
directory (or inside the directive root), and the filters see the link's
own path, with the ``.dlm/`` folders above the link. (DLM matches the
target's path and folders when the target lies under the directive root,
and the link's bare name otherwise; dlmstore keeps its own symlink policy.)
Otherwise the ``strict`` policy raises :class:`SourceError` and
``permissive`` skips the file with a warning (counted as
``skipped_outside``). Symlinked directories are not followed, so a link
cycle cannot loop the walk (DLM's ``rglob`` may follow them; dlmstore never
does). A directive path outside the document's directory is an error under
``strict``; ``permissive`` reads it (``path: ~/notes`` is a deliberate
choice, and what that policy is for). A directive folder that is the
filesystem root, the home folder or a folder above it is refused under
either policy: its walk would read the machine into memory.

Between the walk and the read, a chosen file (or a folder above it) may be
swapped for a symlink to somewhere else; ``dlmstore.sources.read`` opens
each file so that the descriptor must be the very path the walk chose, so
a swap is refused rather than read.

Speed: the walk trusts ``os.scandir`` entry types (no ``stat`` per entry),
and the filters in force in a directory are a couple of name tests compiled
once per distinct set (``dlmstore.sources.glob``), called inline in the loop
over its entries; a relpath is built only for a file that is kept. A chosen
file is a plain tuple: building a dataclass or ``NamedTuple`` per file costs
more than the tuple, for no gain inside the package. A directory's items
are sorted by their relpath alone (relpaths differ, so that is the tuples'
order): a string comparison instead of a tuple comparison halves the sort
of a large folder, and a folder with no subfolder to walk hands its sorted
files over in one ``extend``. Measured in-process on a 2-core machine
(walk only; user-space instructions under callgrind, which are exact, and
noisy wall medians of 9 runs): a flat folder of 100,000 files 1,275M ->
958M instructions (~205 -> ~175 ms); the standard library (13,346 of 34K
entries chosen, 5,579 folders listed plus 3,119 ``__pycache__`` listings)
515M -> 509M (~130 ms either way). Listing those 8,702 folders alone, with
no test at all, is 170M instructions and ~90 ms there (the rest of that
is the kernel's), and the flat folder's listing ~50 ms plus ~30 ms to
sort its names: what is left to the walk's own Python is its loop over
the entries, the rule tests and the ``__pycache__`` checks. Listing each
folder entry by entry beat doing it in C-level passes (``map``/
``compress``/``filter`` over the listing): the passes win on a folder of
100,000 files but lose more on the standard library's folders of a few
files each.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dlmstore.errors import SourceError
from dlmstore.progress import Task
from dlmstore.sources.roots import DLM_FOLDER, source_root
from dlmstore.sources.rules import DirTests, Scope

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import SourceDirective

#: A chosen file: ``(relpath, path to open)``; the path is a symlink's target
#: for a followed link.
ChosenFile = tuple[str, str]


@dataclass(frozen=True)
class SourceWalk:
    """The files one directive chose, and what its walk left out.

    Attributes:
        root: the resolved absolute path that was walked.
        files: the chosen files, in DLM's path order.
        excluded: files a filter dropped, and the document itself.
        excluded_dirs: directories not descended into (nothing below them
            could be read, or they are symlinked); their files are not counted.
        skipped_outside: symlinked files resolving outside the document's
            directory and the directive root (permissive policy).
        warnings: one line each, meant for stderr.
        not_included: of ``excluded``, files no ``include`` glob matched (the rest: an
            exclude glob, a default exclude or an ignore rule, or the document itself).
    """

    root: str
    files: tuple[ChosenFile, ...]
    excluded: int
    excluded_dirs: int
    skipped_outside: int
    warnings: tuple[str, ...]
    listed: ListedDirs | None = None
    not_included: int = 0


@dataclass(frozen=True)
class ListedDirs:
    """Every folder a walk listed, with its ``stat`` taken just before the listing.

    A folder's entries cannot change without its mtime and ctime moving, so
    these stamps prove, on a later run, that every listing (and so the
    walk's choice of files) is the same (``dlmstore.sources.proof``).
    ``SourceWalk.listed`` is ``None`` when not asked for, and when the walk
    met what a folder stamp cannot vouch for: a symlink (its target lies
    elsewhere) or a ``.dlm/`` folder (its files' text shapes the walk).

    Attributes:
        dirs: ``(path, stat)`` of each folder listed, the ones looked into
            before being skipped included.
        listed_ns: the time (ns since the epoch) before the first ``stat``,
            for the racy check.
    """

    dirs: tuple[tuple[str, os.stat_result], ...]
    listed_ns: int


def walk_directive(
    directive: SourceDirective,
    *,
    label: str,
    doc_dir: Path,
    doc_root: str,
    policy: str,
    document: str | None = None,
    stamp_dirs: bool = False,
) -> SourceWalk:
    """Choose the files of ``directive``, a path relative to ``doc_dir``.

    ``doc_dir`` is where relative paths start (the document's directory, or
    its parent for a document kept in a ``.dlm/`` folder) and ``doc_root``
    its real path. ``document`` is the real path of the .dlm file: a walk
    that reaches it (``path: .``) skips it, counted as excluded, so a
    document never trains on its own source text. ``label`` starts every
    warning and error message. ``stamp_dirs`` stats each folder before
    listing it, for ``SourceWalk.listed``.

    Raises:
        SourceError: the directive path does not exist; (``strict`` policy)
            it or a symlinked file below it resolves outside ``doc_dir``; a
            ``.dlm/training.yaml`` or ``.dlm/ignore`` below it is unreadable
            or malformed; it names the filesystem root, the home folder or
            a folder above it (under either policy).
    """
    root = directive_root(directive, doc_dir)
    if root is None:
        given = os.path.join(os.path.expanduser(doc_dir), os.path.expanduser(directive.path))
        raise SourceError(
            f"{label}: no such file or directory (resolved to {os.path.abspath(given)})",
            hint="relative source paths start at the .dlm file's directory; fix the path or remove the entry",
        )
    if os.path.isdir(root):
        _refuse_too_wide(label, root)
    if policy == "strict" and not _inside(root, doc_root):
        raise SourceError(_outside_message(label, "the path", root, doc_root))
    listed_ns = time.time_ns()  # before any stat: stamps compare mtimes against it
    walker = _Walker(label, root, doc_root, policy, stamp_dirs=stamp_dirs)
    scope = Scope.root(directive)
    if os.path.isdir(root):
        with Task(f"walking {directive.path}", unit="files") as walker.task:
            walker.walk(root, "", scope)
            walker.task.finish(len(walker.files))
    elif os.path.isfile(root):
        # DLM matches a single file's name (the resolved file's) against the
        # directive's globs and the defaults, and names its section after it.
        name = os.path.basename(root)
        if _kept(scope, "", name):
            walker.files.append((name, root))
        else:
            walker.excluded += 1
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
        listed=None if walker.stamps is None else ListedDirs(tuple(walker.stamps), listed_ns),
        not_included=walker.not_included,
    )


def directive_root(directive: SourceDirective, doc_dir: Path) -> str | None:
    """The real path ``directive`` names from ``doc_dir``; ``None`` when nothing is there."""
    return source_root(directive.path, doc_dir)


def _inside(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (both real paths)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _refuse_too_wide(label: str, root: str) -> None:
    """Refuse a directive folder that is ``/``, the home folder, or above it.

    Every file a walk chooses is read into memory before tokenizing, so a
    directive over the whole machine or the whole home folder (caches,
    downloads, other projects' virtualenvs) would read gigabytes that were
    never meant as training text. No ``training.sources`` use needs that.
    """
    home = os.path.realpath(os.path.expanduser("~"))
    if os.path.dirname(root) == root:
        what = "the filesystem root"
    elif root == home:
        what = "your home folder"
    elif _inside(home, root):
        what = f"a folder above your home folder {home}"
    else:
        return
    raise SourceError(
        f"{label}: the path resolves to {root}, {what}; a directive reads every file below it into "
        "memory, so it must name a folder of training text",
        hint="point path at the folder that holds the text (e.g. ~/notes); a document kept in the "
        "home folder itself needs a folder of its own to use path: .",
    )


def _outside_message(label: str, what: str, target: str, doc_root: str) -> str:
    return (
        f"{label}: {what} resolves to {target}, outside the document's directory "
        f"{doc_root}; move it inside, or set training.sources_policy: permissive"
    )


def _kept(scope: Scope, directory: str, name: str) -> bool:
    """Whether file ``name`` in ``directory`` (relative to the root) is kept."""
    path = f"{directory}/{name}" if directory else name
    if "\n" in path:
        return scope.included_exactly(path)
    return scope.tests(directory).keeps(name)


def _nothing_below(path: str, stamps: list[tuple[str, os.stat_result]] | None = None) -> bool:
    """Whether no ``.dlm`` entry and no name with a newline lies anywhere below ``path``.

    Lists folders only to look at names; an unreadable folder counts as
    empty, as the walk could not list it either. With ``stamps``, each
    folder's ``stat`` is appended before it is listed.
    """
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            if stamps is not None:
                stamps.append((folder, os.stat(folder)))
            with os.scandir(folder) as it:
                for entry in it:
                    name = entry.name
                    if name == DLM_FOLDER or "\n" in name:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return True


_RELPATH = itemgetter(0)

#: What a directory's listing keeps, sorted by relpath (= by name): a file's
#: ``(relpath, path)`` (a :data:`ChosenFile`) or a directory's
#: ``(relpath, path, None)``.
_Item = tuple[str, str] | tuple[str, str, None]


class _Walker:
    """Mutable state of one directive's walk; its result is a frozen :class:`SourceWalk`."""

    def __init__(
        self, label: str, root: str, doc_root: str, policy: str, *, stamp_dirs: bool = False
    ) -> None:
        self.label = label
        #: ``(path, stat)`` of each folder listed; ``None`` when not asked for,
        #: and from the moment the walk meets what a folder stamp cannot vouch for.
        self.stamps: list[tuple[str, os.stat_result]] | None = [] if stamp_dirs else None
        self.boundaries = (doc_root, root)
        self.doc_root = doc_root
        self.policy = policy
        self.files: list[ChosenFile] = []
        self.warnings: list[str] = []
        self.excluded = 0
        self.not_included = 0  # of excluded: no include glob matched (dlm show says why)
        self.excluded_dirs = 0
        self.skipped_outside = 0
        self.task: Task | None = None  # the walk's progress, counted once per directory

    def walk(self, dir_abs: str, dir_rel: str, scope: Scope) -> None:
        """Append the kept files below ``dir_abs`` to ``files``, in DLM's order."""
        stamps = self.stamps
        try:
            if stamps is not None:
                stamps.append((dir_abs, os.stat(dir_abs)))  # before the listing it vouches for
            with os.scandir(dir_abs) as it:
                entries = list(it)
        except OSError as exc:
            self.warnings.append(f"{self.label}: cannot list {dir_rel or '.'}: {exc.strerror}")
            return
        items, dirs, links, excluded, has_folder, not_included = self._classify(entries, dir_rel, scope)
        if links or has_folder:  # a link's target, or a .dlm/ file's text, is not in a folder's stamp
            self.stamps = stamps = None
        if has_folder:  # rare: a .dlm/ folder opens a new scope; classify again under it
            from dlmstore.sources.config import load_folder  # pydantic and YAML: only where a .dlm/ folder is

            folder = load_folder(dir_abs, dir_rel, label=self.label)
            self.warnings.extend(folder.warnings)
            scope = scope.enter(folder)
            items, dirs, links, excluded, _, not_included = self._classify(entries, dir_rel, scope)
        self.excluded += excluded
        self.not_included += not_included
        exact = "\n" in dir_rel
        walked = 0
        for entry in dirs:
            rel = f"{dir_rel}/{entry.name}" if dir_rel else entry.name
            if not exact and "\n" not in rel and scope.may_skip(rel) and _nothing_below(entry.path, stamps):
                self.excluded_dirs += 1
            else:
                items.append((rel, entry.path, None))
                walked += 1
        for entry in links:
            self._symlink(entry.path, f"{dir_rel}/{entry.name}" if dir_rel else entry.name, scope, items)
        items.sort(key=_RELPATH)  # relpaths differ: comparing them alone is the tuples' order
        files = self.files
        if self.task is not None and self.task.reporting:
            self.task.update(len(files))
        if not walked:  # no folder to walk into: every item is a chosen file
            files.extend(cast("list[ChosenFile]", items))
            return
        for item in items:
            if len(item) == 3:  # a directory: (relpath, path, None)
                self.walk(item[1], item[0], scope)
            else:  # a file: (relpath, path), the chosen file itself
                files.append(item)

    def _classify(
        self, entries: list[os.DirEntry[str]], dir_rel: str, scope: Scope
    ) -> tuple[list[_Item], list[os.DirEntry[str]], list[os.DirEntry[str]], int, bool, int]:
        """Split one directory's entries into kept files, directories,
        symlinks, the count of files excluded, whether a ``.dlm/`` folder
        is there, and how many of the excluded no include glob matched.

        This is the hot loop of the walk: the name tests are called inline,
        and a relpath is built only for a file that is kept. A path holding a
        newline is decided in full (:meth:`~.rules.Scope.included_exactly`).
        """
        prefix = dir_rel + "/" if dir_rel else ""
        exact = "\n" in dir_rel  # DLM's "**" stops at a newline
        tests: DirTests = scope.tests("" if exact else dir_rel)
        include, exclude, ignore, negated = tests.include, tests.exclude, tests.ignore, tests.ignore_negated
        items: list[_Item] = []
        dirs: list[os.DirEntry[str]] = []
        links: list[os.DirEntry[str]] = []
        has_folder = False
        excluded = not_included = 0
        for entry in entries:
            name = entry.name
            if entry.is_file(follow_symlinks=False):
                if exact or "\n" in name:
                    keep = scope.included_exactly(prefix + name)
                elif include is not None and not include(name):
                    keep = False
                    not_included += 1
                elif ignore is not None and (found := ignore(name)) is not None:
                    keep = negated[found.lastindex or 0]
                else:
                    keep = exclude is None or not exclude(name)
                if keep:
                    items.append((prefix + name, entry.path))
                else:
                    excluded += 1
            elif entry.is_dir(follow_symlinks=False):
                dirs.append(entry)
                if name == DLM_FOLDER:
                    has_folder = True
            elif entry.is_symlink():
                links.append(entry)
                if name == DLM_FOLDER and entry.is_dir():
                    has_folder = True
            # sockets, FIFOs and devices are never sources
        return items, dirs, links, excluded, has_folder, not_included

    def _symlink(self, path: str, rel: str, scope: Scope, items: list[_Item]) -> None:
        """Apply the symlink policy to one link, appending a followed file to ``items``."""
        try:
            target = os.path.realpath(path, strict=True)
            mode = os.stat(target).st_mode
        except OSError:
            self.warnings.append(f"{self.label}: skipping {rel}: broken symlink")
            return
        if stat.S_ISDIR(mode):
            self.excluded_dirs += 1  # warn only if it would have been walked
            if "\n" in rel or not scope.may_skip(rel):
                self.warnings.append(f"{self.label}: not following symlinked directory {rel}")
            return
        if not stat.S_ISREG(mode):
            return
        directory, _, name = rel.rpartition("/")
        if not _kept(scope, directory, name):
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
