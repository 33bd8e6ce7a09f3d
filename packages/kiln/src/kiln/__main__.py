"""``python -m kiln cache info`` and ``python -m kiln cache clear``.

``info`` prints the cache root and, per part (graphs, cpp, runtime, triton), its folder,
size and entries; ``clear`` removes them all without asking. ``--dir PATH`` names a root
other than ``$KILN_CACHE_DIR`` (else ``~/.cache/kiln``).
"""

from __future__ import annotations

import argparse
import sys

from kiln.cache_folders import cache_info, clear_cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cache = commands.add_parser("cache", help="the on-disk cache")
    action = cache.add_subparsers(dest="action", required=True)
    for name, text in (("info", "where it lies and its size"), ("clear", "remove it all")):
        sub = action.add_parser(name, help=text)
        sub.add_argument("--dir", help="the cache root (default: $KILN_CACHE_DIR)")
    args = parser.parse_args(argv)
    if args.action == "info":
        print(cache_info(args.dir))
    else:
        removed = clear_cache(args.dir)
        print(f"removed {removed.size_bytes / 2**20:.1f} MB under {removed.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
