"""``dflash-train config``: a job config as training would see it, or the reference of every key.

``dflash-train config cpu-demo train.max_steps=5`` reads the recipe (or a YAML/JSON file), applies
the overrides, validates, and prints the whole config as YAML, every default filled in. The output
is itself a config file: ``dflash-train train saved.yaml`` trains the same job. ``--reference``
prints the Markdown reference of every key (docs/config.md).
"""

from __future__ import annotations

import argparse
import shlex

import yaml

from dflash_train.config import JobConfig, load_config, recipe_names
from dflash_train.config_reference import _plain, keys_epilog, render_markdown


def register(sub) -> None:
    p = sub.add_parser(
        "config", help="print a recipe's resolved config (after overrides) or the reference of every key",
        description="print a job config as training would see it, or the reference of every key", epilog=keys_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?",
                   help=f"a YAML/JSON config file or a recipe: {', '.join(recipe_names())}")
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.max_steps=100")
    p.add_argument("--reference", action="store_true",
                   help="print the Markdown reference of every key (type, default, meaning) instead")
    p.set_defaults(func=run_config)


def resolved_yaml(cfg: JobConfig, command: str) -> str:
    """The config as a YAML file that loads back to ``cfg``, headed by the command that made it."""
    header = (f"# {command}\n"
              "# resolved: defaults + file + overrides, validated; drafter keys left null are read\n"
              "# from the target model when training starts\n")
    body = yaml.dump(_plain(cfg.to_dict()), Dumper=_SectionDumper, sort_keys=False, width=1000)
    return header + body


class _SectionDumper(yaml.SafeDumper):
    """Sections and keys one per line; lists on one line (``paths: [a.jsonl]``), as recipes write them."""


_SectionDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))


def run_config(args) -> int:
    if args.reference:
        if args.config or args.overrides:
            raise ValueError("--reference prints every key's reference; it takes no config or overrides")
        print(render_markdown(), end="")
        return 0
    if not args.config:
        raise ValueError(f"name a config file or a recipe ({', '.join(recipe_names())}), or pass --reference")
    cfg = load_config(args.config, list(args.overrides))
    print(resolved_yaml(cfg, shlex.join(["dflash-train", "config", args.config, *args.overrides])), end="")
    return 0
