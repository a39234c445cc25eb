"""The tensor-core linear's fragment mapping, checked on the host (no GPU).

tests/cuda_host/test_mma_layout.cpp runs the warps of the MMA kernel lane by
lane with the kernel's own index and bit functions (csrc/cuda/linear_layout.cuh)
and feeds the fragments to an emulation of mma.m16n8k16 written from the PTX
ISA; every value is exact in double, so y must equal x @ W (+ bias) exactly.
These tests build it with the host's C++ compiler and run it, and check that
it does catch a wrong mapping.

tests/cuda_host/test_gemv_layout.cpp does the same for the decode kernel
(gemv_map): in its shared-memory stage every copied byte lands once where the
layout puts it, every lane's fragment loads read its fragment, and the bank
conflicts are counted -- fewer than the plain layout (--flat) has; and its
warps, emulated lane by lane through the same mma emulation (isa_mma.h), give
x @ W exactly.

tests/cuda_host/test_wgmma_layout.cpp checks the warpgroup kernel's stage
(wgmma_map): every copied byte lands once, copies and fragment loads meet no
bank conflict, and x lies where wgmma's swizzled descriptor reads it."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
LAYOUT = os.path.join(CSRC, "cuda", "linear_layout.cuh")
PROGRAM = os.path.join(ROOT, "tests", "cuda_host", "test_mma_layout.cpp")
GEMV_PROGRAM = os.path.join(ROOT, "tests", "cuda_host", "test_gemv_layout.cpp")
WGMMA_PROGRAM = os.path.join(ROOT, "tests", "cuda_host", "test_wgmma_layout.cpp")


def _compiler():
    """A C++17 compiler: $CXX, c++, g++, clang++, else nvcc as a host compiler."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        path = shutil.which(name) if name else None
        if path:
            return [path]
    nvcc = shutil.which("nvcc")
    return [nvcc, "-x", "c++"] if nvcc else None


def _build(include_dir, out, program=PROGRAM):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    proc = subprocess.run([*cxx, "-std=c++17", "-O1", "-I", include_dir, program, "-o", out],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def _run(binary, *args):
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def emulation(tmp_path_factory):
    if not (os.path.exists(PROGRAM) and os.path.exists(LAYOUT)):
        pytest.skip("needs the source tree")
    binary = _build(CSRC, str(tmp_path_factory.mktemp("mma_layout") / "test_mma_layout"))
    return _run(binary)


def test_mma_fragments_give_x_at_w_exactly(emulation):
    assert emulation.returncode == 0, emulation.stdout + emulation.stderr
    cases = re.findall(r"mismatches (\d+), unwritten (\d+), out-of-bounds (\d+)", emulation.stdout)
    assert len(cases) >= 10, emulation.stdout
    assert all(case == ("0", "0", "0") for case in cases), emulation.stdout
    # every case compared some B elements with W at the permuted rows
    checked = [int(n) for n in re.findall(r"(\d+) B elements checked", emulation.stdout)]
    assert checked and min(checked) > 0
    assert "OK: 0 failed checks" in emulation.stdout


def test_partial_tiles_and_slices_hold_their_invariants(emulation):
    assert "partial-tile swizzle: bijective, conflict-free\n" in emulation.stdout
    assert "split-K slices: contiguous, complete\n" in emulation.stdout


@pytest.mark.parametrize("old, new", [
    # rows 4i+1 and 4i swapped: not the permutation A uses
    ("return 4 * i + r;", "return 4 * i + (r ^ 1);"),
    # the nibbles of tile j read from the wrong half of the permuted words
    ("return ((p < 4 ? low : high) >> (4 * (p & 3))) & kNibblePairMask;",
     "return ((p < 4 ? high : low) >> (4 * (p & 3))) & kNibblePairMask;"),
    # accumulators 1 and 2 swapped on the way out
    ("return 2 * i + (e & 1); }", "return 2 * i + (e >> 1); }"),
])
def test_emulation_catches_a_wrong_mapping(tmp_path, old, new):
    _assert_mutant_fails(tmp_path, PROGRAM, old, new)


def _assert_mutant_fails(tmp_path, program, old, new):
    """program, built against linear_layout.cuh with `old` replaced by `new`, fails."""
    if not (os.path.exists(program) and os.path.exists(LAYOUT)):
        pytest.skip("needs the source tree")
    (tmp_path / "cuda").mkdir()
    shutil.copy(os.path.join(CSRC, "awq.h"), tmp_path / "awq.h")
    with open(LAYOUT, encoding="utf-8") as f:
        text = f.read()
    assert text.count(old) == 1
    (tmp_path / "cuda" / "linear_layout.cuh").write_text(text.replace(old, new), encoding="utf-8")
    proc = _run(_build(str(tmp_path), str(tmp_path / "mutant"), program))
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout


@pytest.fixture(scope="module")
def gemv_layout(tmp_path_factory):
    if not (os.path.exists(GEMV_PROGRAM) and os.path.exists(LAYOUT)):
        pytest.skip("needs the source tree")
    return _build(CSRC, str(tmp_path_factory.mktemp("gemv_layout") / "test_gemv_layout"),
                  GEMV_PROGRAM)


def _gemv_cases(stdout):
    cases = re.findall(r"NT=(\d) layout=\S+: misplaced (\d+), written twice (\d+), unwritten (\d+), "
                       r"misread (\d+), bank conflicts (\d+)", stdout)
    assert [c[0] for c in cases] == ["1", "2", "4"], stdout
    return [tuple(int(v) for v in c[1:]) for c in cases]


def test_gemv_stage_is_placed_and_read(gemv_layout):
    proc = _run(gemv_layout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c[:4] for c in _gemv_cases(proc.stdout)] == [(0, 0, 0, 0)] * 3


def test_gemv_warps_give_x_at_w_exactly(gemv_layout):
    proc = _run(gemv_layout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = re.findall(r"emulation (\S+)\s+M=\s*(\d+) .*: mismatches (\d+), wrong slice counts (\d+)",
                       proc.stdout)
    assert len(cases) >= 10, proc.stdout
    assert {c[0] for c in cases} == {"f16", "bf16"}
    assert {int(c[1]) > 8 for c in cases} == {True, False}  # one and two n8 tiles of x
    assert max(int(c[1]) for c in cases) > 16  # four
    assert all(c[2:] == ("0", "0") for c in cases), proc.stdout
    assert proc.stdout.rstrip().endswith("OK")


def test_gemv_row_slots_take_conflicts_off_the_plain_layout(gemv_layout):
    ours = _gemv_cases(_run(gemv_layout).stdout)
    proc = _run(gemv_layout, "--flat")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the placement holds as well
    flat = _gemv_cases(proc.stdout)
    assert all(f[:4] == (0, 0, 0, 0) for f in flat), proc.stdout
    assert all(o[4] < f[4] for o, f in zip(ours, flat)), (ours, flat)


@pytest.mark.parametrize("old, new", [
    # rows 2i and 2i + 1 swapped in the fragment
    ("return 2 * i + (r & 1) + 8 * (r >> 1); }", "return 2 * i + ((r & 1) ^ 1) + 8 * (r >> 1); }"),
    # two lanes copy the same x half
    ("AWQ_HD int x_copy_half(int lane) { return lane & 1; }",
     "AWQ_HD int x_copy_half(int lane) { return (lane >> 1) & 1; }"),
    # the second piece of x (four tiles) 8 rows on instead of 16
    ("constexpr int kXPieceRows = 16;", "constexpr int kXPieceRows = 8;"),
    # rows k and k + 1 swapped by the byte permute
    ("return b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12); }",
     "return (4 + b) | ((4 + b) << 4) | (b << 8) | (b << 12); }"),
    # the odd nibble's register taken for the second row pair
    ("AWQ_HD int a_reg(int pair, int odd) { return 2 * pair + odd; }",
     "AWQ_HD int a_reg(int pair, int odd) { return pair + 2 * odd; }"),
    # accumulators 1 and 2 swapped on the way out
    ("AWQ_HD int acc_nibble(int b, int e) { return 2 * b + (e >> 1); }",
     "AWQ_HD int acc_nibble(int b, int e) { return 2 * b + (e & 1); }"),
])
def test_gemv_check_catches_a_wrong_mapping(tmp_path, old, new):
    _assert_mutant_fails(tmp_path, GEMV_PROGRAM, old, new)


def test_wgmma_stage_is_placed_read_and_swizzled(tmp_path):
    if not (os.path.exists(WGMMA_PROGRAM) and os.path.exists(LAYOUT)):
        pytest.skip("needs the source tree")
    proc = _run(_build(CSRC, str(tmp_path / "test_wgmma_layout"), WGMMA_PROGRAM))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = re.findall(r"^(.*): (\d+) bad$", proc.stdout, re.M)
    assert len(checks) == 19 and all(bad == "0" for _, bad in checks), proc.stdout
    assert proc.stdout.rstrip().endswith("OK")


@pytest.mark.parametrize("old, new", [
    # the qweight chunks not XOR-ed: rows 2i and 2i + 4 of a half-warp meet in one bank
    ("16 * (c ^ (2 * ((r >> 2) & 1)));", "16 * c;"),
    # x without the 128-byte swizzle the descriptor names
    ("return n * kXRowBytes + 16 * (c ^ (n & 7)); }", "return n * kXRowBytes + 16 * c; }"),
])
def test_wgmma_check_catches_a_wrong_layout(tmp_path, old, new):
    _assert_mutant_fails(tmp_path, WGMMA_PROGRAM, old, new)
