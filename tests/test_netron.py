"""The toy Llama's ONNX export, its op summary, and Netron serving and drawing it (small config, CPU)."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import onnx
import pytest
import torch

from course_utils import netron
from course_utils.llama import LogitsOnly, mlp_block, toy_config, toy_llama

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    # Netron's page asks ipinfo.io for the country and sends usage statistics to Google Analytics;
    # resolving no host but 127.0.0.1 keeps the test off the network.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


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


class DevTools:
    """Headless Chromium driven through the DevTools protocol over a pipe.

    Chromium reads commands from fd 3 and writes replies to fd 4, one JSON message per NUL byte.
    The CLI's --screenshot with --virtual-time-budget cannot be used for Netron: virtual time
    fast-forwards Netron's 2.5 s watchdog while its graph layout runs (in real time) in a Web
    Worker, so the page shows "This large graph layout might take a very long time" instead.
    """

    def __init__(self, profile: Path, timeout: float = 60):
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # The pipe ends arrive as stdin and stdout; the shell moves them to fds 3 and 4.
        redirect = 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null'
        argv = [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.process = subprocess.Popen(
            ["sh", "-c", redirect, "sh", *argv], stdin=commands_r, stdout=replies_w, stderr=subprocess.DEVNULL
        )
        os.close(commands_r)
        os.close(replies_w)
        self._deadline = time.monotonic() + timeout
        self._buffer = b""
        self._id = 0

    def send(self, method: str, session: str | None = None, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:  # events arrive between replies; skip them
            reply = self._read()
            if reply.get("id") == self._id:
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            left = self._deadline - time.monotonic()
            assert left > 0 and select.select([self._replies], [], [], left)[0], (
                "Chromium did not answer in time"
            )
            chunk = os.read(self._replies, 1 << 20)
            assert chunk, "Chromium exited"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, session: str, expression: str):
        reply = self.send("Runtime.evaluate", session, expression=expression, returnByValue=True)
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    def close(self):
        self.process.kill()
        self.process.wait(timeout=10)
        os.close(self._commands)
        os.close(self._replies)


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium) to render the page"
)
def test_chromium_draws_the_graph(exported, tmp_path):
    url = netron.serve(exported["mlp"])
    browser = DevTools(tmp_path / "profile")
    try:
        # Without a "consent" cookie Netron waits for a click on its cookie notice before it opens the model.
        browser.send("Storage.setCookies", cookies=[{"name": "consent", "value": "1", "url": url}])
        target = browser.send("Target.createTarget", url=url)["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        # Netron marks the body "default" once the graph is laid out and drawn.
        drawn = (
            "document.body?.classList.contains('default') && document.querySelectorAll('g.graph-node').length"
        )
        deadline = time.monotonic() + 30
        while not browser.evaluate(session, drawn) and time.monotonic() < deadline:
            time.sleep(0.2)
        png = base64.b64decode(browser.send("Page.captureScreenshot", session)["data"])
        (tmp_path / "netron.png").write_bytes(png)
        nodes = "[...document.querySelectorAll('g.graph-node')]"
        labels = browser.evaluate(session, f"{nodes}.map(n => n.textContent)")
        places = browser.evaluate(session, f"{nodes}.map(n => n.getAttribute('transform'))")
    finally:
        browser.close()
        netron.stop(url)
    assert len(labels) == 13, labels  # the 13 ONNX nodes of the block
    assert sum("MatMul" in label for label in labels) == 3
    assert any("Sigmoid" in label for label in labels) and any("ReduceMean" in label for label in labels)
    assert all(place and place.startswith("translate(") for place in places), "nodes never laid out"
    assert png.startswith(b"\x89PNG")  # kept in tmp_path for a look
