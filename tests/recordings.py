"""Recordings as users have them on disk, written for tests: SpikeGLX .bin/.meta pairs
(NP1.0, NP2.0), Open Ephys folders and probeinterface files, with the gains and geometry
their own readers give."""

import json

import numpy as np


NP1_AP_GAINS = [50, 125, 250, 500, 1000, 1500, 2000, 3000]     # the NP1.0 gain settings


def np1_ap_gain(c):
    return NP1_AP_GAINS[c % 8]


def np1_lf_gain(c):
    return NP1_AP_GAINS[(c + 3) % 8]


def np1_xy(col, row):
    """NP1.0 site position as SpikeGLX documents it: staggered, 32 µm between the columns of a
    row, odd rows shifted 16 µm left, rows 20 µm apart."""
    return (27.0 if row % 2 == 0 else 11.0) + 32.0 * col, 20.0 * row


def pi_xy(col, row, x0=11.0):
    """The same site as probeinterface places it (``read_spikeglx``, by part number, what
    dspk reads): SpikeGLX's layout with the x origin at the probe's leftmost column (NP1.0:
    11 µm; NP2.0: 27 µm)."""
    x, y = np1_xy(col, row)
    return x - x0, y


def printer_list(ids):
    """A SpikeGLX printer-like list of sorted channel numbers ("0:9,100:109,768")."""
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(f"{ids[i]}:{ids[j]}" if j > i else str(ids[i]))
        i = j + 1
    return ",".join(out)


def np1_meta(stored_ids=None, band="ap", geom=("shank",)):
    """A NP1.0 .meta as SpikeGLX 20230425 writes it (bank 0, site 191 is the reference)."""
    ap = band == "ap"
    neural = list(range(384)) if stored_ids is None else list(stored_ids)
    n_saved = len(neural) + 1
    meta = {
        "acqApLfSy": "384,384,1", "appVersion": "20230425", "fileCreateTime": "2024-03-01T10:00:00",
        "fileName": f"D:/data/run_g0/run_g0_imec0/run_g0_t0.imec0.{band}.bin",
        "fileSHA1": "0" * 40, "firstSample": "123456", "gateMode": "0",
        "imAiRangeMax": "0.6", "imAiRangeMin": "-0.6", "imCalibrated": "true",
        "imDatApi": "3.62", "imDatBs_fw": "2.0.137", "imDatPrb_pn": "PRB_1_4_0480_1",
        "imDatPrb_sn": "18194814202", "imDatPrb_type": "0", "imLEDEnable": "false",
        "imMaxInt": "512", "imSampRate": "30000" if ap else "2500", "imTrgSource": "0",
        "nSavedChans": str(n_saved),
        "snsApLfSy": f"{len(neural)},0,1" if ap else f"0,{len(neural)},1",
        "snsSaveChanSubset": "all" if stored_ids is None else
        printer_list([c if ap else c + 384 for c in neural] + [768]),
        "syncImInputSlot": "2", "trigMode": "0", "typeImEnabled": "1", "typeThis": "imec",
        "userNotes": "",
        "~imroTbl": "(0,384)" + "".join(f"({c} 0 0 {np1_ap_gain(c)} {np1_lf_gain(c)} 1)"
                                        for c in range(384)),
        "~snsChanMap": f"({len(neural) if ap else 0},{0 if ap else len(neural)},1)" +
        "".join(f"({'AP' if ap else 'LF'}{c};{i}:{i})" for i, c in enumerate(neural)) +
        f"(SY0;{len(neural)}:{len(neural)})",
    }
    if "shank" in geom:
        meta["~snsShankMap"] = "(1,2,480)" + "".join(
            f"(0:{c % 2}:{c // 2}:{0 if c == 191 else 1})" for c in neural)
    if "geom" in geom:
        meta["~snsGeomMap"] = "(PRB_1_4_0480_1,1,0,70)" + "".join(
            "(0:{:g}:{:g}:{})".format(*np1_xy(c % 2, c // 2), 0 if c == 191 else 1)
            for c in neural)
    return meta


def write_sglx(folder, name, data, meta, file_size=None):
    """The .bin ([samples, channels] int16, no header) and its .meta beside it."""
    path = folder / name
    data.astype(np.int16).tofile(path)
    meta = dict(meta)
    meta["fileSizeBytes"] = str(path.stat().st_size if file_size is None else file_size)
    meta["fileTimeSecs"] = str(data.shape[0] / float(meta.get("imSampRate",
                                                               meta.get("niSampRate", 1))))
    with open(path.with_suffix(".meta"), "w", newline="\r\n") as f:   # SpikeGLX: Windows EOLs
        f.write("".join(f"{k}={v}\n" for k, v in sorted(meta.items())))
    return path


def rand16(n, c, seed=0):
    return np.random.default_rng(seed).integers(-2000, 2000, (n, c), dtype=np.int16)


def np2_meta(ptype, n=384, with_maxint=True):
    four = ptype == 24
    entries = "".join(f"({c} {c // 96 if four else 0} 0 0 {c % 96 if four else c})" if four
                      else f"({c} 1 0 {c})" for c in range(n))
    meta = {"typeThis": "imec", "imSampRate": "30000", "nSavedChans": str(n + 1),
            "snsApLfSy": f"{n},0,1", "acqApLfSy": f"{n},0,1", "snsSaveChanSubset": "all",
            "imAiRangeMax": "0.5", "imAiRangeMin": "-0.5", "imDatPrb_type": str(ptype),
            "imDatPrb_pn": "NP2014" if four else "NP2000",
            "~imroTbl": f"({ptype},{n}){entries}"}
    if with_maxint:
        meta["imMaxInt"] = "8192"
    if four:   # 4 shanks, 250 µm apart; x within the shank, z up the shank
        meta["~snsGeomMap"] = "(NP2014,4,250,70)" + "".join(
            f"({c // 96}:{27 + 32 * (c % 2)}:{15 * ((c % 96) // 2)}:1)" for c in range(n))
    else:
        meta["~snsShankMap"] = "(1,2,640)" + "".join(f"(0:{c % 2}:{c // 2}:1)"
                                                     for c in range(n))
    return meta


def oe_stream(folder_name, n, rate=30000.0, names=None, bit_volts=0.195, units="uV", **extra):
    names = names or [f"CH{i + 1}" for i in range(n)]
    chans = [{"channel_name": nm, "description": "headstage data channel",
              "identifier": "genericdata.continuous", "history": "Neuropix-PXI",
              "bit_volts": (bit_volts if not nm.startswith(("ADC", "AUX")) else 0.00015),
              "units": (units if not nm.startswith(("ADC", "AUX")) else "V"),
              "source_processor_index": i, "recorded_processor_index": i}
             for i, nm in enumerate(names)]
    return dict({"folder_name": folder_name + "/", "sample_rate": rate,
                 "source_processor_name": "Neuropix-PXI", "source_processor_id": 100,
                 "recorded_processor": "Record Node", "recorded_processor_id": 101,
                 "num_channels": n, "channels": chans}, **extra)


def write_oe(root, streams, data, recording="recording1"):
    """A Record Node 101/experiment1/<recording> folder in the documented layout."""
    rec_dir = root / "Record Node 101" / "experiment1" / recording
    for s, x in zip(streams, data):
        d = rec_dir / "continuous" / s["folder_name"].rstrip("/")
        d.mkdir(parents=True)
        x.astype(np.int16).tofile(d / "continuous.dat")
        np.save(d / "sample_numbers.npy", np.arange(x.shape[0], dtype=np.int64))
        np.save(d / "timestamps.npy", np.arange(x.shape[0]) / s.get("sample_rate", 3e4))
    (rec_dir / "events").mkdir(exist_ok=True)
    (rec_dir / "structure.oebin").write_text(json.dumps(
        {"GUI version": "0.6.7", "continuous": streams, "events": [], "spikes": []}, indent=4))
    return rec_dir


def neuropixels_oe(tmp_path):
    streams = [oe_stream("Neuropix-PXI-100.ProbeA-AP", 384, stream_name="ProbeA-AP"),
               oe_stream("Neuropix-PXI-100.ProbeA-LFP", 384, 2500.0, stream_name="ProbeA-LFP"),
               oe_stream("NI-DAQmx-102.PXIe-6341", 8, names=[f"AI{i}" for i in range(8)],
                         bit_volts=0.00030518, units="V", stream_name="PXIe-6341")]
    data = [rand16(900, 384, 10), rand16(75, 384, 11), rand16(900, 8, 12)]
    return write_oe(tmp_path, streams, data), data


def pi_json(path, probes):
    path.write_text(json.dumps({"specification": "probeinterface", "version": "0.2.24",
                                "probes": probes}))
    return path


class TinySIRecording:
    """The methods of a SpikeInterface recording, and nothing else: 2 int16 channels of 10
    zero samples at 30 kHz, no probe (what dspk reads of one without importing SpikeInterface)."""

    def get_num_segments(self): return 1
    def has_scaleable_traces(self): return False
    def get_channel_locations(self): raise ValueError("no probe")
    def get_sampling_frequency(self): return 3e4
    def get_num_channels(self): return 2
    def get_num_samples(self, segment_index=0): return 10
    def get_dtype(self): return np.dtype(np.int16)
    def get_channel_ids(self): return np.array(["a", "b"])
    def get_traces(self, segment_index, start_frame, end_frame, channel_ids):
        return np.zeros((end_frame - start_frame, len(channel_ids)), np.int16)
