"""`bigs` — the command line. Thin: parse, build the config, call one function.

bigs train mlm|extend|classify [--config FILE] [key=value …]       train in JAX → artifact dir
bigs serve --model NAME=EXPORT_DIR [--runtime onnx|stablehlo|torch]  serve over HTTP
bigs init OUT_DIR [--task mlm|classification] [--hidden-size …]   a fresh (untrained) artifact dir
bigs convert flax-to-torch CKPT.msgpack CONFIG.json OUT_DIR        published Flax → artifact dir
bigs convert torch-to-flax ARTIFACT_DIR OUT.msgpack                artifact dir → Flax params
bigs bench torch-forward [--lengths 512 4096]                      torch eager latency
bigs bench load [--host URL --users N --duration 60s --scenario long|mixed|fill-mask --out DIR]
bigs export ARTIFACT_DIR OUT_DIR [--buckets 128,256] [--formats onnx,stablehlo] [--quantize int8]
bigs export --verify OUT_DIR                                       re-hash files, re-measure parity
bigs hub-files DIR [DIR …]          (re)write what stock transformers / sentence-transformers / the Hub read
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path


def cmd_init(args: argparse.Namespace) -> None:
    import torch

    from model import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification
    from model.hub import TRAINING_CARD, write_hub_files
    from model.tokenizer import save_tokenizer

    labels = args.labels.split(",") if args.labels else None
    config = BiGSConfig(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate_size or 3 * args.hidden_size,
        max_position_embeddings=args.max_length,
        **({"id2label": dict(enumerate(labels)), "label2id": {l: i for i, l in enumerate(labels)}} if labels else {}),
    )
    torch.manual_seed(args.seed)
    model_class = BiGSForMaskedLM if args.task == "mlm" else BiGSForSequenceClassification
    model_class(config).save_pretrained(args.out_dir)
    save_tokenizer(args.out_dir, model_max_length=args.max_length)
    # The card says what the dir is (stage "init": no training), so its model card can say so too.
    card = {"stage": "init", "task": args.task, "seed": args.seed, "steps": 0}
    (Path(args.out_dir) / TRAINING_CARD).write_text(json.dumps(card, indent=1) + "\n")
    write_hub_files(args.out_dir)
    print(f"wrote an untrained {model_class.__name__} to {args.out_dir}")


def cmd_train(args: argparse.Namespace) -> None:
    from training.config import load_config
    from training.stages import run

    config = load_config(args.config, args.overrides, stage=args.stage)
    run(config)


def cmd_convert(args: argparse.Namespace) -> None:
    from model.convert import flax_to_torch, load_flax_msgpack, save_torch_safetensors, torch_to_flax

    if args.direction == "flax-to-torch":
        from model import BiGSConfig
        from model.hub import write_hub_files
        from model.tokenizer import save_tokenizer

        out = Path(args.destination)
        out.mkdir(parents=True, exist_ok=True)
        config = BiGSConfig(**json.loads(Path(args.config).read_text()))
        params = load_flax_msgpack(args.source)
        config.architectures = ["BiGSForMaskedLM" if "cls" in params else "BiGSForSequenceClassification"]
        config.save_pretrained(out)
        save_torch_safetensors(flax_to_torch(params), out / "model.safetensors")
        save_tokenizer(out, model_max_length=config.max_position_embeddings)
        write_hub_files(out)
        print(f"wrote {out}")
    else:
        from flax.serialization import msgpack_serialize

        from model.convert import load_torch_safetensors

        params = torch_to_flax(load_torch_safetensors(Path(args.source) / "model.safetensors"))
        Path(args.destination).write_bytes(msgpack_serialize(params))
        print(f"wrote {args.destination}")


def cmd_export(args: argparse.Namespace) -> None:
    from export.verify import format_report, verify

    if args.verify:
        report = verify(args.paths[0], tolerance=args.tolerance)
        print(format_report(report, Path(args.paths[0])))
        if not report.ok:
            sys.exit(1)
        return

    from export.build import ExportOptions, export_artifact, summary

    options = ExportOptions(
        buckets=[int(b) for b in args.buckets.split(",")] if args.buckets else None,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        quantize=args.quantize,
        embed_weights=args.embed_weights,
        tolerance=args.tolerance,
    )
    manifest = export_artifact(args.paths[0], args.paths[1], options)
    print(summary(manifest, args.paths[1]))
    if not manifest.parity.passed:
        print(f"FAILED: parity above tolerance {options.tolerance:g}: {manifest.parity.breaches}", file=sys.stderr)
        sys.exit(1)


def cmd_hub_files(args: argparse.Namespace) -> None:
    from model.hub import write_hub_files

    for directory in args.dirs:
        if not (Path(directory) / "config.json").is_file():
            raise SystemExit(f"bigs hub-files: {directory}/config.json not found: not a model dir")
        print(f"{directory}: {', '.join(write_hub_files(directory))}")


def cmd_serve(args: argparse.Namespace) -> None:
    from pydantic import ValidationError

    from service.server import serve
    from service.settings import ServiceSettings

    given = {k: v for k, v in vars(args).items() if k in ServiceSettings.model_fields and v is not None}
    try:
        settings = ServiceSettings(**given)
    except ValidationError as error:
        raise SystemExit(f"bigs serve: {describe_invalid_settings(error, set(given))}") from None
    if not settings.models:
        raise SystemExit("no model: pass --model NAME=EXPORT_DIR (or set BIGS_MODELS)")
    # On SIGTERM uvicorn stops admission, drains, then re-raises the signal, which would end the process
    # with -15 after a clean shutdown; exit 0 instead (what supervisors read as "stopped cleanly").
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    failure = serve(settings)
    if failure:  # a model failed to load: one line, exit status 1
        raise SystemExit(f"bigs serve: {failure}")


def describe_invalid_settings(error, flags: set[str]) -> str:
    """A pydantic ValidationError of ServiceSettings as one line naming each setting and where it came
    from: the command-line flag when it was given (`flags`), else its BIGS_* variable."""
    parts = []
    for item in error.errors():
        name = str(item["loc"][0]) if item["loc"] else "settings"
        source = ("--model" if name == "models" else f"--{name.replace('_', '-')}") if name in flags else None
        message = item["msg"].removeprefix("Value error, ")
        shown = "" if name == "api_key" else f", got {str(item.get('input'))[:80]}"
        parts.append(f"{name} ({source or 'BIGS_' + name.upper()}): {message}{shown}")
    return "invalid setting " + "; ".join(parts)


def cmd_bench(args: argparse.Namespace) -> None:
    import runpy

    bench = Path(__file__).parent / "bench" / f"{args.which.replace('-', '_')}.py"
    sys.argv = [str(bench), *args.rest]
    runpy.run_path(str(bench), run_name="__main__")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bigs", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init", help="write a fresh, untrained artifact dir (config, safetensors, tokenizer)")
    init.add_argument("out_dir")
    init.add_argument("--task", choices=["mlm", "classification"], default="mlm")
    init.add_argument("--hidden-size", type=int, default=768)
    init.add_argument("--layers", type=int, default=12)
    init.add_argument("--intermediate-size", type=int, default=None, help="default 3 x hidden size")
    init.add_argument("--max-length", type=int, default=4096)
    init.add_argument("--labels", default=None, help="comma-separated class names (classification)")
    init.add_argument("--seed", type=int, default=0)
    init.set_defaults(func=cmd_init)

    train = sub.add_parser(
        "train",
        help="train in JAX: mlm (pretraining), extend (longer inputs), classify (fine-tuning)",
        description="Settings come from --config (JSON/TOML/YAML) and key=value overrides, e.g. "
        "bigs train mlm --config run.toml optim.learning_rate=1e-4 data.sources='[\"kjv\"]'",
    )
    train.add_argument("stage", choices=["mlm", "extend", "classify"])
    train.add_argument("--config", default=None, help="run config file (JSON, TOML or YAML)")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. num_steps=1000 output_dir=runs/x")
    train.set_defaults(func=cmd_train)

    convert = sub.add_parser("convert", help="weights between published Flax checkpoints and artifact dirs")
    convert.add_argument("direction", choices=["flax-to-torch", "torch-to-flax"])
    convert.add_argument("source", help="flax_model.msgpack, or an artifact dir")
    convert.add_argument("config", nargs="?", help="config.json of the Flax checkpoint (flax-to-torch)")
    convert.add_argument("destination", nargs="?", help="artifact dir, or .msgpack file")
    convert.set_defaults(func=cmd_convert)

    export = sub.add_parser(
        "export",
        help="export an artifact dir to ONNX / StableHLO per length bucket, or --verify an export dir",
        description="bigs export ARTIFACT_DIR OUT_DIR [options]  |  bigs export --verify OUT_DIR",
    )
    export.add_argument("paths", nargs="+", metavar="DIR", help="ARTIFACT_DIR OUT_DIR, or OUT_DIR with --verify")
    export.add_argument("--verify", action="store_true", help="re-hash every file and re-measure parity")
    export.add_argument("--buckets", default=None, help="comma-separated lengths (default 128..4096, capped)")
    export.add_argument("--formats", default="onnx,stablehlo", help="comma-separated: onnx, stablehlo")
    export.add_argument("--quantize", choices=["int8"], default=None, help="also write int8 ONNX graphs")
    export.add_argument("--embed-weights", action="store_true", help="StableHLO: embed weights in each artifact")
    export.add_argument("--tolerance", type=float, default=1e-4, help="max abs diff to the torch reference")
    export.set_defaults(func=cmd_export)

    hub = sub.add_parser(
        "hub-files",
        help="(re)write the model code + auto_map, sentence-transformers files and model card of model dirs",
        description="What stock transformers (trust_remote_code=True), sentence-transformers and the Hub read "
        "from a dir, generated from the project's code, config.json and training_card.json (model/hub.py). "
        "A README.md not written by this command is kept.",
    )
    hub.add_argument("dirs", nargs="+", metavar="DIR")
    hub.set_defaults(func=cmd_hub_files)

    serve = sub.add_parser("serve", help="serve export dirs over HTTP (every option is also a BIGS_* variable)")
    serve.add_argument("--model", dest="models", action="append", metavar="NAME=EXPORT_DIR")
    serve.add_argument("--runtime", choices=["onnx", "stablehlo", "torch"])
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--max-batch-tokens", type=int)
    serve.add_argument("--max-batch-size", type=int)
    serve.add_argument("--max-wait-ms", type=float)
    serve.add_argument("--max-in-flight", type=int)
    serve.add_argument("--request-timeout-s", type=float)
    serve.add_argument("--intra-op-threads", type=int)
    serve.add_argument("--ort-spin-wait", action=argparse.BooleanOptionalAction, default=None)
    serve.add_argument("--api-key")
    serve.add_argument("--skip-failed-models", action=argparse.BooleanOptionalAction, default=None,
                       help="serve the models that load; report the others as failed (default: exit 1)")  # fmt: skip
    serve.add_argument("--drain-timeout-s", type=float, help="on SIGTERM, then 503 for what is left (default 25)")
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None)
    serve.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench", help="run a benchmark script from bench/")
    bench.add_argument("which", choices=["torch-forward", "load"])
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    # key=value overrides of `bigs train` may follow --config; argparse leaves those as extras.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "train" and all("=" in item for item in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "export" and len(args.paths) != (1 if args.verify else 2):
        build_parser().error("export needs: ARTIFACT_DIR OUT_DIR, or --verify OUT_DIR")
    if args.command == "convert":
        if args.direction == "flax-to-torch" and not (args.config and args.destination):
            build_parser().error("flax-to-torch needs: CKPT.msgpack CONFIG.json OUT_DIR")
        if args.direction == "torch-to-flax":
            args.destination = args.destination or args.config
            if not args.destination:
                build_parser().error("torch-to-flax needs: ARTIFACT_DIR OUT.msgpack")
    args.func(args)


if __name__ == "__main__":
    main()
