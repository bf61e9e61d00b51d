"""Evaluation: DeepResearch-Bench-style article generation and an LLM-judge report card.

``scripts/evaluate.py`` is a thin wrapper around :func:`main`::

    python scripts/evaluate.py --model DIR --queries FILE --out FILE [...]        # = generate
    python scripts/evaluate.py generate --model DIR --queries FILE --out FILE [...]
    python scripts/evaluate.py judge --articles FILE --judge-base-url URL --judge-model NAME [...]
    python scripts/evaluate.py judge --articles FILE --drb2-tasks tasks_and_rubrics.jsonl --no-quality ...
    python scripts/evaluate.py card --articles FILE [--baseline OTHER.card.json]

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
    sub = p.add_subparsers(dest="command", metavar="{generate,judge,card}")

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
    g.add_argument("--run-config", default=None,
                   help="the run config whose settings (budgets, sampling, prompt, reward rule) generation follows "
                        "(default: <model>/run_config.json, which exports and cold starts carry; 'none': defaults)")
    run = " (default: the run config's %s, else %s)"
    g.add_argument("--max-tool-calls", type=int, default=None, help="searches per report" + run % ("solver.max_tool_calls", 10))
    g.add_argument("--max-response-tokens", type=int, default=None, help="whole multi-turn response, observations "
                   "included" + run % ("solver.max_response_tokens", 4096))
    g.add_argument("--max-observation-tokens", type=int, default=None,
                   help="tokens per observation" + run % ("solver.max_observation_tokens", 512))
    g.add_argument("--topk", type=int, default=None, help="passages per search" + run % ("solver.topk", 3))
    g.add_argument("--samples", type=int, default=1, help="rollouts per query (the article file keeps sample 0, "
                   "the sources file all of them; default 1)")
    g.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy" + run % ("solver.temperature", "0 for one sample, 1.0 for more"))
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling" + run % ("solver.top_p", 1.0))
    g.add_argument("--batch-size", type=int, default=8, help="queries per batch (the output is flushed per batch)")
    g.add_argument("--seed", type=int, default=0, help="each batch is seeded from it and its query ids (default 0)")
    g.add_argument("--chat-template", default=None,
                   help="Jinja chat template (or a .jinja file) for a checkpoint without one (default: the run "
                        "config's model.chat_template, else the checkpoint's own; exports carry theirs)")
    g.add_argument("--dtype", default="auto", help="hf engine: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    g.add_argument("--device", default="auto", help="hf engine: auto, cpu, cuda, cuda:1, ...")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    j = sub.add_parser("judge", help="score articles with an OpenAI-compatible judge (writing quality, citations, "
                                     "DeepResearch Bench II rubrics); write summary.json + report_card.md")
    j.add_argument("--articles", required=True, help="article JSONL written by generate")
    j.add_argument("--sources", default=None, help="companion sources file (default: <articles>.sources.jsonl)")
    j.add_argument("--judge-base-url", required=True, help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    j.add_argument("--judge-model", required=True)
    j.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key (unset: no key sent)")
    j.add_argument("--out-dir", default=None, help="default: <articles without .jsonl>.judge/")
    j.add_argument("--max-retries", type=int, default=2, help="retries per request before it is recorded as missing")
    j.add_argument("--timeout-s", type=float, default=60.0)
    j.add_argument("--concurrency", type=int, default=4, help="judge requests in flight at once (the process-wide "
                   "limiter's max_concurrency, as judge.max_concurrency in training)")
    j.add_argument("--requests-per-minute", type=int, default=0, help="HTTP requests per minute, retries included "
                   "(0: unlimited; as judge.requests_per_minute)")
    j.add_argument("--limit", type=int, default=None, help="only the first N articles")
    j.add_argument("--no-quality", action="store_true", help="skip the writing-quality judge")
    j.add_argument("--no-citations", action="store_true", help="skip the citation check")
    j.add_argument("--judge-temperature", type=float, default=0.0)
    j.add_argument("--judge-max-tokens", type=int, default=1024)
    j.add_argument("--max-article-chars", type=int, default=100_000, help="article text sent to the judge (0: all)")
    j.add_argument("--max-source-chars", type=int, default=8_000, help="source passage text sent to the judge (0: all)")
    j.add_argument("--drb2-tasks", default=None, metavar="FILE",
                   help="DeepResearch Bench II tasks_and_rubrics.jsonl: also score each article (matched by id) "
                        "against its task's binary rubric items")
    j.add_argument("--drb2-chunk-size", type=int, default=50,
                   help="rubric items per judge request (DRB-II's CHUNK_SIZE; 0: all items of a task in one)")
    j.add_argument("--drb2-max-tokens", type=int, default=16384,
                   help="reply budget of a rubric request (a score, reason and evidence per item; 0: server default)")
    j.add_argument("--drb2-timeout-s", type=float, default=600.0, help="timeout of a rubric request")
    j.add_argument("--drb2-max-article-chars", type=int, default=150_000,
                   help="article text sent with each rubric request (DRB-II's MAX_PAPER_CHARS; 0: all)")
    j.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("card", help="a deterministic held-out report card (no LLM): grounded and format validity, "
                                    "citation precision, coverage, item recall, length with 95%% query-bootstrap CIs")
    c.add_argument("--articles", required=True, help="article JSONL written by generate")
    c.add_argument("--sources", default=None, help="companion sources file (default: <articles>.sources.jsonl)")
    c.add_argument("--corpus", default=None, help="bm25 corpus for coverage (default: the embedded stdlib corpus)")
    c.add_argument("--index-dir", default=None, help="bm25 index cache dir")
    c.add_argument("--coverage-k", type=int, default=5, help="top BM25 passages per query that coverage counts")
    c.add_argument("--items", default="embedded", help="evidence items for item_recall (scripts/build_rubrics.py): "
                   "a file, 'embedded' (the embedded queries' own) or 'none'")
    c.add_argument("--out", default=None, help="write the card as JSON here (default: <articles>.card.json)")
    c.add_argument("--settings", default=None, help="the settings generate recorded (default: <articles>.settings.json)")
    c.add_argument("--baseline", default=None, help="another card JSON: print each metric's difference (this card "
                   "minus it); refused (exit 2) when the two were generated under different settings")
    return p


#: the solver budgets ``generate`` takes from a run's saved config, and the defaults without one
BUDGETS = {"max_tool_calls": 10, "max_response_tokens": 4096, "max_observation_tokens": 512, "topk": 3}


def _run_budgets(model: str) -> dict[str, int]:
    """The solver budgets the model was trained with (its ``run_config.json``), if it carries one."""
    from score_lightning.evaluation.settings import read_run_config, run_values

    values = run_values(read_run_config(model))
    return {k: values[f"solver.{k}"] for k in BUDGETS if f"solver.{k}" in values}


def _generate(args: argparse.Namespace) -> int:
    from score_lightning.policy.preflight import check_model_source

    check_model_source(args.model, "--model")  # before anything loads: one error block, as training's
    from score_lightning.evaluation.generate import GenerateConfig, generate_articles
    from score_lightning.evaluation.settings import RUN_CONFIG, format_settings, read_run_config, resolve_settings

    source = None if args.run_config == "none" else Path(args.run_config or Path(args.model) / RUN_CONFIG)
    if args.run_config not in (None, "none") and not source.is_file():
        raise FileNotFoundError(f"--run-config {source}: no such file")
    run = read_run_config(source)
    flags = {"solver.max_tool_calls": args.max_tool_calls, "solver.max_response_tokens": args.max_response_tokens,
             "solver.max_observation_tokens": args.max_observation_tokens, "solver.topk": args.topk,
             "solver.temperature": args.temperature, "solver.top_p": args.top_p,
             "model.chat_template": args.chat_template}
    s, origin = resolve_settings(flags, run, args.samples)
    cfg = GenerateConfig(
        model=args.model, queries=args.queries, out=args.out, sources=args.sources, limit=args.limit,
        engine=args.engine, engine_kwargs=dict(args.engine_arg), retriever=args.retriever,
        retriever_url=args.retriever_url, corpus=args.corpus, index_dir=args.index_dir,
        chat_template=s["model.chat_template"], split=args.split,
        max_tool_calls=s["solver.max_tool_calls"], max_response_tokens=s["solver.max_response_tokens"],
        max_observation_tokens=s["solver.max_observation_tokens"], topk=s["solver.topk"],
        temperature=s["solver.temperature"], top_p=s["solver.top_p"], samples=args.samples,
        conclusion_line=s["solver.conclusion_line"], harness_state=s["harness.initial_state"],
        citations=s["reward.citations"], require_citation=s["reward.require_citation"],
        min_answer_chars=s["reward.min_answer_chars"], settings_source=str(source) if run else None,
        agent=s.get("solver.agent", "react"), mams=s.get("solver.mams"),  # data, not config
        batch_size=args.batch_size, seed=args.seed, dtype=args.dtype, device=args.device,
        progress=not args.no_progress,
    )
    print(format_settings(cfg.settings(), origin, source=str(source) if run else None,
                          extra={"samples": args.samples, "seed": args.seed}), flush=True)
    res = generate_articles(cfg)
    print(f"{len(res.generated_ids)} generated, {res.skipped} already present, {res.total} selected: "
          f"{res.out} (sources: {res.sources}; settings: {res.settings})")
    return 0


def _judge(args: argparse.Namespace) -> int:
    from score_lightning.evaluation.drb2_judge import Drb2Options, match_articles, run_drb2
    from score_lightning.evaluation.drb2_score import write_drb2_results
    from score_lightning.data.drb2_tasks import load_drb2_tasks
    from score_lightning.evaluation.judge import JudgeClient, JudgeOptions, read_jsonl, run_judge
    from score_lightning.evaluation.report_card import render_markdown, write_report

    articles = Path(args.articles)
    sources = Path(args.sources) if args.sources else articles.with_name(articles.name + ".sources.jsonl")
    out_dir = Path(args.out_dir) if args.out_dir else articles.with_name(
        (articles.name[:-6] if articles.name.endswith(".jsonl") else articles.name) + ".judge")
    from score_lightning.clients.limiter import configure_limiter

    configure_limiter(args.concurrency, args.requests_per_minute)  # every request below shares these limits
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
    tasks = load_drb2_tasks(args.drb2_tasks) if args.drb2_tasks else None  # a bad file fails before any request
    if tasks is not None:  # so does an article file that matches no task
        arts = read_jsonl(articles)
        arts = arts[: max(args.limit, 0)] if args.limit is not None else arts
        matched = match_articles(arts, tasks)
    if tasks is None or opts.quality or opts.citations:
        records = run_judge(articles, sources if opts.citations else None, client, opts, progress=not args.no_progress)
    else:
        records = None
    meta: dict = {"judge_model": args.judge_model, "judge_base_url": args.judge_base_url, "articles": str(articles),
                  "sources": str(sources) if opts.citations else None, "max_retries": args.max_retries,
                  "timeout_s": args.timeout_s}
    written = ["summary.json", "report_card.md", "judgments.jsonl"]
    requests = client.num_requests
    if tasks is not None:
        records = records if records is not None else [{"id": a["id"]} for a in arts]
        rubric_client = JudgeClient(args.judge_base_url, args.judge_model, api_key, timeout_s=args.drb2_timeout_s,
                                    max_retries=args.max_retries, temperature=args.judge_temperature,
                                    max_tokens=args.drb2_max_tokens)
        dopts = Drb2Options(chunk_size=args.drb2_chunk_size, concurrency=args.concurrency,
                            max_article_chars=args.drb2_max_article_chars)
        drb2_records = run_drb2(arts, tasks, rubric_client, dopts, progress=not args.no_progress, matched=matched)
        for rec, drb2 in zip(records, drb2_records, strict=True):
            rec["drb2"] = drb2
        requests += rubric_client.num_requests
        meta["drb2"] = {"tasks_file": str(args.drb2_tasks), "tasks": len(tasks), "chunk_size": args.drb2_chunk_size,
                        "max_tokens": args.drb2_max_tokens, "timeout_s": args.drb2_timeout_s,
                        "max_article_chars": args.drb2_max_article_chars}
    meta["requests_sent"] = requests
    summary = write_report(out_dir, records, meta)
    if tasks is not None:
        model = articles.name[:-6] if articles.name.endswith(".jsonl") else articles.name
        write_drb2_results(out_dir / "drb2_results.jsonl", [r["drb2"] for r in records], tasks, model)
        written.append("drb2_results.jsonl")
    print(render_markdown(summary))
    print(f"wrote {out_dir}/" + ", ".join(written))
    return 0


def _card(args: argparse.Namespace) -> int:
    from score_lightning.evaluation.card import compare_cards, load_card, render, render_comparison, report_card
    from score_lightning.evaluation.settings import format_settings, settings_path_for
    from score_lightning.retrieval.factory import build_retriever

    articles = Path(args.articles)
    sources = Path(args.sources) if args.sources else articles.with_name(articles.name + ".sources.jsonl")
    settings = Path(args.settings) if args.settings else settings_path_for(articles)
    generation = json.loads(settings.read_text(encoding="utf-8")) if settings.is_file() else None
    if generation is None:
        logging.getLogger(__name__).warning("%s: no settings recorded (articles generated before they were); "
                                            "this card cannot be compared with another", settings)
    baseline = load_card(args.baseline) if args.baseline else None  # a bad path fails before the work
    retriever = build_retriever("bm25", corpus_path=args.corpus, index_dir=args.index_dir)
    items, items_set = _card_items(args.items)
    card = report_card(articles, sources, retriever, args.coverage_k, generation, items, items_set)
    out = Path(args.out) if args.out else articles.with_name(articles.stem + ".card.json")
    out.write_text(json.dumps(card, indent=1))
    if card["settings"] is not None:
        print(format_settings(card["settings"], source=(generation or {}).get("source"),  # data, not config
                              extra={"samples": (generation or {}).get("samples")}))
    print(render(card))
    print(f"{card['queries']} queries, {card['answers']} answers ({card['uncited']} uncited); card: {out}")
    if baseline is not None:
        try:
            cmp = compare_cards(card, baseline)
        except ValueError as exc:
            raise ValueError(f"cannot compare {out} with --baseline {args.baseline}: {exc}") from None
        print(f"\nthis card minus {args.baseline} (paired over {cmp['queries']} queries):")
        print(render_comparison(cmp))
    return 0


def _card_items(choice: str) -> tuple[dict | None, dict | None]:
    """The card's item set and its identity, from ``--items``."""
    if choice == "none":
        return None, None
    from score_lightning.data.items import EMBEDDED_ITEMS_PATH, file_digest, load_items

    path = EMBEDDED_ITEMS_PATH if choice == "embedded" else Path(choice)
    return load_items(path), {"path": choice if choice == "embedded" else str(path), "digest": file_digest(path)}


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
    from score_lightning.errors import ConfigError, ModelUnavailable

    try:
        return {"generate": _generate, "judge": _judge, "card": _card}[args.command](args)
    except (ConfigError, ModelUnavailable, ValueError, FileNotFoundError, RuntimeError) as exc:  # the user's to fix
        print(f"error: {exc}", file=sys.stderr)
        return 2
