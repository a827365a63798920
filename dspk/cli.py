"""The ``dspk`` command.

    dspk info              backend, devices and the tuner cache
    dspk tune-cache show   the tuned choices stored on disk
    dspk tune-cache clear  forget them (re-tuned on next use)

The preprocessing job (``dspk preprocess``) arrives with the pipeline.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .backend import gpu_unavailable_reason, resolve_backend


def _info(args: argparse.Namespace) -> int:
    from .linalg.tuner import cache_path, tune_mode  # noqa: PLC0415

    print(f"dspk {__version__}")
    print(f"backend: {resolve_backend(args.backend)}")
    reason = gpu_unavailable_reason()
    if reason is None:
        from .backend import cupy_module, device_name  # noqa: PLC0415

        cp = cupy_module()
        for i in range(cp.cuda.runtime.getDeviceCount()):
            print(f"gpu {i}: {device_name(i)}")
        print(f"cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
    else:
        print(f"gpu: none ({reason})")
    print(f"tuner: DSPK_TUNE={tune_mode()}, cache {cache_path()}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    from .linalg.tuner import _read_cache, cache_path  # noqa: PLC0415

    path = cache_path()
    if args.action == "clear":
        if path.exists():
            path.unlink()
            print(f"removed {path}")
        else:
            print(f"no cache at {path}")
        return 0
    entries = _read_cache(path)
    if not entries:
        print(f"no tuned choices in {path}")
        return 0
    for key, entry in sorted(entries.items()):
        times = entry.get("timings_ms", {})
        best = entry["ranking"][0] if entry["ranking"] else "?"
        print(f"{key}\n    -> {best} ({times.get(best, float('nan')):.4g} ms); "
              f"ranking {json.dumps(entry['ranking'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dspk", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dspk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="backend, devices and tuner cache")
    p_info.add_argument("--backend", default=None, help="auto, cpu or gpu ($DSPK_BACKEND)")
    p_info.set_defaults(func=_info)
    p_cache = sub.add_parser("tune-cache", help="show or clear the tuner's stored choices")
    p_cache.add_argument("action", choices=("show", "clear"))
    p_cache.set_defaults(func=_cache)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # a clear one-line error for the command line
        print(f"dspk: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
