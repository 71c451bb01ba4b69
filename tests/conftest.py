"""Test-wide settings. The device every test trains on is chosen here, once: `HUMANLINE_TEST_DEVICE=cpu`
(the default) or `cuda`. Models that tests build themselves go to the `device` fixture; runs built from a
config (in-process or in a subprocess) follow `ACCELERATE_USE_CPU`, which is set for `cpu`. Tests compare
tensors on the CPU (`helpers_train.params` copies parameters there)."""

import os
import sys
from pathlib import Path

# The shared helpers (helpers_*.py, reference_impl.py, fault_rewards.py) live here, the tests in folders that
# mirror the package (core, objectives, data, config, train, online, reliability, commands, ...).
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models: one thread is faster than two (no contention between the test's own threads), and
# subprocess tests inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TEST_DEVICE = os.environ.get("HUMANLINE_TEST_DEVICE", "cpu")
if TEST_DEVICE not in ("cpu", "cuda"):
    raise SystemExit(f"HUMANLINE_TEST_DEVICE={TEST_DEVICE!r}: expected cpu or cuda")
if TEST_DEVICE == "cpu":
    os.environ["ACCELERATE_USE_CPU"] = "true"  # also on a GPU machine, and in subprocesses
else:
    os.environ.pop("ACCELERATE_USE_CPU", None)

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

# Property tests draw the same examples on every run ("fixed"), so the default suite (and CI) cannot fail on a
# case a random draw happens to meet; HYPOTHESIS_PROFILE=explore draws new ones, to look for such cases.
hypothesis_settings.register_profile("fixed", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fixed")
if PROFILE not in ("fixed", "explore"):
    raise SystemExit(f"HYPOTHESIS_PROFILE={PROFILE!r}: expected fixed or explore")
hypothesis_settings.load_profile(PROFILE)

torch.set_num_threads(1)
if TEST_DEVICE == "cuda" and not torch.cuda.is_available():
    raise SystemExit("HUMANLINE_TEST_DEVICE=cuda but torch sees no CUDA device")


@pytest.fixture
def device() -> torch.device:
    """The device tests run their own models on (see the module docstring)."""
    return torch.device(TEST_DEVICE)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one process-wide state, set up by the first trainer (ours or TRL's) and never changed,
    and `train.deterministic` sets torch's deterministic mode for the process. Each test starts without either,
    as a separate run would: on a GPU, a test pinned to the CPU would otherwise hand its state to the next
    test, whose bf16 run then cannot start."""
    backends = torch.backends
    settings = [(torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled()),
                (backends.cuda.enable_mem_efficient_sdp, backends.cuda.mem_efficient_sdp_enabled()),
                (backends.cuda.enable_cudnn_sdp, backends.cuda.cudnn_sdp_enabled())]
    flags = [(backends.cudnn, "benchmark"), (backends.cudnn, "deterministic"), (backends.cudnn, "allow_tf32"),
             (backends.cuda.matmul, "allow_tf32")]
    values = [getattr(owner, name) for owner, name in flags]
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    for setter, value in settings:  # `train.deterministic` is process-wide: no test inherits it
        setter(value)
    for (owner, name), value in zip(flags, values):
        setattr(owner, name, value)

