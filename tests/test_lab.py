"""The README's start command brings up JupyterLab, serving the course notebooks on 127.0.0.1."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "jupyter").exists(), reason="needs the .venv made by the installer")
def test_lab_serves_the_notebooks():
    port = _free_port()
    cmd = [sys.executable, "-m", "course_utils", "lab", f"--port={port}", "--no-browser",
           "--IdentityProvider.token=", "--ServerApp.password="]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        body = None
        while time.time() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/notebooks", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(1)
        assert body is not None, "JupyterLab did not answer within 90 s"
        assert "00_setup.ipynb" in body and "02_first_kernels.ipynb" in body
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=10) as r:
            assert r.status == 200 and "JupyterLab" in r.read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
