"""Jobs killed mid-way, for the resume tests (test_pipeline.py, test_jobs.py, test_dask.py).

The kill is the job's own per-chunk callback (``on_chunk`` of `Pipeline.run`,
`Pipeline.run_span`, `dspk.dask.run_split` and `dspk.dask.preprocess_many`): `KillAfter` ends
the process abruptly (``os._exit(137)``: no cleanup, no ``finally``, as a kill would) once a
number of samples are committed. It is picklable, so Dask workers can be given it; with a
"once" file only the first process to get there dies, and the retried job completes.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample.nwb"


class KillAfter:
    """``on_chunk`` callback: ``os._exit(137)`` once ``samples`` are done; with ``once_file``,
    only the first process to get there (it creates the file) dies."""

    def __init__(self, samples: int, once_file=None) -> None:
        self.samples = int(samples)
        self.once_file = None if once_file is None else str(once_file)

    def __call__(self, done: int) -> None:
        if done < self.samples:
            return
        if self.once_file is not None:
            try:
                os.close(os.open(self.once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        os._exit(137)


def run_killable_job(tmp_path, out, options: str, kill_after=None, by_path=False) -> int:
    """Exit status of ``Pipeline.from_options(<options>).run(SAMPLE, out, chunk_s=0.5,
    resume=True)`` run in a fresh process in ``tmp_path`` (137 when killed by
    ``KillAfter(kill_after)``); the sample given as a path (run opens it) or as an opened
    recording."""
    source = repr(str(SAMPLE)) if by_path else f"dspk.open_recording({str(SAMPLE)!r})"
    kill = "None" if kill_after is None else f"KillAfter({int(kill_after)})"
    code = ("import dspk\n"
            "from tests.killable import KillAfter\n"
            f"p = dspk.Pipeline.from_options({options})\n"
            f"p.run({source}, {str(out)!r}, chunk_s=0.5, resume=True, progress=False,\n"
            f"      on_chunk={kill})\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True).returncode
