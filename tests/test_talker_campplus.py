"""CAMPPlus ONNX runner: error messages and I/O plumbing (docs/model.md §5.4).

The real `campplus.onnx` is not available; a tiny ONNX graph (mean over time, then a matmul to
192 values) is written by hand in protobuf wire format so onnxruntime runs a real session.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from realtime_ming.model.campplus import FBANK_BINS, SPEAKER_DIM, CampPlus, CampPlusError


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _value_info(name: str, dims: list) -> bytes:
    """ValueInfoProto{name, TypeProto{tensor_type{elem_type FLOAT, shape}}}; str dims are symbolic."""
    shape = b"".join(_bytes(1, _bytes(2, d) if isinstance(d, str) else _int(1, d)) for d in dims)
    return _bytes(1, name) + _bytes(2, _bytes(1, _int(1, 1) + _bytes(2, shape)))


def _tiny_campplus_onnx(weight: np.ndarray, input_name: str, output_name: str) -> bytes:
    """ModelProto: out[1, 192] = ReduceMean(feats, axes=[1], keepdims=0) @ weight (opset 13)."""
    reduce = (_bytes(1, input_name) + _bytes(2, "mean") + _bytes(4, "ReduceMean")
              + _bytes(5, _bytes(1, "axes") + _int(8, 1) + _int(20, 7))  # INTS [1]
              + _bytes(5, _bytes(1, "keepdims") + _int(3, 0) + _int(20, 2)))  # INT 0
    matmul = _bytes(1, "mean") + _bytes(1, "w") + _bytes(2, output_name) + _bytes(4, "MatMul")
    init = (_int(1, weight.shape[0]) + _int(1, weight.shape[1]) + _int(2, 1) + _bytes(8, "w")
            + _bytes(9, weight.astype("<f4").tobytes()))
    graph = (_bytes(1, reduce) + _bytes(1, matmul) + _bytes(2, "tiny") + _bytes(5, init)
             + _bytes(11, _value_info(input_name, [1, "T", FBANK_BINS]))
             + _bytes(12, _value_info(output_name, [1, SPEAKER_DIM])))
    return _int(1, 7) + _bytes(8, _bytes(2, "") + _int(2, 13)) + _bytes(7, graph)


def test_missing_file_names_the_path(tmp_path):
    """A missing campplus.onnx raises CampPlusError naming the path."""
    path = tmp_path / "campplus.onnx"
    with pytest.raises(CampPlusError, match="campplus.onnx"):
        CampPlus(path)


def test_missing_onnxruntime_is_explained(tmp_path, monkeypatch):
    """Without onnxruntime the error says to install it."""
    path = tmp_path / "campplus.onnx"
    path.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(CampPlusError, match="pip install onnxruntime"):
        CampPlus(path)


def test_runs_graph_with_discovered_names(tmp_path, load_case):
    """Input/output names come from the session; [1,T,80] and [T,80] fbanks give the graph's [1,192]."""
    pytest.importorskip("onnxruntime")
    weight = np.random.default_rng(0).standard_normal((FBANK_BINS, SPEAKER_DIM)).astype(np.float32)
    path = tmp_path / "campplus.onnx"
    path.write_bytes(_tiny_campplus_onnx(weight, "x_feats", "spk_out"))
    runner = CampPlus(path, intra_op_threads=1)
    assert (runner.input_name, runner.output_name) == ("x_feats", "spk_out")
    fbank = load_case("talker_loop")[0]["campplus_input_fbank"]  # [1, T, 80], mean-normalised
    want = torch.from_numpy(fbank[0].double().mean(0).numpy() @ weight.astype(np.float64))[None].float()
    got = runner(fbank)
    assert got.shape == (1, SPEAKER_DIM) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(runner(fbank[0]), got)
    with pytest.raises(ValueError, match="80"):
        runner(fbank[..., :40])


def test_wire_helpers_encode_known_bytes():
    """The protobuf helpers produce the documented varint encodings (300 → ac 02)."""
    assert _varint(300) == bytes([0xAC, 0x02])
    assert _int(1, 7) == bytes([0x08, 0x07])
    assert _bytes(2, "ab") == bytes([0x12, 0x02]) + b"ab"
