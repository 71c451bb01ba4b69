"""Settings that matter on an accelerator, checked where they can be on the CPU: the optimizer's kernel
form, the compiled output head's flag, deterministic kernels, the prefix rule's call overhead, and batches
carrying the host's copy of what collation built."""

from __future__ import annotations

import torch

import humanline.model.prefix as pfx
from helpers_train import tiny_config
from humanline.data.collate import collate_dpo, to_device
from humanline.model.head import COMPILE_ATTRIBUTE, output_layer
from humanline.model.tiny import make_model, make_tokenizer
from humanline.settings.config import OptimConfig
from humanline.training.build import make_optimizer
from humanline.training.loop import Trainer


def test_adamw_is_fused_on_cuda_and_foreach_elsewhere():
    model = make_model(make_tokenizer(), hidden_size=16, num_layers=1)
    cpu = make_optimizer(model, OptimConfig(), torch.device("cpu"))
    assert cpu.defaults["foreach"] is True and not cpu.defaults["fused"]
    cuda = make_optimizer(model, OptimConfig(), torch.device("cuda"))  # the parameters' device is checked at step
    assert cuda.defaults["fused"] is True and not cuda.defaults["foreach"]


def test_compile_and_deterministic_settings_reach_the_run(tmp_path):
    trainer = Trainer(tiny_config("dpo", tmp_path / "run", train={"compile": True, "deterministic": True,
                                                                  "reference": "frozen"}))
    assert getattr(output_layer(trainer.run.unwrapped), COMPILE_ATTRIBUTE) is True
    assert getattr(output_layer(trainer.run.reference.model), COMPILE_ATTRIBUTE) is True  # the frozen copy too
    assert torch.are_deterministic_algorithms_enabled()
    plain = Trainer(tiny_config("dpo", tmp_path / "plain"))
    assert not getattr(output_layer(plain.run.unwrapped), COMPILE_ATTRIBUTE, False)


def test_a_second_forward_costs_more_on_an_accelerator():
    """Rows [10 prompt + 4 own tokens] x 8 sharing one prompt: 112 plain tokens against 10 + 32 prefix ones
    pays on the CPU (42 + 16 < 0.85 x 112) but not where a call costs ~1k tokens."""
    lengths, starts, rows, group, sizes = [14] * 8, [10] * 8, list(range(8)), [0] * 8, [10]
    cpu = pfx.call_overhead_tokens(torch.device("cpu"))
    gpu = pfx.call_overhead_tokens(torch.device("cuda"))
    assert cpu == pfx.CALL_OVERHEAD_TOKENS < gpu
    assert pfx.pays(lengths, starts, rows, group, sizes, None, cpu)
    assert not pfx.pays(lengths, starts, rows, group, sizes, None, gpu)


def test_batches_keep_the_hosts_copy():
    tok = make_tokenizer()
    ids = tok("12+3", add_special_tokens=False)["input_ids"]
    batch = to_device(collate_dpo([{"id": 0, "prompt": ids, "chosen": ids[:2], "rejected": ids[:1]}], 0), "cpu")
    assert batch["host"]["input_ids"] is batch["input_ids"]  # on the CPU: the same tensors, no copy
    assert set(batch["host"]) == {"input_ids", "attention_mask", "completion_mask"}
