"""dspk.io.to_uv: the one raw -> µV conversion, bit-identical to the expression `Recording.read`
used before it (cast to float32, times the float32 gains unless all are 1, plus the float32
offsets unless all are 0), for every stored dtype and any strides."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspk.io import open_recording, to_uv
from dspk.io.recording import RAW_DTYPES


def old_expression(raw, gain, offset):
    """Recording.read's scaling as it was written before to_uv (dspk 0.5.0)."""
    out = raw.astype(np.float32)
    if np.any(gain != 1):
        out *= gain.astype(np.float32)[:, None]
    if np.any(offset != 0):
        out += offset.astype(np.float32)[:, None]
    return out


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def test_uint16_with_per_channel_gains_is_bit_identical():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 65536, (6, 1000), dtype=np.uint16)
    gain = rng.uniform(0.1, 3.0, 6)
    offset = -32768 * gain
    out = to_uv(raw, gain, offset)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == raw.shape
    np.testing.assert_array_equal(bits(out), bits(old_expression(raw, gain, offset)))
    # and it is µV: raw * gain + offset within float32 rounding
    np.testing.assert_allclose(out, raw * gain[:, None] + offset[:, None], rtol=1e-5,
                               atol=1e-2)


def test_int16_trivial_gain_and_offset_skip_the_passes_but_copy():
    raw = np.arange(-6, 6, dtype=np.int16).reshape(3, 4)
    out = to_uv(raw, np.ones(3), np.zeros(3))
    np.testing.assert_array_equal(out, raw.astype(np.float32))
    f = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = to_uv(f, np.ones(3), np.zeros(3))
    assert out is not f and not np.shares_memory(out, f)      # always a new array
    out[0, 0] = 99.0
    assert f[0, 0] == 0.0


def test_a_transposed_view_gives_a_c_contiguous_result():
    block = np.random.default_rng(1).integers(-2000, 2000, (500, 7), dtype=np.int16)
    gain = np.linspace(0.5, 2.0, 7)
    out = to_uv(block.T, gain, np.full(7, 3.0))
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(bits(out), bits(old_expression(block.T.copy(), gain,
                                                                 np.full(7, 3.0))))


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"raw: expected \[channels, samples\]"):
        to_uv(np.zeros(5, np.int16), np.ones(1), np.zeros(1))
    with pytest.raises(ValueError, match=r"gain_to_uv: expected one value per channel \(3\)"):
        to_uv(np.zeros((3, 5), np.int16), np.ones(2), np.zeros(3))
    with pytest.raises(ValueError, match=r"offset_to_uv: expected one value per channel"):
        to_uv(np.zeros((3, 5), np.int16), np.ones(3), np.zeros((3, 1)))


def test_recording_read_converts_through_to_uv():
    raw = np.random.default_rng(2).integers(0, 65536, (3000, 5), dtype=np.uint16)
    gain = np.array([0.195, 0.5, 1.0, 2.0, 0.1])
    rec = open_recording(raw, fs=3e4, gain_to_uv=gain)
    idx = [4, 0, 2]
    got = rec.read(10, 900, channels=idx)
    want = to_uv(rec.read(10, 900, channels=idx, scaled=False), rec.gain_to_uv[idx],
                 rec.offset_to_uv[idx])
    np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(got), bits(old_expression(
        raw[10:900, idx].T.copy(), rec.gain_to_uv[idx], rec.offset_to_uv[idx])))


@st.composite
def raw_views(draw):
    """A [channels, samples] array of a stored dtype with C, transposed, strided or reversed
    strides."""
    dtype = draw(st.sampled_from(RAW_DTYPES))
    c, n = draw(st.integers(1, 9)), draw(st.integers(0, 70))
    kind = draw(st.sampled_from(["c", "transposed", "strided", "reversed", "fortran"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.kind == "f":
        base = (rng.standard_normal((2 * c, 2 * n + 1)) * 1e4).astype(dtype)
    else:
        info = np.iinfo(dtype)
        base = rng.integers(info.min, info.max, (2 * c, 2 * n + 1), dtype=dtype,
                            endpoint=True)
    if kind == "c":
        raw = np.ascontiguousarray(base[:c, :n])
    elif kind == "transposed":                  # a [samples, channels] block's .T
        raw = np.ascontiguousarray(base[:c, :n].T).T
    elif kind == "strided":
        raw = base[::2, : 2 * n : 2][:c]
    elif kind == "reversed":
        raw = base[:c, :n][::-1, ::-1]
    else:
        raw = np.asfortranarray(base[:c, :n])
    return raw


channel_values = st.one_of(st.just(1.0), st.just(0.0),
                           st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))


@settings(max_examples=200, deadline=None)
@given(raw=raw_views(), data=st.data())
def test_to_uv_matches_the_old_expression_bit_for_bit(raw, data):
    c = raw.shape[0]
    gain = np.array(data.draw(st.lists(channel_values, min_size=c, max_size=c), label="gain"))
    offset = np.array(data.draw(st.lists(channel_values, min_size=c, max_size=c),
                                label="offset"))
    before = raw.copy()
    out = to_uv(raw, gain, offset)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == raw.shape
    assert not np.shares_memory(out, raw)
    np.testing.assert_array_equal(raw, before)                 # raw left as it was
    np.testing.assert_array_equal(bits(out), bits(old_expression(raw, gain, offset)))
