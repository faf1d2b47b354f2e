"""uv's arguments for installing what pip would install on this machine, one per line.

uv installs in parallel (the first install of scripts/serve_default.sh: seconds instead of a minute),
but reads its own configuration, not pip's. A machine set up for pip (an index mirror, a directory
of wheels such as torch's CPU build, a constraints file) must be handed to uv, or uv would resolve
other builds: from PyPI, torch 2.13.0 for Linux is the CUDA build, gigabytes of it. The settings
come from `pip config list` (pip's files and PIP_* variables; a variable wins over a file, as in
pip). Only the options that choose what is installed are passed on.
"""

from __future__ import annotations

import ast
import subprocess
import sys

FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings(listing: str) -> dict[str, list[str]]:
    """{option: values} from `pip config list` lines such as `global.find-links='/opt/wheels'` or
    `:env:.extra-index-url='a b'` (several values are whitespace-separated, as pip reads them)."""
    chosen: dict[str, tuple[int, list[str]]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, _, option = key.rpartition(".")
        if not sep or option not in FLAGS:
            continue
        rank = 1 if section == ":env:" else 0
        if option not in chosen or rank >= chosen[option][0]:
            chosen[option] = (rank, str(ast.literal_eval(value)).split())
    return {option: values for option, (_, values) in chosen.items()}


def uv_args(settings: dict[str, list[str]]) -> list[str]:
    args = []
    for option, values in settings.items():
        if option == "index-url":
            values = values[:1]  # one default index
        for value in values:
            args += [FLAGS[option], value]
    return args


def main() -> None:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    print("\n".join(uv_args(pip_settings(listing))))


if __name__ == "__main__":
    main()
