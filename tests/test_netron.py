"""The toy Llama's ONNX export, its op summary, and Netron serving and drawing it (small config, CPU)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import onnx
import pytest
import torch

from course_utils import chromium, netron
from course_utils.llama import LogitsOnly, mlp_block, toy_config, toy_llama

# One test process (pytest-xdist) runs this module: its module-scoped fixture
# (the exported models) is made once.
pytestmark = pytest.mark.xdist_group("test_netron")

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    return {
        "llama": netron.export_llama(folder / "toy_llama_small.onnx", small=True, seq_len=16),
        "mlp": netron.export_mlp_block(folder / "mlp_block_small.onnx", small=True, seq_len=16),
    }


def test_toy_llama_is_reproducible_and_leaves_the_rng_alone():
    state = torch.random.get_rng_state()
    a, b = toy_llama(small=True, seed=3), toy_llama(small=True, seed=3)
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not a.training
    layer = a.model.layers[0]
    x = torch.randn(2, 5, toy_config(small=True).hidden_size)
    with torch.no_grad():
        assert torch.equal(mlp_block(a)(x), layer.mlp(layer.post_attention_layernorm(x)))


def test_full_config_has_the_lesson_sizes():
    cfg = toy_config()
    sizes = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads)
    assert sizes == (1024, 11008, 1, 4)
    assert (cfg.num_key_value_heads, cfg.vocab_size, cfg.max_position_embeddings) == (4, 32000, 2048)


def test_exports_dir_is_at_the_checkout_root(monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root / "tests")
    assert netron.exports_dir() == root / "exports"


def test_exported_llama_is_valid_onnx(exported):
    onnx.checker.check_model(str(exported["llama"]), full_check=True)  # full_check: infers every shape
    (ids,) = onnx.load(str(exported["llama"])).graph.input
    assert [d.dim_value for d in ids.type.tensor_type.shape.dim] == [1, 16]


def test_onnxruntime_matches_pytorch(exported):
    model = toy_llama(small=True)
    ids = torch.randint(toy_config(small=True).vocab_size, (1, 16))
    assert netron.check_onnxruntime(exported["llama"], LogitsOnly(model), ids) < 1e-4
    x = torch.randn(1, 16, toy_config(small=True).hidden_size)
    assert netron.check_onnxruntime(exported["mlp"], mlp_block(model), x) < 1e-4


def test_mlp_block_graph_is_the_unfused_computation(exported, capsys):
    ops = netron.op_summary(exported["mlp"])
    assert ops["MatMul"] == 3  # gate, up, down
    assert ops["Sigmoid"] == 1  # SiLU is exported as x * sigmoid(x)
    assert ops["ReduceMean"] == 1  # the RMS statistic: mean(x**2) over hidden
    assert {"Pow", "Sqrt", "Reciprocal", "Mul"} <= set(ops)
    netron.print_summary(exported["mlp"])
    assert "MatMul" in capsys.readouterr().out


def test_llama_graph_has_every_matmul(exported):
    ops = netron.op_summary(exported["llama"])
    assert ops["MatMul"] == 10  # q, k, v, QK^T, PV, o, gate, up, down, lm_head
    assert ops["Softmax"] == 1 and ops["Gather"] == 1  # attention, token embedding
    assert ops["ReduceMean"] == 3  # three RMSNorms: before attention, before the MLP, before lm_head


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


def test_netron_serves_on_localhost_only_and_stops(exported):
    path = exported["mlp"]
    url = netron.serve(path)
    try:
        assert urllib.parse.urlsplit(url).hostname == "127.0.0.1"
        status, page = _get(url)
        assert status == 200 and f'content="/data/{path.name}"'.encode() in page
        assert _get(f"{url}data/{path.name}") == (200, path.read_bytes())
    finally:
        netron.stop(url)
    with pytest.raises(urllib.error.URLError):
        _get(url)


def test_show_prints_how_to_reach_the_server(exported, capsys):
    url = netron.show(exported["mlp"])
    try:
        out = capsys.readouterr().out
        port = urllib.parse.urlsplit(url).port
        assert url in out and f"ssh -N -L {port}:127.0.0.1:{port}" in out
        assert _get(url)[0] == 200
    finally:
        netron.stop(url)


@pytest.mark.skipif(chromium.available() is not None, reason=str(chromium.available()))
def test_chromium_draws_the_graph(exported, tmp_path):
    url = netron.serve(exported["mlp"])
    try:
        drawn = chromium.render_netron(url)
    finally:
        netron.stop(url)
    (tmp_path / "netron.png").write_bytes(drawn.png)  # kept in tmp_path for a look
    labels = drawn.labels
    assert len(labels) == 13, labels  # the 13 ONNX nodes of the block
    assert sum("MatMul" in label for label in labels) == 3
    assert any("Sigmoid" in label for label in labels) and any("ReduceMean" in label for label in labels)
    assert all(place and place.startswith("translate(") for place in drawn.places), "nodes never laid out"
    assert drawn.png.startswith(b"\x89PNG")
