"""When each channel of a Neuropixels probe is sampled: the ADC sample shifts that
`dspk.ops.phase_shift` corrects, from the probe's part number or type and the readout
channels a recording holds.

The probes digitise their readout channels serially within each ADC and all ADCs at once:
within every block of 2n readout channels (n channels per ADC), the even channels go to one
ADC and the odd ones to the next, channel ``c`` being the ``(c mod 2n) // 2``-th sampled.
NP1.0 and its variants (and NHP, UHD): 32 ADCs of n = 12 channels, a cycle of 13 slots per
sample (12 AP channels and one LFP slot), so the shifts are k/13; NP2.0 (1 and 4 shanks) and
the later NP2/NP3 families with 16 channels per ADC: 24 (or more) ADCs, shifts k/16. This is
the multiplexing table of the probes' ProbeTable (``mux_np1000``, ``mux_np2000``,
``mux_np2020``, ``mux_np3010``, ``mux_np3020`` in probeinterface's
``neuropixels_probe_features.json``, checked against it in tests/io/test_sample_shifts.py),
and shift = sample order / cycle is how SpikeInterface's readers compute the
``inter_sample_shift`` property (``get_neuropixels_sample_shifts_from_probe``). The 128-channel
probes whose table is irregular (NP1200, NP1210, NP3000) and unknown parts get None.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["neuropixels_sample_shifts", "NP1_PARTS", "NP2_PARTS"]

#: part numbers multiplexed as NP1.0: 12 channels per ADC, 13 slots per sample
NP1_PARTS = frozenset(
    {"NP1000", "NP1001", "NP1020", "NP1021", "NP1022", "NP1030", "NP1031", "NP1032", "NP1033",
     "NP1040", "NP1041", "NP1042", "NP1050", "NP1051", "NP1100", "NP1110", "NP1120", "NP1121",
     "NP1122", "NP1123", "NP1300", "NP1400", "PRB_1_2_0480_2", "PRB_1_4_0480_1",
     "PRB_1_4_0480_1_C"} | {f"NP10{i}" for i in range(10, 18)})
#: part numbers multiplexed as NP2.0: 16 channels per ADC, 16 slots per sample (no LFP band)
NP2_PARTS = frozenset(
    {"NP2000", "NP2003", "NP2004", "NP2005", "NP2006", "NP2010", "NP2013", "NP2014", "NP2300",
     "PRB2_1_2_0640_0", "PRB2_4_2_0640_0", "NP2020", "NP2021", "NP2022", "NP3010", "NP3011",
     "NP3012", "NP3020", "NP3021", "NP3022", "NP3023", "NP3024"})
#: the same families by SpikeGLX's ``imDatPrb_type`` (for metadata without a part number)
NP1_TYPES = frozenset({0, 1015, 1020, 1022, 1030, 1031, 1032, 1100, 1110, 1120, 1121, 1122,
                       1123, 1300})
NP2_TYPES = frozenset({21, 24, 2003, 2013, 2020, 3010, 3020, 3022})
#: (channels per ADC, slots per sample) of each family
MUX = {"np1": (12, 13), "np2": (16, 16)}


def _family(part_number: str | None, probe_type: int | None) -> str | None:
    if part_number:
        pn = part_number.strip()
        return "np1" if pn in NP1_PARTS else "np2" if pn in NP2_PARTS else None
    if probe_type is None:
        return None
    return "np1" if probe_type in NP1_TYPES else "np2" if probe_type in NP2_TYPES else None


def neuropixels_sample_shifts(readout: Any, part_number: str | None = None,
                              probe_type: int | None = None) -> np.ndarray | None:
    """The ADC sample shift of each readout channel, in samples: its sampling order within its
    ADC's cycle over the cycle's length (k/13 on NP1.0, k/16 on NP2.0), as SpikeInterface's
    readers set ``inter_sample_shift``; None for a probe whose multiplexing is not known.

    Parameters
    ----------
    readout : array-like of int
        Readout channel numbers (the IMRO table's index: 0..383 on a 384-channel probe), one
        per recording channel, in its order.
    part_number : str, optional
        The probe's part number (SpikeGLX ``imDatPrb_pn``: ``"NP1000"``,
        ``"PRB_1_4_0480_1"``, ``"NP2014"``, ...); wins over ``probe_type``.
    probe_type : int, optional
        SpikeGLX's ``imDatPrb_type`` (0: NP1.0, 21: NP2.0 one shank, 24: four shanks, ...),
        used when there is no part number.

    Returns
    -------
    numpy.ndarray or None
        float64 shifts in [0, 1), one per readout channel.

    Examples
    --------
    >>> from dspk.io.adc import neuropixels_sample_shifts
    >>> neuropixels_sample_shifts([0, 1, 2, 3, 22, 23, 24], "NP1000") * 13
    array([ 0.,  0.,  1.,  1., 11., 11.,  0.])
    >>> neuropixels_sample_shifts([0, 2, 30, 32], probe_type=24) * 16
    array([ 0.,  1., 15.,  0.])
    >>> neuropixels_sample_shifts([0, 1], "NP1200") is None        # irregular multiplexing
    True
    """
    family = _family(part_number, probe_type)
    if family is None:
        return None
    per_adc, cycle = MUX[family]
    r = np.asarray(readout, dtype=np.int64)
    return ((r % (2 * per_adc)) // 2) / float(cycle)
