"""Writing a checkpoint so that nothing the user had is lost and nothing half-written is left.

The checkpoint is written into a hidden directory beside ``--out`` (``.NAME.reluize-*``), complete, then moved
into place in one step: renamed when ``--out`` does not exist, atomically exchanged with an earlier conversion
under ``--overwrite`` (Linux's ``renameat2``; elsewhere two renames, which the next run completes if it was
interrupted between them). ``--overwrite`` replaces only a directory that an earlier conversion wrote, and only
when it holds nothing else: files the user added there are named and the run refused. Hidden directories that a
killed run left beside ``--out`` are removed by the next run, which says so.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import CheckpointError

__all__ = ["prepare_out", "write_atomically", "files_in", "listed_files", "REPORT", "DEPLOY_REPORT"]

REPORT = "reluize_report.json"
DEPLOY_REPORT = "deploy_report.json"  # what `lambda-gelu deploy DIR` adds to a conversion, with the files it wrote
_MARK = ".reluize-partial"  # inside every hidden directory a run makes: what the next run may remove
_PREFIX = "reluize-"


def prepare_out(out: str | os.PathLike, overwrite: bool) -> Path:
    """``out`` checked before any work: not a file, writable, empty or (with ``overwrite``) an earlier
    conversion holding only what it wrote; leftovers of killed runs beside it removed (each named on stderr)."""
    path = Path(out)
    if path.is_symlink():  # the directory it links to is what is replaced: the link then names the new conversion
        if not path.is_dir():
            raise CheckpointError(f"--out {out} is a link to {os.readlink(path)}, which is not a directory")
        path = path.resolve()
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"--out {out} is a file, not a directory")
    parent = path.absolute().parent
    _recover(path)
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise CheckpointError(f"--out {out} exists and is not empty: choose another, or add --overwrite to "
                                  "replace it")
        if not (path / REPORT).is_file():  # the source model, or anything else the user keeps
            raise CheckpointError(f"--out {out} holds files that are not an earlier conversion (no {REPORT}): "
                                  "--overwrite replaces only an earlier conversion's directory; choose another --out")
        extra = _not_written_by_conversion(path)
        if extra:
            raise CheckpointError(f"--out {out} holds files an earlier conversion did not write "
                                  f"({', '.join(extra[:3])}{', …' if len(extra) > 3 else ''}); --overwrite would "
                                  "delete them: move them out, or choose another --out")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_PREFIX}", dir=parent))
        probe.rmdir()
    except OSError as e:
        raise CheckpointError(f"--out {out}: cannot write beside it in {parent} ({e.strerror or e}); choose "
                              "another --out") from None
    return path


def write_atomically(target: Path, fill) -> list[str]:
    """Call ``fill(tmp)`` to write the checkpoint into a fresh hidden directory beside ``target``, then put it in
    place in one step (see the module's docstring). Returns the files written, relative to ``target``."""
    parent = target.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{_PREFIX}", dir=parent))
    try:
        (tmp / _MARK).touch()
        fill(tmp)
        (tmp / _MARK).unlink()
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it 0700; a checkpoint is as readable as any new directory
        files = files_in(tmp)
        if target.exists():
            (target / _MARK).touch()  # once exchanged into tmp, the old conversion is removable if we die then
            _exchange(tmp, target)
        else:
            os.replace(tmp, target)
        return files
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def files_in(directory: Path) -> list[str]:
    """The files under ``directory``, relative to it, as a conversion's report lists them."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file() and p.name != _MARK)


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step where the system can (renameat2 RENAME_EXCHANGE); else two renames,
    the second completed by :func:`_recover` if the process dies between them."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = getattr(libc, "renameat2", None)
        if renameat2 is not None:
            at_fdcwd, rename_exchange = -100, 2
            if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
                return
    old = b.with_name(f".{b.name}.{_PREFIX}old")
    os.replace(b, old)
    os.replace(a, b)
    os.rename(old, a)


def _recover(target: Path) -> None:
    """What a killed run left beside ``target``: an earlier conversion moved aside and not back (the fallback
    exchange) is put back; every other hidden directory of ours is removed. Each is said on stderr."""
    parent = target.absolute().parent
    if not parent.is_dir():
        return
    old = parent / f".{target.name}.{_PREFIX}old"
    if old.is_dir() and not target.exists():
        (old / _MARK).unlink(missing_ok=True)
        os.replace(old, target)
        print(f"note: {target} was restored from {old.name}, where an interrupted --overwrite had left it",
              file=sys.stderr)
    for leftover in parent.glob(f".{target.name}.{_PREFIX}*"):
        if leftover.is_dir() and (leftover / _MARK).exists():
            if leftover.is_symlink():  # a link moved aside (before --out's links were followed): the link alone
                leftover.unlink()
            else:
                shutil.rmtree(leftover, ignore_errors=True)
            if not leftover.exists() and not leftover.is_symlink():
                print(f"note: removed {leftover}, left by an interrupted conversion", file=sys.stderr)


# what save_pretrained, a tokenizer and sentence-transformers write, whole names, for conversions that predate the
# file list: a user's file that only begins like one (tokenizer_notes.txt, model-card.md) is not among them
_KNOWN = re.compile(r"config\.json|generation_config\.json|model\.safetensors(\.index\.json)?"
                    r"|model-\d{5}-of-\d{5}\.safetensors|pytorch_model\.bin(\.index\.json)?"
                    r"|pytorch_model-\d{5}-of-\d{5}\.bin|tokenizer\.json|tokenizer_config\.json|tokenizer\.model"
                    r"|vocab\.(json|txt)|merges\.txt|special_tokens_map\.json|added_tokens\.json|spiece\.model"
                    r"|sentencepiece\.bpe\.model|chat_template\.(jinja|json)|modules\.json|sentence_bert_config\.json"
                    r"|config_sentence_transformers\.json|reluize_report\.(json|md)")


def listed_files(report: Path) -> list[str] | None:
    """The files a report (a conversion's or a deploy's JSON) says its run wrote; None without a readable list."""
    try:
        files = json.loads(report.read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, list) else None


def _not_written_by_conversion(path: Path) -> list[str]:
    """The files in ``path`` that the conversion which wrote it did not (its report lists what it wrote)."""
    present = files_in(path)  # a marker left by a run killed just before its exchange does not count
    written = listed_files(path / REPORT)
    if written is not None:  # and what `lambda-gelu deploy DIR` wrote into it since
        written = set(written) | set(listed_files(path / DEPLOY_REPORT) or [])
        return [f for f in present if f not in written]
    modules = []
    try:
        modules = [m["path"] for m in json.loads((path / "modules.json").read_text(encoding="utf-8")) if m["path"]]
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return [f for f in present if not _KNOWN.fullmatch(f) and not any(f.startswith(m + "/") for m in modules)]
