"""Retrieval corpora: the JSONL ``{"id", "contents"}`` format and the offline stdlib-docstring corpus.

``contents`` is ``'"Title"\\ntext'`` (the Search-R1 / FlashRAG convention), so corpora built here load
in those servers and theirs load here. The default corpus is made from the Python standard library's
own docstrings: real technical prose that exists, offline, on every machine that runs this code.

The builder runs in a *subprocess* (this file, executed with ``python -I``): importing the whole
stdlib has side effects (``antigravity`` opens a browser, ``this`` prints, GUI modules want a display)
that must never touch the training process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Ids the stdlib builder emits (dotted names, ``-N`` chunk suffixes); reports cite them as ``[id]``.
DOC_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
#: Ids ``load_corpus`` accepts: anything citable as ``[id]`` (no whitespace, no brackets). Wider
#: than ``DOC_ID_RE`` because Search-R1's wiki corpora use digit-string ids ("0", "1", ...).
LOADABLE_ID_RE = re.compile(r"[^\s\[\]]+")
#: Bump when the builder's output changes, so cached corpora are rebuilt.
STDLIB_CORPUS_VERSION = 1
CACHE_ENV = "SCORE_LIGHTNING_CACHE"


class DataFormatError(ValueError):
    """A malformed line in a data file; the message starts with ``"{path}:{lineno}: "``."""

    def __init__(self, path: str | Path, lineno: int, message: str) -> None:
        self.path, self.lineno = str(path), lineno
        super().__init__(f"{path}:{lineno}: {message}")


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1 / FlashRAG ``contents``: the quoted title, a newline, then the text."""
        return f'"{self.title}"\n{self.text}'


def parse_contents(contents: str) -> tuple[str, str]:
    """Split ``'"Title"\\ntext'`` into ``(title, text)``; tolerate a missing newline or quotes.

    Without a newline the whole string is the text (title ``""``), because foreign corpora often
    store bare passages.
    """
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    title = head.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, rest


def iter_jsonl(path: Path):
    """Yield ``(lineno, obj)`` for every non-blank line; bad JSON is a ``DataFormatError``."""
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def load_corpus(path: str | Path) -> list[Document]:
    """Load and validate a JSONL corpus of ``{"id", "contents"}`` lines (extra fields are ignored).

    Every line is checked, because a bad line found mid-training would cost a whole run.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        if "id" not in obj:
            raise DataFormatError(path, lineno, 'missing field "id" (each line needs "id" and "contents")')
        if "contents" not in obj:
            raise DataFormatError(path, lineno, 'missing field "contents" (each line needs "id" and "contents")')
        doc_id, contents = obj["id"], obj["contents"]
        if isinstance(doc_id, int) and not isinstance(doc_id, bool):
            doc_id = str(doc_id)
        if not isinstance(doc_id, str) or not LOADABLE_ID_RE.fullmatch(doc_id):
            raise DataFormatError(
                path, lineno,
                f"invalid id {doc_id!r}: ids are cited as [id], so they must be non-empty strings "
                "(or integers) without whitespace or square brackets",
            )
        if not isinstance(contents, str) or not contents.strip():
            raise DataFormatError(path, lineno, f'"contents" must be a non-empty string, got {contents!r:.60}')
        if doc_id in seen:
            raise DataFormatError(path, lineno, f"duplicate id {doc_id!r} (first seen on line {seen[doc_id]})")
        seen[doc_id] = lineno
        title, text = parse_contents(contents)
        docs.append(Document(id=doc_id, title=title, text=text))
    if not docs:
        raise DataFormatError(path, 1, "corpus is empty")
    return docs


# --------------------------------------------------------------------------------------------
# stdlib corpus
# --------------------------------------------------------------------------------------------

def build_stdlib_corpus(out_path: str | Path, max_words: int = 120, timeout_s: float = 300.0) -> Path:
    """Build the stdlib-docstring corpus at ``out_path`` (atomically) and return the path.

    The work happens in a child interpreter so that imports with side effects stay there.
    """
    if max_words < 10:
        raise ValueError(f"max_words must be >= 10, got {max_words}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    cmd = [sys.executable, "-I", "-W", "ignore", str(Path(__file__).resolve()), "--worker", str(tmp), str(max_words)]
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s, env=env,
        )
        if proc.returncode != 0 or not tmp.is_file():
            raise RuntimeError(
                f"building the stdlib corpus failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
            )
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def default_corpus_path(cache_dir: str | Path | None = None) -> Path:
    """Path of the stdlib corpus in the cache, building it first if it is missing.

    The file name carries the Python version and builder version, because docstrings differ
    between interpreters and a stale cache must not be mistaken for a fresh one.
    """
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "score_lightning"
    v = sys.version_info
    path = Path(cache_dir) / f"stdlib_corpus_py{v.major}{v.minor}_v{STDLIB_CORPUS_VERSION}.jsonl"
    if not path.is_file():
        build_stdlib_corpus(path)
    return path


# Everything below runs only in the child interpreter (``python -I corpus.py --worker ...``) and
# uses the stdlib alone, so the child never imports score_lightning, torch or the caller's state.

#: Modules never imported: side effects (browser, printing, displays), tests, platform-specific.
_DENY = frozenset({
    "__main__", "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "tests",
    "lib2to3", "ensurepip", "pydoc_data", "readline", "msvcrt", "winreg", "winsound", "nt", "msilib",
    "_msi", "_winapi", "_overlapped", "encodings", "xxsubtype", "xxlimited", "xxlimited_35",
    "idle_test", "venv", "site", "sitecustomize", "usercustomize", "posix", "ntpath", "curses",
    # PEP 594 "dead batteries" and other removed modules: noise that a newer Python lacks.
    "aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "distutils", "imghdr",
    "imp", "mailcap", "nis", "nntplib", "ossaudiodev", "pipes", "smtpd", "sndhdr", "spwd", "sunau",
    "telnetlib", "uu", "xdrlib",
})
#: Modules indexed under the name users know them by.
_RENAME = {"posixpath": "os.path"}
#: Private / platform modules whose objects are documented under a public module (``posix.stat``
#: is ``os.stat``, ``_functools.reduce`` is ``functools.reduce``).
_HIDDEN_OWNERS = frozenset({"posix", "nt"})
_MAX_SUBMODULE_DEPTH = 2  # concurrent.futures, xml.etree.ElementTree
_MIN_WORDS = 4  # shorter docstrings ("Return self==value.") carry no information
_MIN_METHOD_WORDS = 20  # methods are many; keep those that explain something


def _split_passages(doc: str, max_words: int) -> list[str]:
    """Greedily pack paragraphs into passages of at most ``max_words`` words; split long paragraphs."""
    pieces: list[list[str]] = []
    for para in re.split(r"\n\s*\n", doc):
        words = para.split()
        for i in range(0, len(words), max_words):
            pieces.append(words[i:i + max_words])
    passages: list[str] = []
    cur: list[str] = []
    cur_words = 0
    for words in pieces:
        if cur and cur_words + len(words) > max_words:
            passages.append("\n\n".join(cur))
            cur, cur_words = [], 0
        cur.append(" ".join(words))
        cur_words += len(words)
    if cur:
        passages.append("\n\n".join(cur))
    return passages


def _own_doc(obj: object, min_words: int = _MIN_WORDS) -> str | None:
    """The object's own docstring, cleaned like ``inspect.getdoc`` but never inherited.

    ``getdoc`` would hand every undocumented exception ``Exception``'s docstring. A class without
    a docstring falls back to its ``__init__``'s (``ThreadPoolExecutor`` documents itself there).
    """
    import inspect

    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        init = obj.__dict__.get("__init__")
        if not isinstance(doc, str) and init is not None:
            doc = getattr(init, "__doc__", None)
    else:
        doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str):
        return None
    doc = inspect.cleandoc(doc).strip()
    # Hex addresses in reprs would make the corpus differ between runs.
    doc = re.sub(r" at 0x[0-9a-fA-F]+", "", doc)
    return doc if len(doc.split()) >= min_words else None


def _public_names(mod) -> list[str]:
    names = getattr(mod, "__all__", None)
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        names = [n for n in vars(mod) if not n.startswith("_")]
    return sorted(set(names))


def _iter_modules(names: list[str]):
    """Import each top-level module and its public submodules (depth-limited), in sorted order."""
    import importlib
    import pkgutil

    def visit(name: str, depth: int):
        try:
            mod = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - platform-specific or broken modules are skipped
            return
        yield name, mod
        path = getattr(mod, "__path__", None)
        if path is None or depth >= _MAX_SUBMODULE_DEPTH:
            return
        subs = sorted(
            m.name for m in pkgutil.iter_modules(path)
            if not m.name.startswith("_") and m.name not in _DENY and "win" not in m.name.split("_")
        )
        for sub in subs:
            yield from visit(f"{name}.{sub}", depth + 1)

    for name in names:
        yield from visit(name, 0)


def _worker(out: str, max_words: int) -> None:
    """Child-process entry point: write the corpus JSONL to ``out``.

    An object reachable from several modules (``threading.Lock`` is also
    ``multiprocessing.dummy.Lock``) is indexed once, under the name a user would search for: a
    module of its own package first, then the shallowest module, then alphabetical order.
    """
    import inspect

    top = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in _DENY)
    keep: list = []  # keeps visited objects alive so their id() stays unique
    modules: dict[int, tuple[str, object]] = {}
    best: dict[int, tuple[tuple, str, object]] = {}
    for real_name, mod in _iter_modules(top):
        if id(mod) in modules:
            continue
        modname = _RENAME.get(real_name, real_name)
        modules[id(mod)] = (modname, mod)
        keep.append(mod)
        root = real_name.split(".")[0]
        for attr in _public_names(mod):
            try:
                obj = getattr(mod, attr)
            except BaseException:  # noqa: BLE001 - lazy attributes may fail; skip them
                continue
            if inspect.ismodule(obj) or not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            qual = f"{modname}.{attr}"
            if not DOC_ID_RE.fullmatch(qual):
                continue
            owner_root = (getattr(obj, "__module__", None) or "").split(".")[0]
            own = owner_root == root or real_name == "builtins"
            if not (own or owner_root.startswith("_") or owner_root in _HIDDEN_OWNERS):
                continue  # re-exported from another public module; indexed under that one
            canonical = getattr(obj, "__name__", None) == attr  # array.array over array.ArrayType
            rank = (0 if own else 1, modname.count("."), 0 if canonical else 1, qual)
            if id(obj) not in best or rank < best[id(obj)][0]:
                best[id(obj)] = (rank, qual, obj)
                keep.append(obj)

    entries: list[tuple[str, object, int]] = [(name, mod, _MIN_WORDS) for name, mod in modules.values()]
    for _, qual, obj in best.values():
        entries.append((qual, obj, _MIN_WORDS))
        if inspect.isclass(obj):
            for mname, member in obj.__dict__.items():
                if mname.startswith("_"):
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if inspect.isroutine(member) or isinstance(member, property):
                    entries.append((f"{qual}.{mname}", member, _MIN_METHOD_WORDS))
    entries.sort(key=lambda e: e[0])

    seen_texts: set[str] = set()
    used_ids: set[str] = set()
    records: list[tuple[str, str]] = []
    for name, obj, min_words in entries:
        doc = _own_doc(obj, min_words)
        if doc is None or doc in seen_texts or name in used_ids:
            continue
        seen_texts.add(doc)
        used_ids.add(name)
        for i, passage in enumerate(_split_passages(doc, max_words)):
            records.append((name if i == 0 else f"{name}-{i + 1}", passage))

    with open(out, "w", encoding="utf-8") as fh:
        for doc_id, text in records:
            line = {"id": doc_id, "contents": Document(doc_id, doc_id.split("-")[0], text).contents,
                    "source": "python-stdlib"}
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], int(sys.argv[3]))
