"""BM25 over a JSONL corpus with ``bm25s``, with an on-disk index keyed by the corpus' content hash."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np

from score_lightning.data.corpus import Document, load_corpus
from score_lightning.files import file_sha256
from score_lightning.retrieval.base import SearchHit

log = logging.getLogger(__name__)

#: Bump when tokenisation changes, so saved indexes built the old way are rebuilt.
TOKENIZER_VERSION = 1
META_FILE = "score_index_meta.json"

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CAMEL_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def expand_identifiers(text: str) -> str:
    """Append the parts of snake_case / CamelCase identifiers, so ``OrderedDict`` is also found
    by "ordered dict" and ``move_to_end`` by "move end" (the whole identifier stays a token too)."""
    extra: list[str] = []
    for ident in _IDENT_RE.findall(text):
        if "_" in ident.strip("_") or (any(c.isupper() for c in ident[1:]) and any(c.islower() for c in ident)):
            extra.extend(_CAMEL_RE.findall(ident.replace("_", " ")) if "_" in ident else _CAMEL_RE.findall(ident))
    return text if not extra else f"{text}\n{' '.join(extra)}"


def s_stem(words: list[str]) -> list[str]:
    """Harman's "S" stemmer: folds English plurals ("queues" -> "queue") and nothing else.

    Light on purpose: PyStemmer is not a dependency, and an aggressive stemmer would mangle the
    identifiers this corpus is full of. (It does fold ``dumps`` into ``dump``; the docstrings
    still tell those two apart.)
    """
    out = []
    for w in words:
        if len(w) > 3 and w.endswith("ies") and not w.endswith(("eies", "aies")):
            w = w[:-3] + "y"
        elif len(w) > 3 and w.endswith("es") and not w.endswith(("aes", "ees", "oes")):
            w = w[:-1]
        elif len(w) > 3 and w.endswith("s") and not w.endswith(("us", "ss")):
            w = w[:-1]
        out.append(w)
    return out


def tokenize(texts: list[str]) -> list[list[str]]:
    """bm25s' tokenizer (scikit-learn pattern, English stopwords) plus identifier splitting."""
    import bm25s

    toks = bm25s.tokenize(
        [expand_identifiers(t) for t in texts], stopwords="en", stemmer=s_stem,
        return_ids=False, show_progress=False,
    )
    return [[t for t in doc if t] for doc in toks]


def _doc_text(doc: Document) -> str:
    # The dotted title is indexed with its parts split on dots/underscores/case ("collections
    # ordered dict"), so a name-only query finds the right entry.
    return f"{doc.title} {doc.title.replace('.', ' ')}\n{doc.text}"


class BM25Retriever:
    """BM25 retriever over a ``{"id", "contents"}`` JSONL corpus.

    With ``index_dir``, the index is saved there together with the corpus' SHA-256 and the BM25
    parameters; a later run with the same corpus loads it instead of re-indexing, and any change
    to the corpus file triggers a rebuild.
    """

    def __init__(self, corpus_path: str | Path, index_dir: str | Path | None = None,
                 k1: float = 1.5, b: float = 0.75) -> None:
        import bm25s

        self.corpus_path = Path(corpus_path)
        self.docs = load_corpus(self.corpus_path)
        self.k1, self.b = float(k1), float(b)
        self._lock = threading.Lock()
        self.loaded_from_disk = False
        meta = {
            "corpus_sha256": file_sha256(self.corpus_path), "num_docs": len(self.docs),
            "k1": self.k1, "b": self.b, "tokenizer_version": TOKENIZER_VERSION,
        }
        self.index_dir = Path(index_dir) if index_dir is not None else None
        if self.index_dir is None:
            self._bm25 = self._build()
            return
        # Several processes (DDP ranks, a server) may share index_dir: one builds, the rest load.
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.index_dir.with_name(f".{self.index_dir.name}.lock"), "w") as lock_fh:
            fcntl.flock(lock_fh, fcntl.LOCK_EX)
            try:
                if self._saved_meta() == meta:
                    try:
                        self._bm25 = bm25s.BM25.load(str(self.index_dir), show_progress=False)
                        self.loaded_from_disk = True
                        return
                    except Exception as exc:  # noqa: BLE001 - a damaged index is rebuilt, not fatal
                        log.warning("could not load BM25 index from %s (%s); rebuilding", self.index_dir, exc)
                self._bm25 = self._build()
                self._save(meta)
            finally:
                fcntl.flock(lock_fh, fcntl.LOCK_UN)

    def _build(self):
        import bm25s

        bm25 = bm25s.BM25(k1=self.k1, b=self.b)
        bm25.index(tokenize([_doc_text(d) for d in self.docs]), show_progress=False)
        return bm25

    def _saved_meta(self) -> dict | None:
        try:
            return json.loads((self.index_dir / META_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _save(self, meta: dict) -> None:
        # The meta file is written last and atomically: its presence means the index is complete.
        assert self.index_dir is not None
        if self.index_dir.exists():
            (self.index_dir / META_FILE).unlink(missing_ok=True)
        tmp_dir = self.index_dir.with_name(f".{self.index_dir.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp_dir, ignore_errors=True)
        self._bm25.save(str(tmp_dir), show_progress=False)
        self.index_dir.mkdir(parents=True, exist_ok=True)
        for f in tmp_dir.iterdir():
            os.replace(f, self.index_dir / f.name)
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_meta = self.index_dir / f".{META_FILE}.{os.getpid()}.tmp"
        tmp_meta.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp_meta, self.index_dir / META_FILE)

    def __len__(self) -> int:
        return len(self.docs)

    def search(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        """Top ``topk`` documents per query by BM25 score (ties: corpus order); only docs that
        share a term with the query are returned, so an empty or all-stopword query gives ``[]``."""
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, not a single string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        results: list[list[SearchHit]] = []
        with self._lock:
            vocab = self._bm25.vocab_dict
            for toks in tokenize(list(queries)) if queries else []:
                ids = [vocab[t] for t in toks if t in vocab]
                if not ids:
                    results.append([])
                    continue
                scores = np.asarray(self._bm25.get_scores_from_ids(ids), dtype=np.float64)
                k = min(topk, int((scores > 0).sum()))
                if k == 0:
                    results.append([])
                    continue
                # Every doc scoring at least the k-th best, then a stable sort (score desc, corpus
                # position): ties at the cut-off never depend on argpartition's internal order.
                kth = -np.partition(-scores, k - 1)[k - 1]
                cand = sorted(np.nonzero(scores >= kth)[0].tolist(), key=lambda i: (-scores[i], i))[:k]
                results.append([
                    SearchHit(id=self.docs[i].id, contents=self.docs[i].contents, score=float(scores[i]))
                    for i in cand
                ])
        return results
