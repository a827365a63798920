"""A preprocessing job of the bundled sample in a fresh process, optionally killed (os._exit,
exit status 137) after a number of samples through the pipeline's DSPK_KILL_AFTER_SAMPLES hook:
the resume tests of test_pipeline.py and test_jobs.py."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample.nwb"


def run_killable_job(tmp_path, out, options: str, kill_after=None, by_path=False) -> int:
    """Exit status of ``Pipeline.from_options(<options>).run(SAMPLE, out, chunk_s=0.5,
    resume=True)`` run in ``tmp_path`` (137 when killed); the sample given as a path (run
    opens it) or as an opened recording."""
    source = repr(str(SAMPLE)) if by_path else f"dspk.open_recording({str(SAMPLE)!r})"
    code = ("import dspk\n"
            f"p = dspk.Pipeline.from_options({options})\n"
            f"p.run({source}, {str(out)!r}, chunk_s=0.5, resume=True, progress=False)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if kill_after is not None:
        env["DSPK_KILL_AFTER_SAMPLES"] = str(kill_after)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True).returncode
