"""`bigs` — the command line. Thin: parse, build the config, call one function.

bigs train mlm|extend|embed|teacher-mlm|classify|qa|tokens [--config FILE] [key=value …]   train in JAX → artifact dir
bigs train … [--max-minutes N | --until-step S] [--resume | --warm-start DIR]   a run in slices: stop, continue
bigs serve --model NAME=EXPORT_DIR [--runtime onnx|stablehlo|torch]  serve over HTTP
bigs serve --print-settings                                        the settings in effect, and from where
bigs init OUT_DIR [--task mlm|classification|qa|tokens] [--hidden-size …]   a fresh (untrained) artifact dir
bigs convert flax-to-torch CKPT.msgpack CONFIG.json OUT_DIR        published Flax → artifact dir
bigs convert torch-to-flax ARTIFACT_DIR OUT.msgpack                artifact dir → Flax params
bigs bench torch-forward [--lengths 512 4096]                      torch eager latency
bigs bench load [--host URL --users N --duration 60s --scenario long|mixed|fill-mask --out DIR]
bigs bench peer --ours URL --peer URL [--concurrency 1,32 --lengths 125,420]   embeddings against a peer server
bigs bench soak [--host URL --duration 600 --fraction 0.7 --out DIR]   steady load at a fraction of capacity, RSS sampled
bigs bench memory --model NAME=EXPORT_DIR …                         resident memory: shared arena vs one per session
bigs bench precision EXPORT_DIR [--buckets 128,512,4096 --quantize]     fp32, int8 and bf16 variants side by side
bigs bench graph-profile EXPORT_DIR [--bucket 4096 --precision P]     where one bucket's time goes, by category and op
bigs bench compare [--quick] [--out docs/BENCHMARKS.md]             BiGS vs same-size BERT, dense-FLOP floors, batching
bigs bench default-size [--sizes 384x6,…] [--out docs/BENCHMARKS.md] default models' size: 4,096-token latency vs shipping budget
bigs bench train [--shapes mlm:32x128,classify:32x512] [--baseline REV] [--out docs/BENCHMARKS.md]  one training step: split, floor, torch reference
bigs bench accelerator [--budget-s 420] [--out DIR]                training, exact resume and serving on the GPU (or a tiny CPU run)
bigs export ARTIFACT_DIR OUT_DIR [--buckets 128,256] [--formats onnx,stablehlo] [--precisions int8,bf16|none]
bigs export ARTIFACT_DIR OUT_DIR --buckets …,8192,16384 --tile-positions   past the model's positions, tiled
bigs export --verify OUT_DIR                                       re-hash files, re-measure parity and gates
bigs hub-files DIR [DIR …]          (re)write what stock transformers / sentence-transformers / the Hub read
bigs --version

`bigs COMMAND --help` describes each command; `bigs serve --help` lists every setting with its
default and BIGS_* variable, `bigs train --help` every config key. A mistake in what was given
(a missing file, an unknown key, a bad value) ends the command with one line and status 1.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import typing
from pathlib import Path

# The process's start, near enough (this module is the first the `bigs` command imports, and it
# imports the heavy libraries lazily): `bigs serve`'s ready line counts its start-up from here.
STARTED = time.perf_counter()

# `bigs bench NAME` runs this module of the `bench` package as a script (installed with the wheel).
BENCHMARKS = {
    "torch-forward": "bench.torch_forward",
    "load": "bench.load",
    "soak": "bench.soak",
    "memory": "bench.memory",
    "precision": "bench.precision",
    "graph-profile": "bench.graph_profile",
    "compare": "bench.compare",
    "default-size": "bench.default_size",
    "train": "bench.train_step",
    "accelerator": "bench.accelerator",
    "warm-up": "bench.warm_up",
    "long-documents": "bench.long_documents",
    "emulated-cpu": "bench.emulated_cpu",
    "peer": "bench.peer",
}


def cmd_init(args: argparse.Namespace) -> None:
    import torch

    from export.hub_files import write_hub_files
    from model import (
        BiGSConfig,
        BiGSForMaskedLM,
        BiGSForQuestionAnswering,
        BiGSForSequenceClassification,
        BiGSForTokenClassification,
    )
    from model.hub import TRAINING_CARD
    from model.tokenizer import save_tokenizer

    labels = args.labels.split(",") if args.labels else None
    try:
        config = BiGSConfig(
            hidden_size=args.hidden_size,
            num_hidden_layers=args.layers,
            intermediate_size=args.intermediate_size or 3 * args.hidden_size,
            max_position_embeddings=args.max_length,
            block_type=args.block_type,
            routing=args.routing,
            num_attention_heads=args.heads,
            mlm_head=args.mlm_head,
            **(
                {"id2label": dict(enumerate(labels)), "label2id": {l: i for i, l in enumerate(labels)}}
                if labels
                else {}
            ),
        )
    except ValueError as error:  # e.g. heads that do not divide the hidden size, an unknown routing
        fail("init", str(error))
    torch.manual_seed(args.seed)
    model_class = {
        "mlm": BiGSForMaskedLM,
        "classification": BiGSForSequenceClassification,
        "qa": BiGSForQuestionAnswering,
        "tokens": BiGSForTokenClassification,
    }[args.task]
    model_class(config).save_pretrained(args.out_dir)
    save_tokenizer(args.out_dir, model_max_length=args.max_length)
    # The card says what the dir is (stage "init": no training), so its model card can say so too.
    card = {"stage": "init", "task": args.task, "seed": args.seed, "steps": 0}
    (Path(args.out_dir) / TRAINING_CARD).write_text(json.dumps(card, indent=1) + "\n")
    write_hub_files(args.out_dir)
    print(f"wrote an untrained {model_class.__name__} to {args.out_dir}")


def cmd_train(args: argparse.Namespace) -> None:
    from pydantic import ValidationError

    from training.config import load_config

    try:
        import yaml  # PyYAML reads YAML configs only; an install without it reads TOML and JSON

        syntax_errors: tuple[type[Exception], ...] = (OSError, ValueError, yaml.YAMLError)
    except ImportError:
        syntax_errors = (OSError, ValueError)
    try:
        config = load_config(args.config, [*args.overrides, *slice_overrides(args)], stage=args.stage)
    except ValidationError as error:
        unknown = any(item["type"] == "extra_forbidden" for item in error.errors())
        hint = " (`bigs train --help` lists the keys)" if unknown else ""
        fail("train", f"invalid config: {describe_invalid(error, lambda name: name)}{hint}")
    except syntax_errors as error:  # no such file, a dir; TOML / JSON / YAML syntax
        fail("train", f"config {args.config}: {one_line(error)}")
    default_teacher = config.stage == "teacher-mlm" and config.init_from == "default"
    if config.init_from and not default_teacher and not (Path(config.init_from) / "config.json").is_file():
        fail("train", f"init_from {config.init_from}: not an artifact dir (no config.json)")
    from training.slices import WEIGHTS, SliceError, check_slice_inputs

    try:
        check_slice_inputs(config)  # before any data is built
    except SliceError as error:
        fail("train", str(error))

    from training.stages import run

    try:
        result = run(config)
    except SliceError as error:  # a warm start whose weights or data position do not fit this run
        fail("train", str(error))
    if result.parent == Path(config.output_dir) / WEIGHTS:  # a slice that stopped before num_steps
        print(f"to continue exactly: {continue_command(args)}")


def slice_overrides(args: argparse.Namespace) -> list[str]:
    """--max-minutes, --until-step, --resume, --warm-start as the config keys they set (they win)."""
    flags = {
        "max_minutes": args.max_minutes,
        "until_step": args.until_step,
        "resume": True if args.resume else None,
        "warm_start": args.warm_start,
    }
    return [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def continue_command(args: argparse.Namespace) -> str:
    """The command line that continues a stopped slice: the same one, less its stop and start, with --resume."""
    import shlex

    slice_keys = ("max_minutes=", "until_step=", "resume=", "warm_start=")
    kept = [o for o in args.overrides if not o.removeprefix("--").replace("-", "_").startswith(slice_keys)]
    return shlex.join(
        ["bigs", "train", args.stage, *(["--config", args.config] if args.config else []), *kept, "--resume"]
    )


def cmd_convert(args: argparse.Namespace) -> None:
    for path in (args.source, args.config if args.direction == "flax-to-torch" else None):
        if path and not Path(path).exists():
            fail("convert", f"{path}: no such file or directory")
    from model.convert import flax_to_torch, load_flax_msgpack, save_torch_safetensors, torch_to_flax

    if args.direction == "flax-to-torch":
        from export.hub_files import write_hub_files
        from model import BiGSConfig
        from model.tokenizer import save_tokenizer

        out = Path(args.destination)
        out.mkdir(parents=True, exist_ok=True)
        config = BiGSConfig(**json.loads(Path(args.config).read_text()))
        params = load_flax_msgpack(args.source)
        config.architectures = [architecture_of_flax_tree(params)]
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


def architecture_of_flax_tree(params: dict) -> str:
    """Which head a Flax tree carries: the MLM's `cls`, QA's `qa_outputs`, or a `classifier` over the pooler
    (sequence classification) or over every token (token classification: no pooler); none, the backbone
    alone: the bare encoder, an embedding model."""
    if "cls" in params:
        return "BiGSForMaskedLM"
    if "qa_outputs" in params:
        return "BiGSForQuestionAnswering"
    if "classifier" not in params:
        return "BiGSModel"
    if "pooler" not in params.get("s4_bert", {}):
        return "BiGSForTokenClassification"
    return "BiGSForSequenceClassification"


def cmd_export(args: argparse.Namespace) -> None:
    # The dirs given are checked before torch and the exporters are imported (seconds): a typo fails at once.
    # Then quiet(), before any exporter runs: torch.onnx, ORT and transformers would otherwise fill the
    # console with lines that say nothing to the user (export/quiet.py drops those, and only those).
    from export.quiet import quiet

    if args.verify:
        from export.manifest import ManifestError, read_manifest

        try:
            read_manifest(args.paths[0])
        except ManifestError as error:  # not an export dir, or a manifest this version cannot read
            fail("export", str(error))

        quiet()
        from export.verify import format_report, verify

        report = verify(args.paths[0], tolerance=args.tolerance)
        print(format_report(report, Path(args.paths[0])))
        if not report.ok:
            sys.exit(1)
        return

    if not (Path(args.paths[0]) / "config.json").is_file():
        fail("export", f"{args.paths[0]}: not an artifact dir (no config.json)")
    if args.int8_floor is not None and args.int8_floor < 0:
        fail("export", f"--int8-floor {args.int8_floor}: a count of weight products, 0 or more")

    quiet()
    from export.build import (
        ExportOptions,
        export_artifact,
        parse_precisions,
        refuse_tiling_in_place,
        resolve_buckets,
        summary,
    )
    from model import BiGSConfig

    buckets = [int(b) for b in args.buckets.split(",")] if args.buckets else None
    config = BiGSConfig.from_pretrained(args.paths[0])
    try:  # before anything is written: buckets past the model's length, or other than a fixed-N model's N
        resolve_buckets(buckets, config.max_position_embeddings, config.fixed_length, args.tile_positions)
        refuse_tiling_in_place(args.paths[0], args.paths[1], args.tile_positions)
    except ValueError as error:
        fail("export", str(error))
    options = ExportOptions(
        buckets=buckets,
        tile_positions=args.tile_positions,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        quantize=args.quantize,
        # `--quantize int8` alone is the older spelling of `--precisions int8`: int8 is all it asks for
        precisions=() if args.quantize and args.precisions is None else parse_precisions(args.precisions),
        embed_weights=args.embed_weights,
        tolerance=args.tolerance,
        int8_floor=args.int8_floor,
    )
    # a line per bucket of each stage as it finishes, flushed at once so a log that is not a terminal
    # (docker, CI, a file) shows it live
    manifest = export_artifact(args.paths[0], args.paths[1], options, report=lambda line: print(line, flush=True))
    print(summary(manifest, args.paths[1]))
    if not manifest.parity.passed:
        print(f"FAILED: parity above tolerance {options.tolerance:g}: {manifest.parity.breaches}", file=sys.stderr)
        sys.exit(1)


def cmd_hub_files(args: argparse.Namespace) -> None:
    from export.hub_files import write_hub_files

    for directory in args.dirs:
        if not (Path(directory) / "config.json").is_file():
            raise SystemExit(f"bigs hub-files: {directory}/config.json not found: not a model dir")
        print(f"{directory}: {', '.join(write_hub_files(directory))}")


def cmd_serve(args: argparse.Namespace) -> None:
    import os

    from pydantic import ValidationError

    from service.settings import ServiceSettings

    given = {k: v for k, v in vars(args).items() if k in ServiceSettings.model_fields and v is not None}
    try:
        settings = ServiceSettings(**given)  # flags given override BIGS_* variables, which override defaults
    except ValidationError as error:
        flag_or_variable = lambda name: f"{name} ({flag_of(name) if name in given else env_of(name)})"
        fail("serve", "invalid setting " + describe_invalid(error, flag_or_variable, hide={"api_key"}))
    if args.print_settings:
        shown = settings.model_dump(mode="json")
        if shown["api_key"]:
            shown["api_key"] = "<set>"
        variables = {key.upper() for key in os.environ}  # pydantic-settings reads them in any case
        sources = {name: "flag" if name in given else "env" if env_of(name) in variables else "default"
                   for name in shown}  # fmt: skip
        print(json.dumps({"settings": shown, "source": sources}, indent=2))
        return
    if not settings.models:
        fail("serve", "no model: pass --model NAME=DIR, an export dir or an artifact dir (or set BIGS_MODELS)")

    from service.server import serve

    # On SIGTERM uvicorn stops admission, drains, then re-raises the signal, which would end the process
    # with -15 after a clean shutdown; exit 0 instead (what supervisors read as "stopped cleanly").
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    failure = serve(settings, started=STARTED)
    if failure:  # a model failed to load: one line, exit status 1
        raise SystemExit(f"bigs serve: {failure}")


def flag_of(name: str) -> str:
    """The `bigs serve` flag of a ServiceSettings field (`models` keeps its name of old: --model)."""
    return "--model" if name == "models" else f"--{name.replace('_', '-')}"


def env_of(name: str) -> str:
    from service.settings import ServiceSettings

    return f"{ServiceSettings.model_config['env_prefix']}{name.upper()}"


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ServiceSettings field, its help the field's description, default and variable.

    Flags default to None (not given), so a variable set in the environment holds unless the flag is
    given. pydantic validates every value (bounds included) whatever its source, so argparse only
    splits words: one error message, naming the flag or the variable, for all of them.
    """
    from service.settings import ServiceSettings

    for name, field in ServiceSettings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            shown = " ".join(default) or "none"
        else:
            shown = {None: "none", True: "on", False: "off"}.get(default, default)
        help_text = f"{field.description} (default: {shown}; env {env_of(name)})".replace("%", "%%")
        kind = typing.get_origin(field.annotation)
        if field.annotation is bool:
            parser.add_argument(flag_of(name), dest=name, action=argparse.BooleanOptionalAction, help=help_text)
        elif kind is typing.Literal:
            parser.add_argument(flag_of(name), dest=name, choices=typing.get_args(field.annotation), help=help_text)
        elif kind is list:
            metavar = "NAME=EXPORT_DIR" if name == "models" else "VALUE"
            parser.add_argument(flag_of(name), dest=name, action="extend", nargs="+", metavar=metavar, help=help_text)
        else:
            metavar = {int: "N", float: "X"}.get(field.annotation, "TEXT")
            parser.add_argument(flag_of(name), dest=name, metavar=metavar, help=help_text)
    parser.add_argument(
        "--print-settings",
        action="store_true",
        help="print the settings in effect (flags over BIGS_* variables over defaults) as JSON, and where "
        "each came from; load nothing, serve nothing",
    )


def describe_invalid(error, name_of, hide: frozenset[str] | set[str] = frozenset()) -> str:
    """A pydantic ValidationError as one line: each bad value's key (`name_of(dotted key)`), what is wrong
    and the value given (not for keys in `hide`, secrets)."""
    parts = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if not key:  # a check of several values together: its message names them
            parts.append(message)
            continue
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown key {name_of(key)}")
            continue
        shown = "" if key.split(".")[0] in hide else f", got {str(item.get('input'))[:80]}"
        parts.append(f"{name_of(key)}: {message}{shown}")
    return "; ".join(parts)


def one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename:
        return f"{error.strerror or error}: {error.filename}"
    return " ".join(str(error).split()) or type(error).__name__


def fail(command: str, message: str) -> typing.NoReturn:
    """A mistake in what the user gave: one line on stderr, status 1, no traceback."""
    raise SystemExit(f"bigs {command}: {message}")


def cmd_bench(args: argparse.Namespace) -> None:
    import importlib.util
    import runpy

    module = BENCHMARKS[args.which]
    if importlib.util.find_spec("bench") is None:
        fail("bench", "no bench package here (the serving image carries none; the wheel and a checkout do)")
    sys.argv = [module, *args.rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def cmd_eval(args: argparse.Namespace) -> None:
    from export.precisions import FP32, REDUCED, in_words
    from training.evaluation import decide_refusal, evaluate, evaluate_lengths

    if args.refuse_beyond is not None and (args.artifact is None or args.precision not in REDUCED):
        fail("eval", "--refuse-beyond judges one reduced precision of an export against its artifact: give "
             f"--precision {in_words(REDUCED)} and --artifact DIR")  # fmt: skip
    if args.lengths is not None and (args.data_dir is None or args.precision != FP32):
        fail("eval", "--lengths scores an artifact dir's masked tokens on a built corpus: give --data-dir DIR")
    try:
        if args.lengths is not None:
            report = evaluate_lengths(args.model, args.data_dir, args.lengths, args.work_dir)
        else:
            report = evaluate(args.model, args.data_dir, args.precision, args.work_dir, args.teacher)
        print(report.table())
        if args.json:
            Path(args.json).write_text(json.dumps(report.to_json(), indent=2) + "\n")
            print(f"wrote {args.json}")
        if args.refuse_beyond is not None:
            print(decide_refusal(report, Path(args.artifact), args.precision, args.refuse_beyond))
    except (ValueError, FileNotFoundError, KeyError) as error:
        fail("eval", one_line(error))


def config_keys_help() -> str:
    """Every key of the training config (training/config.py) with its type, default and description."""
    from pydantic import BaseModel

    from training.config import TrainConfig

    lines = ["config keys (in the --config file, or as KEY=VALUE; a value is JSON, else a string):"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, f"{prefix}{name}.")
                continue
            default = field.get_default(call_default_factory=True)
            kind_name = getattr(kind, "__name__", None) if typing.get_origin(kind) is None else None
            text = f"  {prefix}{name} ({kind_name or str(kind).replace('typing.', '')}, default {json.dumps(default)})"
            lines.append(text + (f": {field.description}" if field.description else ""))

    walk(TrainConfig, "")
    return "\n".join(lines)


class LazyParser(argparse.ArgumentParser):
    """A subcommand's parser whose arguments (or help) are added on first use, by `populate(parser)`.

    `bigs serve`'s flags come from ServiceSettings (pydantic-settings: the serve extra) and `bigs train
    --help` lists the training config: building them only for their own command keeps every command
    usable in an install with one extra (the serving image has no training/)."""

    def __init__(self, *args, populate=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._populate = populate

    def _ready(self) -> None:
        populate, self._populate = self._populate, None
        if populate is not None:
            populate(self)

    def parse_known_args(self, args=None, namespace=None):
        self._ready()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._ready()
        return super().format_help()

    def format_usage(self) -> str:
        self._ready()
        return super().format_usage()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bigs", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    from export.precisions import AUTO, FP32, INT8, NAMES  # the registry alone: imports nothing else of the project
    from service import package_version  # the package's own __init__: imports nothing of the server

    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=LazyParser)

    init = sub.add_parser("init", help="write a fresh, untrained artifact dir (config, safetensors, tokenizer)")
    init.add_argument("out_dir")
    init.add_argument("--task", choices=["mlm", "classification", "qa", "tokens"], default="mlm")
    init.add_argument("--hidden-size", type=int, default=768)
    init.add_argument("--layers", type=int, default=12)
    init.add_argument("--intermediate-size", type=int, default=None, help="default 3 x hidden size")
    init.add_argument("--max-length", type=int, default=4096)
    # The architecture's values are checked by BiGSConfig (one list, model/configuration_bigs.py), whose error
    # is the command's one line.
    init.add_argument(
        "--block-type", default="gated", help="gated (BiGS), stack (BERT's layout) or gmlp; docs/DESIGN.md §2.7, §2.8"
    )
    init.add_argument(
        "--routing",
        default=None,
        help="ssm, attention, alibi, synthesizer-random, synthesizer-dense (gated, stack) or spatial (gmlp, its "
        "default); default ssm",
    )
    init.add_argument("--heads", type=int, default=None, help="attention heads (default hidden size / 64)")
    init.add_argument("--mlm-head", default="bert", help="bert (the published head) or clap; docs/DESIGN.md §2.8")
    init.add_argument("--labels", default=None, help="comma-separated class names (classification, tokens)")
    init.add_argument("--seed", type=int, default=0)
    init.set_defaults(func=cmd_init)

    train = sub.add_parser(
        "train",
        help="train in JAX: mlm (pretraining), extend (longer inputs), embed (an embedding model from a teacher), "
        "teacher-mlm (a BERT-family teacher adapted into a masked LM, whose answers mlm can distil), "
        "classify, qa, tokens (fine-tuning)",
        description="Settings come from --config (JSON/TOML/YAML) and key=value overrides, e.g. "
        "bigs train mlm --config run.toml optim.learning_rate=1e-4 data.sources='[\"kjv\"]'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        populate=lambda p: setattr(p, "epilog", config_keys_help()),
    )
    train.add_argument("stage", choices=["mlm", "extend", "embed", "teacher-mlm", "classify", "qa", "tokens"])
    train.add_argument("--config", default=None, help="run config file (JSON, TOML or YAML)")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. num_steps=1000 output_dir=runs/x")
    train.add_argument(
        "--max-minutes",
        type=float,
        metavar="N",
        help="end this slice at the step boundary from which one more step and its checkpoint would pass N "
        "minutes: checkpoint + fp16 weights dir, exit 0 (config max_minutes)",
    )
    train.add_argument(
        "--until-step", type=int, metavar="S", help="end this slice after step S, the same way (config until_step)"
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in output_dir, exactly; an error if there is none (config resume)",
    )
    train.add_argument(
        "--warm-start",
        metavar="DIR",
        help="continue from a weights dir a checkpoint left (output_dir/weights/STEP, or a run dir): weights, "
        "step, schedule and data position, fresh optimizer moments (config warm_start)",
    )
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
    export.add_argument(
        "--verify",
        action="store_true",
        help="re-hash every file, re-measure parity and each precision variant's accuracy gate on this CPU",
    )
    export.add_argument("--buckets", default=None, help="comma-separated lengths (default 128..4096, capped)")
    export.add_argument(
        "--tile-positions",
        action="store_true",
        help="buckets past the model's max_position_embeddings are read with its learned position table tiled up "
        "to the longest bucket, with no training (as `bigs train extend` starts, and `bigs eval --lengths` scores); "
        "the export says so, and its manifest records positions_tiled_from",
    )
    export.add_argument("--formats", default="onnx,stablehlo", help="comma-separated: onnx, stablehlo")
    export.add_argument("--quantize", choices=[INT8], default=None, help="also write int8 ONNX graphs")
    export.add_argument(
        "--precisions",
        default=None,
        help="comma-separated reduced-precision variants to write, gate on real text and time: int8 (ORT), "
        "bf16 (OpenVINO), int8-openvino (OpenVINO, int8 weights, activations quantized per token at run time; "
        "CPUs with VNNI or AMX-INT8); default int8, plus, where OpenVINO is installed, bf16 if the CPU has bf16 "
        "units and int8-openvino if it has VNNI or AMX-INT8; none: fp32 only",
    )
    export.add_argument(
        "--int8-floor",
        type=int,
        default=None,
        metavar="N",
        help="the int8 search leaves at least the top N weight products of its ranking in fp32 (default: the "
        "model dir's int8_floor.json, or none), and writes int8 even where the dir refuses it: how a floor is "
        "measured before `bigs eval --precision int8 --refuse-beyond POINTS --artifact DIR` records it",
    )
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

    serve = sub.add_parser(
        "serve",
        help="serve export dirs or artifact dirs over HTTP (every option is also a BIGS_* variable)",
        description="Serve export dirs, or artifact dirs (served at once on torch while their export is written in the "
        "background, then from it). Every setting is a flag and a BIGS_* environment variable "
        "(service/settings.py); a flag given overrides the variable.",
        populate=add_settings_flags,
    )
    serve.set_defaults(func=cmd_serve)

    evaluate = sub.add_parser(
        "eval",
        help="score an artifact or export dir on held-out sets (cloze, masked tokens, a test split) in one table",
        description="Fill-mask models: the held-out cloze sentences (top-1, top-5) and, with --data-dir, masked-token "
        "accuracy on a built corpus's test split. Classifiers: accuracy and macro-F1 on the test split of the "
        "labelled set their card names (built into --data-dir), beside the majority class and TF-IDF + "
        "logistic regression. Every model: its embeddings' retrieval of long held-out articles read whole, beside "
        "the teacher reading its first 256 tokens, and its cosine with the teacher where it has the teacher's "
        "width. training/evaluation.py.",
    )
    evaluate.add_argument("model", help="an artifact dir (config.json) or an export dir (manifest.json)")
    evaluate.add_argument(
        "--data-dir", help="a built corpus (fill-mask) or where to build the labelled set (classifier)"
    )
    evaluate.add_argument(
        "--precision",
        default=FP32,
        choices=[*NAMES, AUTO],
        help="export dirs only; auto: per bucket what `bigs serve` serves on this CPU (the served variant's figures)",
    )
    evaluate.add_argument("--json", help="also write the report here")
    evaluate.add_argument(
        "--work-dir", default="runs/eval", help="where held-out sets are built (retrieval's articles)"
    )
    evaluate.add_argument(
        "--teacher", help="a teacher model dir to compare embeddings with (default: all-MiniLM-L6-v2 where installed)"
    )
    evaluate.add_argument(
        "--refuse-beyond",
        type=float,
        metavar="POINTS",
        help="with --precision int8, bf16 or int8-openvino and --artifact: where a figure of the model's, of at least "
        "1,000 items, falls more than POINTS below the artifact's eval.json, the artifact dir refuses that "
        "precision (refused_precisions.json: export then writes no such variant by default); within, a "
        "refusal is taken back",
    )
    evaluate.add_argument("--artifact", help="the artifact dir the export was made from (with --refuse-beyond)")
    evaluate.add_argument(
        "--lengths",
        type=lambda text: [int(n) for n in text.split(",")],
        metavar="N,N,…",
        help="the length test instead (an MLM artifact and --data-dir): masked-token accuracy on the same held-out "
        "text packed at each length, read in one pass, past the model's length with its positions tiled as "
        "`bigs train extend` tiles them, no training",
    )
    evaluate.set_defaults(func=cmd_eval)

    bench = sub.add_parser("bench", help="run a benchmark of the bench package (bench/)")
    bench.add_argument("which", choices=list(BENCHMARKS))
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
    try:
        args.func(args)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
