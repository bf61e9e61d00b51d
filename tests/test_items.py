"""Evidence-backed rubric items: the verifier on hand-built reports, the file format, the deterministic builder
(BM25 and a real /retrieve server on loopback), the packaged set, and the items ``rubric=given`` loads."""

from __future__ import annotations

import json

import pytest

from score_lightning.data.corpus import DataFormatError
from score_lightning.data.items import (
    EMBEDDED_ITEMS_MANIFEST, EMBEDDED_ITEMS_PATH, EvidenceItem, QueryItems, file_digest, items_lines, load_items,
    text_digest)
from score_lightning.rewards.items import item_check, item_recall, item_satisfied, satisfied_items

ITEM = EvidenceItem(text="Cites heapq.heappush for pushing onto the heap", evidence=("heapq.heappush", "heapq-2"),
                    terms=("maintaining", "invariant"))


# ---------------------------------------------------------------------------- the verifier
def test_an_item_needs_its_passage_cited_retrieved_and_its_terms_stated():
    good = "Pushing keeps order, maintaining the heap Invariant [heapq.heappush]. Conclusion: use heapq."
    assert item_check(ITEM, good, ["heapq.heappush", "os.path"]) == {
        "cited": True, "retrieved": True, "stated": True, "satisfied": True}
    # cited, but its own searches never returned it
    assert item_check(ITEM, good, ["os.path"]) == {"cited": True, "retrieved": False, "stated": True,
                                                   "satisfied": False}
    # cited and retrieved, one term missing
    missing = "Pushing keeps order, maintaining the heap [heapq.heappush]."
    assert item_check(ITEM, missing, ["heapq.heappush"])["stated"] is False
    assert not item_satisfied(ITEM, missing, ["heapq.heappush"])
    # the terms stated, but another passage cited (even a retrieved one)
    assert not item_satisfied(ITEM, "maintaining the invariant [os.path].", ["os.path", "heapq.heappush"])
    # any one of the evidence ids will do; terms stand beside another script with no space between
    assert item_satisfied(ITEM, "堆maintaining不变量invariant的说明 [heapq-2]。", ["heapq-2"])
    chinese = EvidenceItem("c", ("heapq-2",), ("不变量",))
    assert item_satisfied(chinese, "插入时保持堆的不变量 [heapq-2]。", ["heapq-2"])
    assert not item_satisfied(chinese, "插入时保持堆的顺序 [heapq-2]。", ["heapq-2"])
    # a citation with no space before it (Chinese prose, or an id the trajectory retrieved) is read
    assert item_satisfied(chinese, "插入时保持堆的不变量[heapq-2]。", ["heapq-2"])
    assert item_satisfied(ITEM, "maintaining the invariant[heapq-2].", ["heapq-2"])


def test_terms_are_whole_words_and_never_read_from_the_citation_itself():
    item = EvidenceItem("Cites x for dumps", ("json.dumps",), ("dumps",))
    assert not item_satisfied(item, "Serialises objects [json.dumps].", ["json.dumps"])  # only inside [...]
    assert not item_satisfied(item, "It dumpster-dives [json.dumps].", ["json.dumps"])  # not a whole word
    assert item_satisfied(item, "DUMPS writes text [json.dumps].", ["json.dumps"])  # case-insensitive
    assert item_satisfied(EvidenceItem("c", ("a",), ()), "Only a citation [a].", ["a"])  # a term-less item


def test_item_recall_is_the_share_satisfied_and_zero_unless_grounded_valid():
    other = EvidenceItem("t", ("os.path",), ("joins",))
    third = EvidenceItem("t", ("never.cited",), ("nothing",))
    report = "It joins paths [os.path] while maintaining the invariant [heapq.heappush]."
    retrieved = ["os.path", "heapq.heappush"]
    assert satisfied_items([ITEM, other, third], report, retrieved) == [True, True, False]
    assert item_recall([ITEM, other, third], report, retrieved, grounded_valid=True) == pytest.approx(2 / 3)
    assert item_recall([ITEM, other, third], report, retrieved, grounded_valid=False) == 0.0
    assert item_recall([], report, retrieved, grounded_valid=True) is None


# ---------------------------------------------------------------------------- the format
def test_items_round_trip_and_bad_lines_name_file_and_line(tmp_path):
    q = QueryItems("q1", "What is heapq?", [ITEM], {"split": "heldout", "topic": "heapq"})
    path = tmp_path / "items.jsonl"
    path.write_text(items_lines([q]), encoding="utf-8")
    back = load_items(path)["q1"]
    assert back.items == [ITEM] and back.extra == {"split": "heldout", "topic": "heapq"} and back.prompt == q.prompt
    assert file_digest(path) == text_digest(items_lines([q]))
    bad = dict(q.to_dict(), rubrics=[{"text": "no evidence", "weight": 1.0}])
    path.write_text(json.dumps(q.to_dict()) + "\n" + json.dumps(dict(bad, id="q2")) + "\n")
    with pytest.raises(DataFormatError, match=r"items.jsonl:2: rubrics\[0\] has no \"evidence\""):
        load_items(path)
    path.write_text(json.dumps(dict(q.to_dict(), rubrics=[dict(ITEM.to_dict(), evidence=[])])) + "\n")
    with pytest.raises(DataFormatError, match=r":1: rubrics\[0\].evidence must be a non-empty list"):
        load_items(path)


# ---------------------------------------------------------------------------- the packaged set
def test_the_embedded_items_cover_every_query_with_its_split_and_cite_real_passages(corpus_file):
    from score_lightning.data.corpus import load_corpus
    from score_lightning.data.queries import load_queries

    items, queries = load_items(), load_queries(None)
    assert [q.id for q in queries] == list(items)  # the same 60 ids, in order
    corpus_ids = {d.id for d in load_corpus(corpus_file)}
    for q in queries:
        entry = items[q.id]
        assert entry.prompt == q.prompt and entry.extra.get("split") == q.extra.get("split")
        assert len(entry.items) >= 3 and all(set(it.evidence) <= corpus_ids for it in entry.items), q.id
        tree_ids = {p for node in entry.extra["tree"] for p in node["passages"]}
        assert all(set(it.evidence) <= tree_ids for it in entry.items)  # every item is a leaf of its own tree
    held = [items[q.id] for q in queries if q.extra.get("split") == "heldout"]
    assert len(held) == 20 and sum(bool(it.terms) for e in held for it in e.items) >= 3 * 20


def test_the_builder_is_deterministic_and_rebuilds_the_packaged_file(bm25, corpus_file):
    """Two builds, one digest; and the packaged file is exactly what its own command builds here (when this
    interpreter's stdlib corpus is the one the manifest records)."""
    from score_lightning.data.corpus import load_corpus
    from score_lightning.data.queries import load_queries
    from score_lightning.evaluation.items.build import BuildSettings, build_items

    manifest = json.loads(EMBEDDED_ITEMS_MANIFEST.read_text())
    assert manifest["items"]["digest"] == file_digest(EMBEDDED_ITEMS_PATH)
    assert manifest["command"].startswith("python scripts/build_rubrics.py")
    known = frozenset(d.id for d in load_corpus(corpus_file))
    queries = [(q.id, q.prompt, q.extra) for q in load_queries(None)]
    settings = BuildSettings(**manifest["settings"])
    a = items_lines(build_items(queries, bm25, known, settings))
    b = items_lines(build_items(queries, bm25, known, settings))
    assert text_digest(a) == text_digest(b)
    if manifest["corpus"]["digest"] != file_digest(corpus_file):
        pytest.skip(f"this interpreter's stdlib corpus differs from the one the items were built on "
                    f"({manifest['python']}); the rebuild is compared on that interpreter only")
    assert text_digest(a) == manifest["items"]["digest"]


def test_build_rubrics_script_on_a_user_corpus_and_topics(tmp_path):
    """The script on a small corpus of its own: a synthesised query per topic names exactly the passages its
    items check, the manifest records every input's digest, and --check compares."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    docs = [("kv.put", "Store a value under a key, replacing the previous value."),
            ("kv.get", "Fetch the value stored under a key, or a default."),
            ("kv.scan", "Iterate over keys in sorted order between two bounds."),
            ("log.append", "Append a record durably to the write-ahead journal.")]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": f'"{i}"\n{t}'}) + "\n" for i, t in docs))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "u1", "prompt": "How do kv.put and kv.get store and fetch values?"}) + "\n")
    (tmp_path / "topics.txt").write_text("kv\n")
    out = tmp_path / "items.jsonl"
    cmd = [sys.executable, "scripts/build_rubrics.py", "--queries", str(queries), "--corpus", str(corpus),
           "--topics", str(tmp_path / "topics.txt"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    items = load_items(out)
    assert set(items) == {"u1", "syn-kv"}
    assert {it.evidence[0] for it in items["u1"].items} >= {"kv.put", "kv.get"}
    syn = items["syn-kv"]
    assert syn.extra["split"] == "train" and syn.extra["synthesised"] is True
    assert all(it.evidence[0] in syn.prompt for it in syn.items) and len(syn.items) >= 2
    man = json.loads(out.with_suffix(".manifest.json").read_text())
    assert man["corpus"]["digest"] == file_digest(corpus) and man["queries"]["digest"] == file_digest(queries)
    assert proc.stdout.strip().splitlines()[-1] == f"items={man['items']['count']} queries=2 digest={file_digest(out)}"
    check = subprocess.run(cmd + ["--check"], cwd=root, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.startswith("same"), check.stdout + check.stderr[-1000:]


def test_a_retrieve_server_builds_the_same_items_as_the_index_it_serves(bm25):
    """``--retriever-url``: the builder over a real /retrieve server on loopback equals the builder over the
    same BM25 index in process (both without the corpus' id list, which a server does not give)."""
    from score_lightning.evaluation.items.synthesis import query_items
    from score_lightning.retrieval.http import HTTPRetriever
    from score_lightning.launch.retrieval_server import make_app, serve_in_thread

    prompt = "How do heapq and queue.PriorityQueue differ as priority queues?"
    server, base = serve_in_thread(make_app(bm25))
    try:
        remote = query_items("h", prompt, HTTPRetriever(base + "/retrieve"), frozenset())
    finally:
        server.should_exit = True
    local = query_items("h", prompt, bm25, frozenset())
    assert remote.to_dict() == local.to_dict() and len(local.items) >= 3


def test_rubric_given_loads_the_items_file_as_binary_checklists():
    from score_lightning.methods.given.rubrics import load_given_rubrics

    rubrics = load_given_rubrics(EMBEDDED_ITEMS_PATH)
    items = load_items()
    assert set(rubrics) == set(items)
    r = rubrics["q003"]
    assert r.binary and r.texts == tuple(it.text for it in items["q003"].items)
    assert sum(r.weights) == pytest.approx(1.0)


def test_items_pass_their_own_verifier_on_the_cold_start_reference_answers(tokenizer, bm25):
    """Every solver demonstration that cites an item's supporting passage satisfies that item."""
    from score_lightning.data.queries import load_queries
    from score_lightning.roles.answer import parse_answer
    from score_lightning.sft.demos import build_demos
    from test_sft import BASE, BUDGETS

    items = {e.prompt: e.items for e in load_items().values()}
    demos, _ = build_demos(tokenizer, bm25, [q.prompt for q in load_queries(None)], BUDGETS, 48, 0, 0, seed=3,
                           base_state=BASE, per_prompt={"solver": 4})
    checked = 0
    for d in demos:
        answer = d.meta["answer"]
        cited = set(parse_answer(f"<answer>{answer}</answer>", False).cited_ids)
        for it in items[d.meta["query"]]:
            if cited & set(it.evidence):
                checked += 1
                assert item_check(it, answer, d.meta["retrieved_ids"])["satisfied"], (it, answer)
    assert checked >= 10


def test_rewording_keeps_evidence_and_terms_and_counts_what_it_could_not_reword():
    """--reword-*: an OpenAI-compatible server (real HTTP on loopback) rewords the text; a reply that drops a
    term is re-asked with the reason; one that never complies keeps the programmatic text, counted by kind."""
    from openai_stub import OpenAIStub, Reply
    from score_lightning.clients.chat import ChatClient
    from score_lightning.evaluation.items.reword import reword_items

    keep = EvidenceItem("Cites a.b for x", ("a.b",), ("alpha",))
    stubborn = EvidenceItem("Cites c.d for y", ("c.d",), ("gamma",))
    queries = [QueryItems("q", "p", [keep, stubborn])]

    def reply(request):
        asked = json.loads(request["messages"][1]["content"])
        if asked["id"] == "a.b":
            return json.dumps({"text": "The report must state alpha and cite a.b."})
        return json.dumps({"text": "The report must cite c.d."})  # drops "gamma" every time

    with OpenAIStub(content=reply) as stub:
        stub.script(Reply(content='{"text": "drops the term and the id"}'))  # the first call: re-asked, then fixed
        client = ChatClient(stub.base_url, "m", max_retries=1)
        new, stats = reword_items(queries, client, max_workers=1)
    first, second = new[0].items
    assert first.text == "The report must state alpha and cite a.b." and first.evidence == keep.evidence
    assert first.terms == keep.terms and second == stubborn
    assert stats == {"reworded": 1, "failed": 1, "errors": {"unparseable": 1}}
    assert queries[0].items == [keep, stubborn]  # the input is not changed in place
