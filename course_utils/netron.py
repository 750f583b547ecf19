"""Export the toy Llama to ONNX, count its ops, and look at the graph in Netron.

The ONNX graph is what the model computes before anyone fuses it. The RMSNorm alone is seven nodes
(Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul by 1/rms, Mul by the weight) and the MLP six more
(3 MatMul; Sigmoid and Mul for SiLU; Mul of gate and up), each one a trip through memory;
lesson 06 computes the same thing in one or two kernels.

Files go to `exports/` at the root of the course checkout (ignored by git). Netron serves on
127.0.0.1 only: from another machine, reach it through an ssh port forward. Its page asks once to
accept cookies (it reports anonymous usage), and a Netron release stops drawing models about 180 days
after it was built ("Please update"): `pip install -U netron` then.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time
import urllib.parse
import warnings
from pathlib import Path

import netron
import onnx
import onnx.inliner
import torch

from .llama import LogitsOnly, mlp_block, toy_config, toy_llama


def exports_dir() -> Path:
    """`exports/` next to `course_utils/` in the checkout holding the working directory, else in it."""
    cwd = Path.cwd()
    for folder in (cwd, *cwd.parents):
        if (folder / "course_utils").is_dir() and (folder / "pyproject.toml").is_file():
            return folder / "exports"
    return cwd / "exports"


@contextlib.contextmanager
def _quiet_exporter():
    # The exporter warns that torchvision is missing (its ops are unused here) and torch.export
    # raises a FutureWarning from its own internals; neither says anything about our model.
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def _export(module: torch.nn.Module, args: tuple, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # dynamo=True traces with torch.export and translates to ONNX through onnxscript; the legacy
    # TorchScript exporter fails on this model. external_data=False keeps weights in the one file.
    with torch.no_grad(), _quiet_exporter():
        torch.onnx.export(module, args, path, dynamo=True, external_data=False, verbose=False)
    return path


def export_llama(path: str | Path | None = None, small: bool = True, seq_len: int = 16) -> Path:
    """Export the toy Llama (token ids (1, seq_len) -> logits) and return the .onnx path.

    Shapes are fixed at export: the graph takes exactly (1, seq_len) int64 ids. The full-size
    model (small=False) writes a file of about 420 MB.
    """
    name = "toy_llama_small.onnx" if small else "toy_llama.onnx"
    path = Path(path) if path is not None else exports_dir() / name
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(toy_config(small).vocab_size, (1, seq_len), generator=generator)  # (1, T)
    return _export(LogitsOnly(toy_llama(small)), (ids,), path)


def export_mlp_block(path: str | Path | None = None, small: bool = True, seq_len: int = 16) -> Path:
    """Export mlp(norm(x)) of the toy Llama's layer (x: (1, seq_len, hidden)) and return the path."""
    name = "mlp_block_small.onnx" if small else "mlp_block.onnx"
    path = Path(path) if path is not None else exports_dir() / name
    hidden = toy_config(small).hidden_size
    x = torch.randn(1, seq_len, hidden, generator=torch.Generator().manual_seed(0))  # (1, T, hidden)
    return _export(mlp_block(toy_llama(small)), (x,), path)


def _op_types(graph: onnx.GraphProto):
    for node in graph.node:
        yield node.op_type
        for attr in node.attribute:  # the bodies of If, Loop and Scan are graphs inside a node
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
            for subgraph in subgraphs:
                yield from _op_types(subgraph)


def op_summary(path: str | Path) -> collections.Counter:
    """How many nodes of each op type the graph has, with model-local functions inlined first.

    The dynamo exporter (torch 2.13, onnxscript 0.7) emits a flat graph of standard ONNX ops, with
    no functions; other versions may wrap modules in functions, which would hide their ops.
    """
    model = onnx.load(str(path), load_external_data=False)
    return collections.Counter(_op_types(onnx.inliner.inline_local_functions(model).graph))


def print_summary(path: str | Path) -> None:
    """Print the op counts of an ONNX file, most frequent first."""
    model = onnx.load(str(path), load_external_data=False)
    weights = sum(math.prod(t.dims) for t in model.graph.initializer)
    ops = op_summary(path)
    tensors = len(model.graph.initializer)
    print(f"{Path(path).name}: {ops.total()} nodes, {tensors} initializers holding {weights:,} numbers")
    for op, count in ops.most_common():
        print(f"  {op:<12} {count}")


def check_onnxruntime(path: str | Path, model: torch.nn.Module, inputs) -> float:
    """Max |onnxruntime - PyTorch| over the first output, on the same inputs (a tensor or a tuple)."""
    import onnxruntime

    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {arg.name: t.detach().cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
    got = torch.from_numpy(session.run(None, feeds)[0])
    with torch.no_grad():
        want = model(*inputs).cpu()
    return (got.double() - want.double()).abs().max().item()


@contextlib.contextmanager
def _no_logging_setup():
    # netron.serve calls logging.basicConfig(level=INFO) when the root logger has no handler, which
    # would switch on every library's INFO messages in the notebook; a do-nothing handler prevents it.
    root, handler = logging.getLogger(), logging.NullHandler()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


def serve(path: str | Path, port: int | None = None) -> str:
    """Serve `path` with Netron on 127.0.0.1 (a free port unless given) and return the page URL."""
    with _no_logging_setup():
        host, port = netron.serve(str(path), None, address=("127.0.0.1", port or 0), browse=False)
    return f"http://{host}:{port}/"


def stop(url_or_address: str | tuple[str, int] | None = None) -> None:
    """Stop the Netron server at a URL from `serve` or a (host, port) pair; None stops them all."""
    address = url_or_address
    if isinstance(address, str):
        parts = urllib.parse.urlsplit(address)
        address = (parts.hostname, parts.port)
    netron.stop(address)
    # The server thread notices within 0.25 s; until then its socket may still accept connections.
    deadline = time.monotonic() + 2
    while netron.status(address) and time.monotonic() < deadline:
        time.sleep(0.05)


def show(path: str | Path, port: int | None = None, height: int = 700) -> str:
    """Serve `path` with Netron and show it in the notebook; returns the URL (for `stop`)."""
    url = serve(path, port)
    port = urllib.parse.urlsplit(url).port
    print(f"Netron shows {Path(path).name} at {url}  (stop it with course_utils.netron.stop({url!r}))")
    try:
        # Colab runs the kernel on a remote VM; its proxy shows the VM's local port in the notebook.
        from google.colab import output as colab_output
    except ImportError:
        colab_output = None
    if colab_output is not None:
        colab_output.serve_kernel_port_as_iframe(port, height=height)
        return url
    print(
        "The server listens on the machine running this notebook. If that is not your computer, "
        f"forward the port first:\n  ssh -N -L {port}:127.0.0.1:{port} <user>@<notebook-host>\n"
        f"then open {url} (a frame below fills in once the port is reachable)."
    )
    try:
        from IPython.display import HTML, IFrame, display
    except ImportError:
        return url
    display(HTML(f'<a href="{url}" target="_blank">Open {Path(path).name} in Netron</a>'))
    display(IFrame(url, width="100%", height=height))
    return url
