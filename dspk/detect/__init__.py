"""Universal-template spike detection on whitened traces.

Each channel is correlated with a small bank of temporal templates (`dspk.fir_bank`: the
[k, taps]·im2col(x) product without im2col); channels are combined around every position of
the probe with Gaussian spatial weights of several widths (a batched product through
`dspk.matmul`: [widths, neighbours] · [neighbours, templates·time] per position); the best
template and width per position and sample give a score in noise standard deviations; spikes
are the scores above the threshold that are the largest within ±``dead_time`` samples and among
the neighbouring positions.

**The threshold's unit is the measured noise of each template's output.** Whitening makes the
noise of every channel unit-variance, not white: after a 300 Hz high-pass its power sits in
300–6000 Hz, and a unit-norm template passes more of it than of white noise (measured: the
default bank's outputs have noise SDs of 1.5–1.7 on band-limited noise, up to 2.4 on a
1/f-tilted spectrum, 1.0 on white noise, so a threshold in channel SDs gave hundreds of false
spikes per second). Each channel's output of each template is therefore divided by its robust
noise SD, the median absolute output / 0.6745 (`template_noise`), measured on the fit chunks in
a pipeline or on the batch itself in a one-shot call; with unit-norm spatial weights over
channels whose noise is independent, every combined score has unit noise, and the false-alarm
rate of a threshold no longer depends on the spectrum.

Positions are the channel positions (one per channel), so the cost is linear in the channel
count whatever the probe's shape (Kilosort4's regular grid grows with sparse and multi-shank
probes). Intermediates beyond the bank output are bounded by ``memory_bytes``: time (or the
scored windows) is processed in blocks, the [positions, widths, templates, time] tensor never
exists whole.

Three implementations give the same spikes (the first two to the bit; the fused kernels
within float tolerance at threshold ties: a score equal to the threshold or to a neighbour's to
the last bits may go either way):

- CuPy input the fused kernels cannot take: the engine path above (every score: gathered
  neighbours, batched `dspk.matmul`; maxima with ``maximum_filter1d``). It is the reference.
- NumPy input: the same scores (the same products, summed in the same order by the same
  BLAS), computed only where they can reach the threshold. By Cauchy–Schwarz (the weights are
  positive, of unit norm) a score is at most the root of the sum over the neighbours of the
  squared largest positive output over the templates; that bound is taken per window of
  `BOUND_WINDOW` samples (2–4 % of the (position, window) pairs reach the threshold on
  whitened Neuropixels data with ~750 spikes/s), and only those windows are scored. A spike is
  at least the threshold and every score around it, so its maxima are found among the points
  above the threshold alone. The noise of each output is measured in the same pass over the
  bank output, channel by channel in chunks that stay in L2 (`template_noise`'s values).
- CuPy input: fused kernels (dspk/kernels/detect.cu, `dspk.detect._gpu`). `dspk.fir_bank` runs
  on one time block at a time (with ``taps//2`` samples of real data on each side); one kernel
  combines the neighbours with every width and keeps the best width and template per position
  and sample in registers (the [positions, widths, templates, time] tensor is never written,
  nor is the gathered [positions, neighbours, templates, time] one), and a second finds the
  local maxima, testing the window only where the score passes the threshold. The
  [positions, samples] score and best template are all that is kept for the whole batch.
  `dspk.detect._gpu.fused_reason` says when the kernels cannot take the sizes (more than 8
  widths, 64 neighbours or 127 templates, other dtypes).

The package's modules: `dspk.detect.templates` (the temporal bank, default or learned),
`dspk.detect.noise` (robust noise SDs: the threshold's unit), `dspk.detect.spikes`
(`detect_spikes`, `template_noise`, the engine path), `dspk.detect.spikes_cpu` (the bounded
NumPy path), `dspk.detect._gpu` (the fused kernels), `dspk.detect.features` (each spike's
waveforms and PCA features) and `dspk.detect.peaks` (spikes as SpikeInterface's peaks).
"""

from .features import spike_clips, spike_features
from .peaks import PEAK_DTYPE, PEAK_LOCATION_DTYPE, spikes_to_peaks
from .spikes import (SPIKE_DTYPE, detect_spikes, detection_lag, detection_margin,
                     template_noise)
from .templates import default_templates, learn_templates

# names that the rest of dspk, the tests and the benchmarks reach as dspk.detect.<name>, where
# they stood before detection became a package
from .noise import (MAD_TO_SD, NOISE_SAMPLES, _abs_median, _host_abs_median,  # noqa: F401
                    _inverse_noise, _noise_check, _noise_samples)
from .spikes import (NEIGHBOURHOOD_PROBES, _engine_scores, _local_maxima,  # noqa: F401
                     _neighbourhoods, _template_noise)
from .spikes_cpu import _cpu_noise, _cpu_spikes, _sparse_maxima  # noqa: F401
from .templates import TROUGH_TAP  # noqa: F401

__all__ = ["detect_spikes", "default_templates", "learn_templates", "spike_features",
           "spike_clips", "template_noise", "detection_margin", "detection_lag",
           "spikes_to_peaks", "SPIKE_DTYPE", "PEAK_DTYPE", "PEAK_LOCATION_DTYPE"]
