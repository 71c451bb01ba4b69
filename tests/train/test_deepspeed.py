"""DeepSpeed ZeRO-2 and ZeRO-3 with two CPU processes, launched as users launch it:
`accelerate launch --config_file recipes/accelerate/deepspeed_zero{2,3}.yaml --num_processes 2 ...`.

Skipped where the `deepspeed` package is not installed (it is not a test dependency: it builds from source
against the installed torch, `pip install --no-build-isolation deepspeed`). The cases and the tolerances are
test_fsdp.py's: ZeRO-2 (weights whole on every process) for every reference strategy and online / sparse
sampling; ZeRO-3 (weights partitioned) where humanline supports it, offline with the lookahead and cached
references. DPO and GRPO against one process, KTO and sampling against DDP on the same two processes.
"""

from __future__ import annotations

import pytest

from conftest import TEST_DEVICE
from helpers_distributed import DDP_CONFIG, assert_same_run, case, launch
from helpers_train import ROOT

pytest.importorskip("deepspeed")

ZERO = {stage: ROOT / "recipes" / "accelerate" / f"deepspeed_zero{stage}.yaml" for stage in (2, 3)}
AGAINST_ONE = {
    2: [case("dpo_k3", "dpo", 3), case("grpo_off", "grpo"), case("dpo_frozen", "dpo", reference="frozen"),
        case("grpo_copy_k3", "grpo", 3, reference="copy"), case("dpo_lora_copy_k1", "dpo", 1, reference="copy",
                                                                   lora=True)],
    3: [case("dpo_k3", "dpo", 3), case("grpo_off", "grpo"), case("grpo_k1", "grpo", 1)],
}
AGAINST_DDP = {
    2: [case("kto_k1", "kto", 1), case("grpo_online_k1", "grpo", 1, regime="online"),
        case("grpo_sparse_k2", "grpo", 2, regime="sparse")],
    3: [case("kto_k3", "kto", 3)],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if TEST_DEVICE != "cpu":
        pytest.skip("two gloo processes on the CPU; HUMANLINE_TEST_DEVICE=cpu runs it")
    root = tmp_path_factory.mktemp("zero")
    out = {"one": launch(root, "one", AGAINST_ONE[2] + AGAINST_ONE[3][2:], None, 4),
           "ddp": launch(root, "ddp", AGAINST_DDP[2] + AGAINST_DDP[3], DDP_CONFIG, 2)}
    for stage, config in ZERO.items():
        out[stage] = launch(root, f"zero{stage}", AGAINST_ONE[stage] + AGAINST_DDP[stage], config, 2,
                             ("--mixed_precision", "no"))
    return out


@pytest.mark.parametrize("stage, case", [(s, c["name"]) for s in (2, 3) for c in AGAINST_ONE[s]])
def test_zero_two_processes_equal_one(runs, stage, case):
    info = (runs[stage] / case / "run_info.json").read_text()
    assert '"distributed": "DEEPSPEED"' in info and '"processes": 2' in info
    assert_same_run(runs[stage] / case, runs["one"] / case)


@pytest.mark.parametrize("stage, case", [(s, c["name"]) for s in (2, 3) for c in AGAINST_DDP[s]])
def test_zero_equals_ddp_on_two_processes(runs, stage, case):
    assert_same_run(runs[stage] / case, runs["ddp"] / case)
    if "online" in case or "sparse" in case:  # the same completions, token for token, on each process
        for rank in (0, 1):
            name = f"samples_{rank}.json"
            assert (runs[stage] / case / name).read_text() == (runs["ddp"] / case / name).read_text()
