"""``kame config show|schema``: the effective config (secrets masked) or its documentation."""

from __future__ import annotations

import argparse

NAME = "config"
HELP = "Show the effective configuration (secrets masked) or write its documentation."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show", "docs"], help="show: effective config as YAML; docs: Markdown schema.")


def run(args: argparse.Namespace) -> int:
    from kame.config import dump_yaml
    from kame.server.config import AppConfig, load_app_config

    if args.action == "docs":
        from kame.config_docs import render_markdown

        print(render_markdown(AppConfig), end="")
        return 0
    cfg = load_app_config(args.config)
    print(dump_yaml(cfg), end="")
    return 0
