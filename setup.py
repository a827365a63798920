"""The wheel's build hook (the project's metadata is in pyproject.toml).

A wheel ships dspk/kernels/prebuilt/: each CUDA source's fatbin and table, committed to the
repository (`dspk.kernels.fatbins`). Where one is missing or older than its source, and nvcc
is available, the hook builds it into the wheel first (``python -m dspk.kernels.build``; it
imports dspk, so it needs dspk's dependencies in the build environment: ``pip wheel
--no-build-isolation``); DSPK_BUILD_KERNELS=0 skips that. A fatbin still stale is left out of
the wheel, with a warning: NVRTC compiles those kernels at their first use, as the loader
would do anyway for a fatbin that does not match its source. An editable install uses the
tree's folder as it is (``python -m dspk.kernels.build --stale`` refreshes it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
KERNELS = ROOT / "dspk" / "kernels"


def _fatbins():
    """dspk/kernels/fatbins.py, loaded by path: it needs only the standard library, and the
    build environment need not be able to import dspk."""
    spec = importlib.util.spec_from_file_location("_dspk_fatbins", KERNELS / "fatbins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stale_fatbins(directory: Path) -> dict[str, str]:
    """Source -> why its fatbin in ``directory`` cannot be used with the tree's sources."""
    fb = _fatbins()
    found = {}
    for src in sorted(KERNELS.glob("*.cu")):
        why = fb.stale(fb.read_table(src.name, directory), fb.paste_headers(src.read_text()),
                       directory)
        if why is not None:
            found[src.name] = why
    return found


class BuildPy(build_py):
    """build_py, then the stale prebuilt fatbins of the wheel rebuilt (or left out)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        out = Path(self.build_lib) / "dspk" / "kernels" / "prebuilt"
        stale = stale_fatbins(out)
        nvcc = _fatbins().find_nvcc()
        if stale and nvcc and os.environ.get("DSPK_BUILD_KERNELS", "1") != "0":
            print(f"dspk: building the prebuilt kernels of {', '.join(stale)} with {nvcc}",
                  flush=True)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
            res = subprocess.run([sys.executable, "-m", "dspk.kernels.build", "--nvcc", nvcc,
                                  "--out", str(out), *stale], env=env, cwd=ROOT)
            if res.returncode:
                print("dspk: WARNING: building the prebuilt kernels failed (see above)",
                      flush=True)
            stale = stale_fatbins(out)
        for name, why in stale.items():
            stem = name.removesuffix(".cu")
            for ext in ("fatbin", "json"):
                (out / f"{stem}.{ext}").unlink(missing_ok=True)
            print(f"dspk: WARNING: no prebuilt kernels of {name} in the wheel ({why}); "
                  f"NVRTC compiles them at their first use", flush=True)


setup(cmdclass={"build_py": BuildPy})
