"""Evaluation: DeepResearch-Bench-style article generation and an LLM-judge report card.

``scripts/evaluate.py`` is a thin wrapper around :func:`main`::

    python scripts/evaluate.py --model DIR --queries FILE --out FILE [...]        # = generate
    python scripts/evaluate.py generate --model DIR --queries FILE --out FILE [...]
    python scripts/evaluate.py judge --articles FILE --judge-base-url URL --judge-model NAME [...]

See ``docs/EVALUATION.md``. The submodules are imported lazily, so importing this package is cheap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

SUBCOMMANDS = ("generate", "judge", "card")


def _engine_arg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--engine-arg expects KEY=VALUE, got {text!r}")
    try:
        parsed: object = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="evaluate.py",
        description="Generate DeepResearch-Bench-style articles with a trained checkpoint, then judge them. "
                    "Without a subcommand, `generate` is assumed.",
    )
    sub = p.add_subparsers(dest="command", metavar="{generate,judge}")

    g = sub.add_parser("generate", help="run the solver on queries; write {id,prompt,article} JSONL (resumable)")
    g.add_argument("--model", required=True, help="exported checkpoint dir (HF save_pretrained with tokenizer, e.g. <run>/export)")
    g.add_argument("--queries", required=True, help='query JSONL {"id","prompt",...} (DeepResearch Bench query.jsonl works as is), or "embedded"')
    g.add_argument("--out", required=True, help="article JSONL to write/append (DeepResearch Bench raw_data/<model>.jsonl)")
    g.add_argument("--sources", default=None, help="companion citations file (default: <out>.sources.jsonl)")
    g.add_argument("--limit", type=int, default=None, help="only the first N queries of the file")
    g.add_argument("--split", choices=("train", "heldout"), default=None,
                   help="only this split of a file that marks one (the embedded queries hold out 20 for evaluation)")
    g.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    g.add_argument("--engine-arg", type=_engine_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="extra VLLMEngine keyword argument (repeatable; VALUE parsed as JSON when it can be)")
    g.add_argument("--retriever", choices=("bm25", "http"), default="bm25")
    g.add_argument("--retriever-url", default=None, help="http retriever: http://HOST:PORT/retrieve")
    g.add_argument("--corpus", default=None, help="bm25 corpus JSONL {id,contents} (default: embedded stdlib corpus)")
    g.add_argument("--index-dir", default=None, help="bm25 index cache dir (default: build in memory)")
    budgets = " (default: the training run's value when --model is a run's export/, else %(default)s)"
    g.add_argument("--max-tool-calls", type=int, default=None, help="searches per report" + budgets)
    g.add_argument("--max-response-tokens", type=int, default=None,
                   help="whole multi-turn response, observations included" + budgets)
    g.add_argument("--max-observation-tokens", type=int, default=None, help="tokens per observation" + budgets)
    g.add_argument("--topk", type=int, default=None, help="passages per search" + budgets)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--batch-size", type=int, default=8, help="queries per batch (the output is flushed per batch)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--chat-template", default=None,
                   help="Jinja chat template (or a .jinja file) for a checkpoint without one; exports carry theirs")
    g.add_argument("--dtype", default="auto", help="hf engine: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    g.add_argument("--device", default="auto", help="hf engine: auto, cpu, cuda, cuda:1, ...")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    j = sub.add_parser("judge", help="score articles with an OpenAI-compatible judge; write summary.json + report_card.md")
    j.add_argument("--articles", required=True, help="article JSONL written by generate")
    j.add_argument("--sources", default=None, help="companion sources file (default: <articles>.sources.jsonl)")
    j.add_argument("--judge-base-url", required=True, help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    j.add_argument("--judge-model", required=True)
    j.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key (unset: no key sent)")
    j.add_argument("--out-dir", default=None, help="default: <articles without .jsonl>.judge/")
    j.add_argument("--max-retries", type=int, default=2, help="retries per request before it is recorded as missing")
    j.add_argument("--timeout-s", type=float, default=60.0)
    j.add_argument("--concurrency", type=int, default=4, help="parallel judge requests")
    j.add_argument("--limit", type=int, default=None, help="only the first N articles")
    j.add_argument("--no-quality", action="store_true", help="skip the writing-quality judge")
    j.add_argument("--no-citations", action="store_true", help="skip the citation check")
    j.add_argument("--judge-temperature", type=float, default=0.0)
    j.add_argument("--judge-max-tokens", type=int, default=1024)
    j.add_argument("--max-article-chars", type=int, default=100_000, help="article text sent to the judge (0: all)")
    j.add_argument("--max-source-chars", type=int, default=8_000, help="source passage text sent to the judge (0: all)")
    j.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("card", help="a deterministic held-out report card (no LLM): citation precision, coverage, "
                                    "validity, length with 95%% bootstrap CIs")
    c.add_argument("--articles", required=True, help="article JSONL written by generate")
    c.add_argument("--sources", default=None, help="companion sources file (default: <articles>.sources.jsonl)")
    c.add_argument("--corpus", default=None, help="bm25 corpus for coverage (default: the embedded stdlib corpus)")
    c.add_argument("--index-dir", default=None, help="bm25 index cache dir")
    c.add_argument("--coverage-k", type=int, default=5, help="top BM25 passages per query that coverage counts")
    c.add_argument("--out", default=None, help="write the card as JSON here (default: <articles>.card.json)")
    return p


#: the solver budgets ``generate`` takes from a run's saved config, and the defaults without one
BUDGETS = {"max_tool_calls": 10, "max_response_tokens": 4096, "max_observation_tokens": 512, "topk": 3}


def _run_budgets(model: str) -> dict[str, int]:
    """The solver budgets the model was trained with (``export/run_config.json``), if it is a run's export."""
    saved = Path(model) / "run_config.json"
    if not saved.is_file():
        return {}
    solver = json.loads(saved.read_text()).get("solver", {})
    return {k: int(solver[k]) for k in BUDGETS if k in solver}


def _generate(args: argparse.Namespace) -> int:
    from score_lightning.evaluation.generate import GenerateConfig, generate_articles

    trained = _run_budgets(args.model)
    for key, default in BUDGETS.items():  # explicit flags win, then the run's own budgets, then the defaults
        if getattr(args, key) is None:
            setattr(args, key, trained.get(key, default))
    if trained:
        logging.getLogger(__name__).info("budgets from %s/run_config.json: %s", args.model, trained)
    cfg = GenerateConfig(
        model=args.model, queries=args.queries, out=args.out, sources=args.sources, limit=args.limit,
        engine=args.engine, engine_kwargs=dict(args.engine_arg), retriever=args.retriever,
        retriever_url=args.retriever_url, corpus=args.corpus, index_dir=args.index_dir, chat_template=args.chat_template, split=args.split,
        max_tool_calls=args.max_tool_calls, max_response_tokens=args.max_response_tokens,
        max_observation_tokens=args.max_observation_tokens, topk=args.topk, temperature=args.temperature,
        top_p=args.top_p, batch_size=args.batch_size, seed=args.seed, dtype=args.dtype, device=args.device,
        progress=not args.no_progress,
    )
    res = generate_articles(cfg)
    print(f"{len(res.generated_ids)} generated, {res.skipped} already present, {res.total} selected: "
          f"{res.out} (sources: {res.sources})")
    return 0


def _judge(args: argparse.Namespace) -> int:
    from score_lightning.evaluation.judge import JudgeClient, JudgeOptions, run_judge
    from score_lightning.evaluation.report_card import render_markdown, write_report

    articles = Path(args.articles)
    sources = Path(args.sources) if args.sources else articles.with_name(articles.name + ".sources.jsonl")
    out_dir = Path(args.out_dir) if args.out_dir else articles.with_name(
        (articles.name[:-6] if articles.name.endswith(".jsonl") else articles.name) + ".judge")
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if not api_key:
        logging.getLogger(__name__).warning("$%s is not set: sending a placeholder API key (local servers ignore it)",
                                            args.api_key_env)
    client = JudgeClient(args.judge_base_url, args.judge_model, api_key, timeout_s=args.timeout_s,
                         max_retries=args.max_retries,
                         temperature=args.judge_temperature, max_tokens=args.judge_max_tokens)
    opts = JudgeOptions(quality=not args.no_quality, citations=not args.no_citations, concurrency=args.concurrency,
                        limit=args.limit, max_article_chars=args.max_article_chars,
                        max_source_chars=args.max_source_chars)
    records = run_judge(articles, sources if opts.citations else None, client, opts, progress=not args.no_progress)
    meta = {"judge_model": args.judge_model, "judge_base_url": args.judge_base_url, "articles": str(articles),
            "sources": str(sources) if opts.citations else None, "max_retries": args.max_retries,
            "timeout_s": args.timeout_s, "requests_sent": client.num_requests}
    summary = write_report(out_dir, records, meta)
    print(render_markdown(summary))
    print(f"wrote {out_dir}/summary.json, report_card.md, judgments.jsonl")
    return 0


def _card(args: argparse.Namespace) -> int:
    from score_lightning.evaluation.card import render, report_card
    from score_lightning.retrieval.factory import build_retriever

    articles = Path(args.articles)
    sources = Path(args.sources) if args.sources else articles.with_name(articles.name + ".sources.jsonl")
    retriever = build_retriever("bm25", corpus_path=args.corpus, index_dir=args.index_dir)
    card = report_card(articles, sources, retriever, args.coverage_k)
    out = Path(args.out) if args.out else articles.with_name(articles.stem + ".card.json")
    out.write_text(json.dumps(card, indent=1))
    print(render(card))
    print(f"{card['queries']} queries ({card['uncited']} uncited); card: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["generate", *argv]  # `evaluate.py --model ... --queries ... --out ...`
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return {"generate": _generate, "judge": _judge, "card": _card}[args.command](args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
