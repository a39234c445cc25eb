"""awq-fast-dequant inspect: per-layer statistics of the dequantized weights, and
the quantization error against a dense reference, checked against statistics
computed here from the NumPy reference.  Skipped without safetensors."""

import json

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="inspect needs safetensors")

import awq_fast_dequant as awq  # noqa: E402
from awq_fast_dequant import checkpoint as ck  # noqa: E402
from awq_fast_dequant import inspect_ckpt  # noqa: E402
from awq_fast_dequant import reference  # noqa: E402
from awq_fast_dequant.__main__ import main  # noqa: E402

from checkpoint_helpers import G, safetensors_numpy, write_checkpoint  # noqa: E402

SHAPES = {"a.q_proj": (64, 96), "b.down_proj": (96, 64), "c.narrow": (32, 8)}  # (K, N)


@pytest.fixture
def model(rng, tmp_path):
    """(AWQ folder, dense reference file, trained [N, K] weights, packed layers)."""
    dense, packed, t = {}, {}, {}
    for prefix, (K, N) in SHAPES.items():
        w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)  # nn.Linear layout
        qw, qz, sc = awq.quantize(np.ascontiguousarray(w.T), G)
        dense[prefix + ".weight"], packed[prefix] = w, (qw, qz, sc)
        t[prefix + ".qweight"], t[prefix + ".qzeros"], t[prefix + ".scales"] = qw, qz, sc
    t["norm.weight"] = np.ones(8, np.float32)
    src = write_checkpoint(tmp_path / "src", t, extra=False)
    ref = tmp_path / "dense.safetensors"
    safetensors_numpy.save_file(dense, str(ref))
    return src, ref, dense, packed


def expected_stats(qw, qz, sc):
    w = reference.dequantize(qw, qz, sc, group_size=G, out_dtype="float32").astype(np.float64)
    finite = np.isfinite(w)
    q = awq.unpack(qw)
    return {"min": w[finite].min(), "max": w[finite].max(), "mean_abs": np.abs(w[finite]).mean(),
            "nonfinite": int((~finite).sum()), "at_range_ends": np.mean((q == 0) | (q == 15))}


def test_statistics_match_the_reference(model):
    src, _, _, packed = model
    report = inspect_ckpt.inspect_checkpoint(src)
    assert [s.name for s in report.layers] == sorted(SHAPES)
    for s in report.layers:
        K, N = SHAPES[s.name]
        assert (s.in_features, s.out_features, s.group_size, s.scales_dtype) == (
            K, N, G, "float32")
        want = expected_stats(*packed[s.name])
        for key, value in want.items():
            assert getattr(s, key) == pytest.approx(value, rel=1e-6), key
        assert s.max_err_steps is None and s.mean_abs_err is None
    assert report.other_tensors == 1 and report.files == 1
    assert report.quantization["group_size"] == G
    assert report.total.min == min(s.min for s in report.layers)
    assert report.total.max == max(s.max for s in report.layers)


def test_error_against_the_reference(model):
    src, ref, dense, packed = model
    report = inspect_ckpt.inspect_checkpoint(src, reference=ref)
    worst = 0.0
    for s in report.layers:
        qw, qz, sc = packed[s.name]
        w = reference.dequantize(qw, qz, sc, group_size=G, out_dtype="float32").astype(np.float64)
        err = np.abs(w - dense[s.name + ".weight"].T.astype(np.float64))
        steps = err / np.repeat(sc.astype(np.float64), G, axis=0)
        assert s.max_err_steps == pytest.approx(steps.max(), rel=1e-5)
        assert s.mean_abs_err == pytest.approx(err.mean(), rel=1e-5)
        assert s.max_err_steps <= 0.5 + 1e-5  # round to nearest: half a step
        worst = max(worst, s.max_err_steps)
    assert report.total.max_err_steps == worst


def test_a_wrong_reference_shows_up_as_error(model, tmp_path):
    src, _, dense, _ = model
    shifted = {k: v + 0.01 for k, v in dense.items()}
    ref = tmp_path / "shifted.safetensors"
    safetensors_numpy.save_file(shifted, str(ref))
    report = inspect_ckpt.inspect_checkpoint(src, reference=ref)
    assert report.total.max_err_steps > 0.5


def test_nonfinite_and_zero_scales(tmp_path, rng):
    qw, qz, sc = awq.quantize(rng.standard_normal((64, 16)).astype(np.float16), G)
    sc = sc.copy()
    sc[0, 3], sc[1, 5], sc[0, 0] = np.nan, np.inf, 0
    src = write_checkpoint(tmp_path / "src", {"l.qweight": qw, "l.qzeros": qz, "l.scales": sc},
                           extra=False)
    (s,) = inspect_ckpt.inspect_checkpoint(src).layers
    want = expected_stats(qw, qz, sc)
    assert s.nonfinite == want["nonfinite"] > 0
    assert (s.min, s.max) == pytest.approx((want["min"], want["max"]))


def test_blocks_of_rows_give_the_same_statistics(model, monkeypatch):
    src, ref, _, _ = model
    whole = inspect_ckpt.inspect_checkpoint(src, reference=ref)
    monkeypatch.setattr(inspect_ckpt, "_BLOCK_ELEMS", 1)  # one group of rows per block
    blocks = inspect_ckpt.inspect_checkpoint(src, reference=ref)
    for a, b in zip(whole.layers, blocks.layers):
        assert a.min == b.min and a.max == b.max and a.nonfinite == b.nonfinite
        assert a.at_range_ends == b.at_range_ends and a.max_err_steps == b.max_err_steps
        assert a.mean_abs == pytest.approx(b.mean_abs, rel=1e-12)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.pop("b.down_proj.weight"), "no tensor 'b.down_proj.weight'"),
    (lambda d: d.__setitem__("b.down_proj.weight", d["b.down_proj.weight"].T.copy()),
     r"expected \[out_features, in_features\] = \[64, 96\]"),
    (lambda d: d.__setitem__("b.down_proj.weight",
                             d["b.down_proj.weight"].astype(np.int32)), "expected a float type"),
])
def test_bad_reference(model, tmp_path, edit, words):
    src, _, dense, _ = model
    edit(dense)
    ref = tmp_path / "bad.safetensors"
    safetensors_numpy.save_file(dense, str(ref))
    with pytest.raises(ck.CheckpointError, match=words):
        inspect_ckpt.inspect_checkpoint(src, reference=ref)


def test_cli_table_and_json(model, capsys):
    src, ref, _, _ = model
    assert main(["inspect", str(src), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "3 quantized layers" in table and "at ends" in table and "err/step" not in table
    for name in SHAPES:
        assert name in table
    assert main(["inspect", str(src), "--reference", str(ref), "--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["layers"]] == sorted(SHAPES)
    assert 0 < data["total"]["max_err_steps"] <= 0.5 + 1e-5


def test_cli_error(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nothing"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "inspect: error:" in err and "no such file" in err
